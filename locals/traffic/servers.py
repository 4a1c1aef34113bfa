"""The servers the traffic benchmark compares, each started as a fresh subprocess on a free port
and stopped when its round is over: `locals serve`, `mlx_lm.server`, and llama.cpp's server
(`llama-cpp-python[server]`) where it is installed.

Starting one is timed from just before the process is created to the first answer of its
readiness URL; the first token of the first request (timed by the driver on the same clock)
completes the cold experience. mlx_lm.server answers its /health before it loads the model
(it loads on the first request), so only first-token times compare across servers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from locals.errors import LocalsError

READY_POLL_S = 0.02
PEER_ARGS = "; run with "  # how a report's `weights` note the arguments a peer was given (--peer-args)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server: a command for a port, the URL path that answers once it is
    ready, and environment variables added to ours."""

    name: str
    command: tuple[str, ...]  # "{port}" is replaced by the port
    ready_path: str
    env: dict[str, str] = field(default_factory=dict)
    stats_path: str | None = None  # answers the server's own counters as JSON (locals only)


def locals_server(model: str, env: dict[str, str] | None = None) -> ServerSpec:
    return ServerSpec("locals", (sys.executable, "-m", "locals", "serve", "--model", model, "--port", "{port}"),
                      "/health", env or {}, stats_path="/v1/locals/status")


def mlx_lm_server(model: str, env: dict[str, str] | None = None) -> ServerSpec:
    return ServerSpec("mlx_lm.server", (sys.executable, "-m", "mlx_lm", "server", "--model", model,
                                        "--port", "{port}"), "/health", env or {})


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("uvicorn") is not None


def llama_cpp_server(gguf: str, context: int, threads: int) -> ServerSpec:
    """llama.cpp's server on a GGUF; its default context (2,048) is too short for agents and its
    default thread count is half the cores, so both are set. By default a request arriving stops
    the one being generated (8 agents got 21 empty replies of 24), so requests queue instead."""
    return ServerSpec("llama.cpp", (sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--port", "{port}",
                                    "--n_ctx", str(context), "--n_threads", str(threads),
                                    "--interrupt_requests", "False"), "/v1/models")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Running:
    spec: ServerSpec
    process: subprocess.Popen
    port: int
    zero: float  # perf_counter just before the process was created
    ready_s: float = 0.0
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def log_tail(path: Path | None, lines: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def engine_stats(running: Running) -> dict | None:
    """What the server says of its own steps after a phase (locals: step intervals, slow steps,
    compiles); None for a server without such an endpoint or one that does not answer."""
    if running.spec.stats_path is None:
        return None
    try:
        with _DIRECT.open(running.url + running.spec.stats_path, timeout=10) as resp:
            engine = json.loads(resp.read()).get("engine", {})
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None
    extra = engine.get("extra", {})
    wanted = ("step_intervals", "long_gaps", "slow_steps", "slowest_step_s", "compiled_shapes", "compiling_ahead",
              "uncompiled_passes", "drafted_tokens", "accepted_draft_tokens", "masks_after_steps")
    return {"steps": engine.get("steps"), **{key: extra[key] for key in wanted if key in extra}}


def _gave_up(answer: urllib.error.HTTPError) -> bool:
    """A readiness answer that will not turn into a 200: locals' /health says "failed" (the model
    or its engine failed), mlx_lm.server's "unavailable" (its generation thread died)."""
    try:
        return json.loads(answer.read() or b"{}").get("status") in ("failed", "unavailable")
    except (ValueError, AttributeError, OSError):
        return False


def start(spec: ServerSpec, log_path: Path, timeout_s: float) -> Running:
    """Start `spec` on a free port, its output to `log_path`, and wait until it is ready."""
    missing = [lib for lib in spec.env.get("LD_PRELOAD", "").split(":") if lib and not os.path.exists(lib)]
    if missing:  # the loader would skip it with a warning: this round would time another BLAS
        raise LocalsError(f"{spec.name}: {', '.join(missing)} is gone (was it uninstalled?); reinstall it "
                          "(`apt-get install libopenblas0-pthread`) or run the benchmark again")
    port = free_port()
    command = [part.replace("{port}", str(port)) for part in spec.command]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        zero = time.perf_counter()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **spec.env},
                                   preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    running = Running(spec, process, port, zero, log_path=log_path)
    deadline = zero + timeout_s
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            raise LocalsError(f"{spec.name} exited ({process.returncode}) before it was ready; its log "
                              f"({log_path}) ends:\n{log_tail(log_path)}")
        try:
            with _DIRECT.open(running.url + spec.ready_path, timeout=1) as resp:
                if resp.status == 200:
                    running.ready_s = time.perf_counter() - zero
                    return running
        except urllib.error.HTTPError as exc:
            if _gave_up(exc):
                stop(running)
                raise LocalsError(f"{spec.name} failed while starting; its log ({log_path}) ends:\n"
                                  f"{log_tail(log_path)}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(READY_POLL_S)
    stop(running)
    raise LocalsError(f"{spec.name} was not ready after {timeout_s:.0f} s; its log ({log_path}) ends:\n"
                      f"{log_tail(log_path)}")


def _die_with_parent() -> None:
    """In the server's process (Linux): SIGTERM when the benchmark dies, even by SIGKILL, so no
    server outlives it holding the device (PR_SET_PDEATHSIG; kept across exec)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def stop(running: Running, grace_s: float = 15.0) -> None:
    """SIGTERM the server, SIGKILL it if it has not exited after `grace_s`."""
    process = running.process
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5.0)
