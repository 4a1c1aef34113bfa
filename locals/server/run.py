"""Runs the server in the foreground: bind, answer /health at once, load the model in the
background, start the engine, serve until SIGTERM/SIGINT, then stop cleanly.

Model loading failures end the process (exit 1) with the reason in the log, which is
what `locals start` shows the user.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
import time

import psutil
from aiohttp import web
from aiohttp.web_log import AccessLogger

from locals.errors import LocalsError
from locals.server.app import create_app
from locals.server.backend import Backend
from locals.server.security import is_loopback
from locals.server.state import ServerState

log = logging.getLogger("locals.server")
# Polled by probes, `locals status` and the dashboard, or reported at every step of a team run.
POLLED_PATHS = {"/health", "/v1/locals/status", "/metrics", "/v1/locals/history", "/v1/locals/conversations",
                "/v1/locals/team"}


class QuietAccessLogger(AccessLogger):
    """The access log without the polling of /health, the dashboard and `locals status`, nor
    a team runner's progress reports."""

    def log(self, request, response, time):
        if request.path not in POLLED_PATHS:
            super().log(request, response, time)


# handler_cancellation: a client hanging up cancels its handler, which cancels its request.
RUNNER_OPTIONS = {"handler_cancellation": True, "access_log": log, "access_log_class": QuietAccessLogger}
LOAD_STOP_GRACE_S = 15.0  # how long a stop while loading waits for the load's current step
_LOADERS: set[threading.Thread] = set()  # threads of `_in_daemon_thread` still running


def check_bind(host: str, allow_remote: bool) -> None:
    """Binding beyond loopback exposes the model to the network: only with an explicit flag."""
    if not is_loopback(host) and host != "localhost" and not allow_remote:
        raise LocalsError(f"--host {host} would let other machines use this server; pass "
                          "--allow-remote as well (and consider --api-key), or bind 127.0.0.1")


def serve(model: str | None, host: str, port: int, *, api_key: str | None = None,
          allow_remote: bool = False, max_body_mb: int = 32, max_tokens: int | None = None,
          overflow: str = "refuse", on_bound=None) -> None:
    """Serve until a stop signal; `on_bound(state)` runs once the port is listening."""
    check_bind(host, allow_remote)
    if allow_remote and not is_loopback(host):
        log.warning("serving on %s:%s: any machine that reaches it can use the model%s", host, port,
                    "" if api_key else " (no --api-key set)")
    state = ServerState(model=model or "the default model", api_key=api_key,
                        allow_remote=allow_remote, max_body_mb=max_body_mb, max_tokens=max_tokens,
                        overflow=overflow)
    exit_error = asyncio.run(_serve(state, model, host, port, on_bound))
    if exit_error:
        raise LocalsError(exit_error)


async def _serve(state: ServerState, model: str | None, host: str, port: int,
                 on_bound) -> str | None:
    runner = web.AppRunner(create_app(state), **RUNNER_OPTIONS)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        return f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port"
    log.info("listening on http://%s:%s, loading %s", host, port, state.model)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if on_bound:
        on_bound(state)
    engine, error = None, None
    loading = asyncio.ensure_future(_load(state, model))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if loading.done():
            engine, error = loading.result()
            if engine is not None:
                await stopping
        else:
            loading.cancel()
            log.info("stopped while loading %s", state.model)
            await asyncio.wait({loading})  # an engine it started is stopped before the process ends
            await asyncio.to_thread(_let_loading_finish, LOAD_STOP_GRACE_S)
    finally:
        stopping.cancel()
        log.info("stopping")
        if engine is not None:
            # Off the loop: the stop flushes the disk tier's writes (up to a minute), and the
            # clients' streams must get their end meanwhile, not after it.
            await asyncio.to_thread(engine.stop)
        await runner.cleanup()
    return error


async def _load(state: ServerState, model: str | None):
    """Load the model and start the engine; returns (engine, None) or (None, error message)."""
    from locals.engine import create_engine, load_model

    began = time.perf_counter()
    try:
        loaded = await _in_daemon_thread(load_model, model)
    except LocalsError as exc:
        state.load_error = str(exc)
        log.error("cannot load %s: %s", state.model, exc)
        return None, str(exc)
    loaded_at = time.perf_counter()
    engine = await _in_daemon_thread(create_engine, loaded)
    built_at = time.perf_counter()
    engine.start()
    try:
        await _in_daemon_thread(engine.ready.wait)  # the likeliest decode-step shapes compiled first
    except asyncio.CancelledError:  # stopped while compiling ahead: MLX aborts the process if its thread runs on
        engine.stop()
        raise
    state.model = loaded.name
    state.backend = Backend(loaded, engine, max_tokens=state.max_tokens, overflow_policy=state.overflow)
    # Where a start's time went, so a slow one says what to look at (docs/how-it-works.md, "The server").
    log.info("serving %s (%s): ready %.1f s after the process started: model loaded in %.1f s, kernels "
             "and engine set up in %.1f s, compiling ahead %.1f s", loaded.name, loaded.model_id,
             time.time() - psutil.Process().create_time(), loaded_at - began, built_at - loaded_at,
             time.perf_counter() - built_at)
    return engine, None


def _in_daemon_thread(fn, *args):
    """Run `fn` in a daemon thread: a stop while a model downloads need not wait for it (executor
    threads would be joined at exit); `_let_loading_finish` bounds the wait for one."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting coroutine
            loop.call_soon_threadsafe(_settle, future, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)
        finally:
            _LOADERS.discard(thread)

    thread = threading.Thread(target=work, name="locals-load", daemon=True)
    _LOADERS.add(thread)
    thread.start()
    return future


def _let_loading_finish(grace_s: float) -> None:
    """Wait, at most `grace_s`, for the loading threads a stop left running. One still inside MLX
    (reading weights, setting kernels up) when the process ends makes MLX abort it (SIGABRT, "terminate
    called without an active exception"); a download is Python and may be left behind."""
    deadline = time.monotonic() + grace_s
    for thread in list(_LOADERS):
        thread.join(max(0.0, deadline - time.monotonic()))
    # What the load left (a model's weights in reference cycles) is freed now, while MLX is whole:
    # freed by a collection on another thread during the process's exit, MLX aborted it the same way.
    gc.collect()


def _settle(future: asyncio.Future, result, exc) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
