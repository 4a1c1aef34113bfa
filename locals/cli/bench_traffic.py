"""`locals bench` (the default): the served-traffic benchmark from the command line. Picks the
model, gives each peer the same weights (a GGUF is exported as an MLX folder for mlx_lm.server,
dense float32 on a CPU as locals runs it; llama.cpp's server reads the GGUF itself), runs
locals.traffic with a progress bar, saves the JSON report after each server's round and prints
the table.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import typer

from locals import settings
from locals.cli.common import console, console_err, progress_bar
from locals.errors import LocalsError
from locals.traffic import servers as srv
from locals.traffic.run import portable

SERVER_NAMES = ("locals", "mlx_lm.server", "llama.cpp")


def parse_agents(text: str) -> tuple[int, ...]:
    try:
        agents = tuple(int(a) for a in text.split(",") if a.strip())
    except ValueError:
        agents = ()
    if not agents or min(agents) < 1 or max(agents) > 256:
        raise LocalsError(f"--agents {text!r}: give agent counts between 1 and 256, e.g. 1,4,8")
    return agents


def parse_servers(text: str | None) -> list[str] | None:
    """The servers asked for, None for every one that can run here."""
    if text is None:
        return None
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in SERVER_NAMES]
    if unknown or not names:
        raise LocalsError(f"--servers {text!r}: pick from {', '.join(SERVER_NAMES)} (comma-separated)")
    return names


def parse_variants(texts: list[str] | None) -> dict[str, dict[str, str]]:
    """`NAME:VAR=VALUE[,VAR=VALUE…]` each -> {"locals NAME": {VAR: VALUE, …}}: locals again, with
    those environment settings added, run in the same interleaved rounds as the others (an A/B
    of a setting on one machine: `graphs400:MLX_CUDA_GRAPH_CACHE_SIZE=400`)."""
    variants = {}
    for text in texts or []:
        name, _, assignments = text.partition(":")
        name, pairs = name.strip(), [a.partition("=") for a in assignments.split(",") if a.strip()]
        if not name or " " in name or not pairs or any(not k.strip() or not eq for k, eq, _ in pairs):
            raise LocalsError(f"--variant {text!r}: give NAME:VAR=VALUE[,VAR=VALUE], e.g. "
                              "graphs400:MLX_CUDA_GRAPH_CACHE_SIZE=400")
        variants[f"locals {name}"] = {k.strip(): v for k, _, v in pairs}
    return variants


def with_variants(specs: list, weights: dict, variants: dict[str, dict[str, str]]) -> tuple[list, dict]:
    """`specs` with each variant of locals after it: the same command, weights and kernel folder
    (servers run one at a time), its settings added to the environment."""
    from dataclasses import replace

    ours = next((s for s in specs if s.name == "locals"), None)
    if variants and ours is None:
        raise LocalsError("--variant runs locals again with other settings: include locals in --servers")
    at = specs.index(ours) + 1 if ours is not None else len(specs)
    added = [replace(ours, name=name, env={**ours.env, **extra}) for name, extra in variants.items()]
    runs = {name: f"{weights['locals']}; " + ", ".join(f"{k}={v}" for k, v in extra.items())
            for name, extra in variants.items()}
    return specs[:at] + added + specs[at:], {**weights, **runs}


def parse_peer_args(texts: list[str] | None, servers: list[str] | None = None) -> dict[str, tuple[str, ...]]:
    """`SERVER=ARGS` each -> {SERVER: (arg, …)}: a peer started with these arguments added to its
    command, as a user would tune it (`mlx_lm.server=--prompt-concurrency 2`); `servers`: those the
    run asked for (None: every one that runs here)."""
    peers = {}
    for text in texts or []:
        name, eq, args = text.partition("=")
        name, words = name.strip(), shlex.split(args) if eq else []
        if name not in SERVER_NAMES or name == "locals" or not words:
            peers_named = ", ".join(n for n in SERVER_NAMES if n != "locals")
            raise LocalsError(f"--peer-args {text!r}: give SERVER=ARGS with SERVER one of {peers_named}, "
                              "e.g. 'mlx_lm.server=--prompt-concurrency 2'")
        peers[name] = (*peers.get(name, ()), *words)
    if servers is not None:
        _all_started(peers, servers)
    return peers


def _all_started(peer_args: dict, started) -> None:
    missing = [name for name in peer_args if name not in started]
    if missing:
        raise LocalsError(f"--peer-args for {', '.join(missing)}, which this run does not start: "
                          "add it to --servers")


def with_peer_args(specs: list, weights: dict, peer_args: dict[str, tuple[str, ...]]) -> tuple[list, dict]:
    """`specs` with each named peer's arguments added to its command; `weights` says so."""
    from dataclasses import replace

    _all_started(peer_args, {s.name for s in specs})
    specs = [replace(s, command=(*s.command, *peer_args[s.name])) if s.name in peer_args else s for s in specs]
    added = {name: f"{weights[name]}{srv.PEER_ARGS}{shlex.join(args)}" for name, args in peer_args.items()}
    return specs, {**weights, **added}


def _blas_env(backend) -> dict[str, str]:
    """On a Linux CPU, OpenBLAS preloaded for every MLX server (locals re-execs with it anyway),
    so both run their matmuls on the same BLAS."""
    from locals.engine.load.backend import find_openblas

    lib = find_openblas() if backend.kind == "cpu" and sys.platform == "linux" else None
    preload = settings.foreign("LD_PRELOAD", "")
    if lib is None or "openblas" in preload:
        return {}
    return {"LD_PRELOAD": ":".join(p for p in (lib, preload) if p)}


def server_specs(name: str, backend, scratch: Path, wanted: list[str] | None,
                 kernels: Path | None = None) -> tuple[list, dict]:
    """(specs, what weights each runs) for `name` on this machine; on CUDA each server's kernel
    folder is under `kernels` (kept by the caller) or, by default, empty under `scratch`."""
    from locals.engine.load.export import export_mlx
    from locals.engine.load.models import fetch_weights, resolve

    kind, target, _ = resolve(name)
    env = _blas_env(backend)
    specs = {"locals": srv.locals_server(name, env)}
    weights = {"locals": f"{portable(name)} ({kind}), as locals loads it on {backend.kind}"}
    peer_env = dict(env)
    if kind == "gguf":
        with console_err.status("exporting the GGUF as an MLX folder for mlx_lm.server…", spinner="dots"):
            peer_model = str(export_mlx(target, scratch / "mlx", dense=backend.dense_weights))
        how = "dense float32" if backend.dense_weights else "quantized as in the file"
        weights["mlx_lm.server"] = f"{portable(target)} exported to MLX ({how})"
    elif kind == "hf":
        peer_model = fetch_weights(name)
        peer_env["HF_HUB_OFFLINE"] = "1"  # fetched above: the peer must not reach for the network
        weights["mlx_lm.server"] = f"{peer_model} from the Hugging Face cache"
    else:
        peer_model = target
        weights["mlx_lm.server"] = portable(target)
    specs["mlx_lm.server"] = srv.mlx_lm_server(peer_model, peer_env)
    if backend.kind == "cuda":
        # MLX keeps the CUDA kernels it compiles in a folder (locals sets its own, MLX's default is
        # shared): one per server, kept across its rounds, so each server's first round compiles
        # its own kernels, as on a fresh machine, and neither finds the other's.
        for server, spec in specs.items():
            spec.env["MLX_PTX_CACHE_DIR"] = str((kernels or scratch) / f"cuda-kernels-{server}")
    if kind == "gguf" and srv.llama_cpp_available():
        specs["llama.cpp"] = srv.llama_cpp_server(target, context=0, threads=os.cpu_count() or 1)
        weights["llama.cpp"] = f"{portable(target)} (its own GGUF kernels)"
    if wanted is None:
        return list(specs.values()), weights
    missing = [n for n in wanted if n not in specs]
    if missing:
        raise LocalsError(f"cannot run {', '.join(missing)} here: llama.cpp's server needs a GGUF model and "
                          "`pip install \"llama-cpp-python[server]\"` in locals' environment")
    return [specs[n] for n in wanted], {n: weights[n] for n in wanted}


def _kernel_folders(specs) -> dict[str, int]:
    """How many files each server's CUDA kernel folder held at the start (0: a fresh machine)."""
    folders = {spec.name: Path(spec.env["MLX_PTX_CACHE_DIR"]) for spec in specs if "MLX_PTX_CACHE_DIR" in spec.env}
    return {name: sum(1 for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0
            for name, folder in folders.items()}


def traffic_bench(model: str | None, plan_args: dict, wanted: list[str] | None, path: Path,
                  busy_before: float, kernels: Path | None = None,
                  variants: dict[str, dict[str, str]] | None = None,
                  peer_args: dict[str, tuple[str, ...]] | None = None) -> None:
    """Run the served-traffic benchmark, save the report to `path` as it goes, print the table.
    `kernels`: where each server's CUDA kernel folder is kept between runs (default: empty ones);
    `variants`: locals again with other settings (`parse_variants`); `peer_args`: arguments added
    to peers' commands (`parse_peer_args`)."""
    from locals.engine.bench import machine_info
    from locals.engine.load import backend as backend_mod
    from locals.engine.load import catalog
    from locals.measure import other_cpu_percent
    from locals.traffic.report import table
    from locals.traffic.run import Plan, run, save

    backend = backend_mod.detect()
    name = model or catalog.default_alias(backend.kind, backend.memory_bytes)
    log_dir = path.with_name(path.stem + "-logs")
    with tempfile.TemporaryDirectory(prefix="locals-bench-") as scratch:
        specs, weights = with_peer_args(*server_specs(name, backend, Path(scratch), wanted, kernels), peer_args or {})
        specs, weights = with_variants(specs, weights, variants or {})
        plan = Plan(servers=tuple(specs), **plan_args)
        extra = {"model": portable(name), "backend": backend.kind, "weights": weights, "command": sys.argv[1:],
                 "machine": machine_info(), "other_cpu_percent_before": busy_before, "logs": log_dir.name,
                 "kernel_folders": _kernel_folders(specs) if backend.kind == "cuda" else None}
        with progress_bar() as progress:
            task = progress.add_task("starting", total=plan.rounds * len(specs) * len(plan.agents))

            def on_phase(label: str | None) -> None:
                if label is None:
                    progress.advance(task)
                else:
                    progress.update(task, description=label)

            try:
                report = run(plan, log_dir, on_phase, on_round=lambda r: save({**r, **extra}, path))
            except KeyboardInterrupt:
                progress.stop()
                kept = (f"the rounds done so far are in {path}" if path.exists()
                        else "no round had finished: no report")
                console_err.print(f"stopped: {kept}; server logs in {log_dir}")
                raise typer.Exit(130) from None
    report = {**report, **extra, "other_cpu_percent_after": other_cpu_percent(0.5),
              "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
    save(report, path)
    console.print(table(report))
    for server, what in weights.items():
        console.print(f"[dim]{server}: {what}[/dim]")
    console.print(f"report: {path} · server logs: {log_dir}")
