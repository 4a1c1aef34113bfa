"""Builds the engine the daemon and the CLI run: the batched Engine plus the features that
plug into its hooks — the prefix cache on disk, the repetition guard, tuned kernels
(inside Engine, from the table `locals tune` writes) and a warmed-up constraint vocabulary.

Tests build bare `Engine`s; everything users run goes through `create_engine`.
"""

from __future__ import annotations

import logging

from locals import settings
from locals.config import cache_dir
from locals.engine.cache.disk_cache import DiskPrefixStore, model_key
from locals.engine.engine import Engine
from locals.engine.rows.repetition import repetition_guard_factory
from locals.engine.settings import EngineConfig

log = logging.getLogger(__name__)

DISK_CACHE_BYTES = 4 * 1024**3
# Seconds of decode-step compiles before the server says ready (the rest follow while idle, and
# a shape not compiled yet runs uncompiled): the fewest rows are ready for a first request,
# and a cold start pays seconds, not the 9 s that 8 s of compiles cost on a 2-core CPU
# (docs/benchmarks.md, "Served traffic").
WARM_UP_S = 4.0


def create_engine(loaded, config: EngineConfig | None = None) -> Engine:
    """The engine with every agent feature on (not started)."""
    config = config or config_from_settings()
    disk = None
    if config.prefix_cache_bytes != 0:  # None: sized by the engine, never 0
        key = model_key(loaded.model_id, loaded.tokenizer, revision=loaded.info.get("revision", ""))
        try:
            disk = DiskPrefixStore(cache_dir() / "prompts", key, DISK_CACHE_BYTES)
        except OSError as exc:  # an unusable cache folder costs the disk tier, never the server
            log.warning("prompts are not cached on disk: %s (`locals cache clear` or LOCALS_HOME fixes it)", exc)
    engine = Engine(loaded, config, disk_prefix=disk, guards=[repetition_guard_factory()])
    _warm_constraints(loaded)
    return engine


def config_from_settings() -> EngineConfig:
    """EngineConfig with the engine's LOCALS_* settings applied (locals/settings.py), for `serve` and `start`."""
    config = EngineConfig(max_batch=settings.MAX_BATCH.get(), speculate=settings.SPECULATE.get(),
                          tuned_kernels=settings.KERNELS.get(), warm_up_s=WARM_UP_S)
    if settings.KV_BUDGET_MB.get() is not None:
        config.kv_budget_bytes = int(settings.KV_BUDGET_MB.get() * 2**20)
    if settings.PREFIX_CACHE_MB.get() is not None:
        config.prefix_cache_bytes = int(settings.PREFIX_CACHE_MB.get() * 2**20)
    return config


def _warm_constraints(loaded) -> None:
    try:
        from locals.engine.constrain import warm_up

        warm_up(loaded)
    except Exception:  # warming is an optimisation; a failure shows up on the first request
        log.exception("constraint warm-up failed")
