"""The engine's memory defaults: planned in what the device can hold."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import psutil

from locals.engine import settings
from locals.engine.load import backend
from locals.engine.settings import EngineConfig, available_memory, default_prefix_cache_bytes

GB = 1 << 30


def _machine(monkeypatch, kind: str, device_gb: int, host_gb: int, active_gb: int = 0) -> None:
    monkeypatch.setattr(backend, "detect", lambda: backend.Backend(kind, device_gb * GB, "a card"))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=host_gb * GB, total=host_gb * GB))
    monkeypatch.setattr(mx, "get_active_memory", lambda: active_gb * GB)


def test_cuda_plans_in_the_cards_memory_not_the_hosts(monkeypatch):
    # An H100's 80 GB beside 128 GB of host memory, 2 GB of weights loaded.
    _machine(monkeypatch, "cuda", device_gb=80, host_gb=128, active_gb=2)
    assert available_memory() == int(80 * GB * 0.95) - 2 * GB
    assert EngineConfig().resolved_kv_budget() == int((int(80 * GB * 0.95) - 2 * GB) * 0.5)
    assert default_prefix_cache_bytes() == int((int(80 * GB * 0.95) - 2 * GB) * 0.25)


def test_cuda_host_smaller_than_the_card_keeps_the_host(monkeypatch):
    _machine(monkeypatch, "cuda", device_gb=141, host_gb=64, active_gb=2)
    assert available_memory() == 64 * GB


def test_unified_memory_is_the_systems(monkeypatch):
    for kind in ("metal", "cpu"):
        _machine(monkeypatch, kind, device_gb=16, host_gb=10, active_gb=3)
        assert available_memory() == 10 * GB
        assert EngineConfig(kv_budget_bytes=None).resolved_kv_budget() == 5 * GB


def test_a_card_full_already_gives_nothing_and_the_cache_keeps_its_floor(monkeypatch):
    _machine(monkeypatch, "cuda", device_gb=8, host_gb=64, active_gb=9)
    assert available_memory() == 0
    assert default_prefix_cache_bytes() == 256 * 1024 * 1024
    assert settings.EngineConfig(kv_budget_bytes=123).resolved_kv_budget() == 123


def test_detect_reads_the_cards_own_memory_on_cuda(monkeypatch):
    # What MLX 0.32's device_info() says on an H100 (no "memory_size" there, unlike Metal).
    info = {"device_name": "NVIDIA H100 80GB HBM3", "total_memory": 85_045_870_592, "free_memory": 84_000_000_000}
    monkeypatch.setattr(mx.metal, "is_available", lambda: False)
    monkeypatch.setattr(mx, "cuda", SimpleNamespace(is_available=lambda: True), raising=False)
    monkeypatch.setattr(mx, "device_info", lambda: info)
    found = backend.detect()
    assert (found.kind, found.memory_bytes, found.device_name) == ("cuda", 85_045_870_592, "NVIDIA H100 80GB HBM3")


def test_the_engine_sizes_its_caches_after_the_kernels_took_their_memory(monkeypatch, tiny_llama):
    # On CUDA the kernels keep dense copies of the weights (kernel_setup.patch_kernels): 8 GB here,
    # which neither the KV budget nor the prefix cache may plan in.
    from locals.engine import engine as engine_module
    from locals.engine.cache.prefix_cache import MemoryPrefixCache

    _machine(monkeypatch, "cuda", device_gb=80, host_gb=128, active_gb=2)

    def copies_made(loaded):
        monkeypatch.setattr(mx, "get_active_memory", lambda: 10 * GB)
        return 0, 0

    monkeypatch.setattr(engine_module, "patch_kernels", copies_made)
    engine = engine_module.Engine(tiny_llama, EngineConfig(warm_up_s=0))
    left = int(80 * GB * 0.95) - 10 * GB
    assert isinstance(engine.prefix_cache, MemoryPrefixCache)
    assert (engine.kv_budget, engine.prefix_cache.budget_bytes) == (int(left * 0.5), int(left * 0.25))


def test_create_engine_puts_the_disk_behind_memory_unless_the_cache_is_off(tiny_llama):
    from locals.engine.assemble import create_engine
    from locals.engine.cache.prefix_cache import NoPrefixCache
    from locals.engine.cache.tiered_cache import TieredPrefixCache

    on = create_engine(tiny_llama, EngineConfig(prefix_cache_bytes=64 * 2**20, tuned_kernels=False))
    assert isinstance(on.prefix_cache, TieredPrefixCache) and on.prefix_cache.memory.budget_bytes == 64 * 2**20
    off = create_engine(tiny_llama, EngineConfig(prefix_cache_bytes=0, tuned_kernels=False))
    assert isinstance(off.prefix_cache, NoPrefixCache)


def test_steps_carry_64_tokens_beside_decoding_rows_on_the_cpu_and_256_on_a_gpu(monkeypatch):
    # Read alone, a prompt advances 256 tokens a step on the CPU and 2,048 on a GPU.
    from locals.engine.scheduler import Scheduler

    for kind, budget, alone in (("cpu", 64, 256), ("cuda", 256, 2048), ("metal", 256, 2048)):
        _machine(monkeypatch, kind, device_gb=16, host_gb=16)
        config = EngineConfig()
        scheduler = Scheduler(config.step_token_budget, config.min_prefill_chunk, config.solo_prefill_factor)
        assert (scheduler.token_budget, scheduler.solo_budget) == (budget, alone), kind
