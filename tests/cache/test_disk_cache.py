"""The prefix KV store on disk: round trip, checks that discard bad files, LRU bound, tiers."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from locals.engine.cache.disk_cache import DiskPrefixStore, decode
from locals.engine.cache.prefix_cache import MemoryPrefixCache
from locals.engine.cache.tiered_cache import TieredPrefixCache


def _kv(n: int, layers: int = 3, dtype=mx.float32, seed: int = 0):
    mx.random.seed(seed)
    return [(mx.random.normal((1, 2, n, 8)).astype(dtype), mx.random.normal((1, 2, n, 8)).astype(dtype))
            for _ in range(layers)]


def _same(a, b) -> bool:
    return all(mx.array_equal(x, y).item() for pa, pb in zip(a, b) for x, y in zip(pa, pb))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16])
def test_round_trip_and_restart(tmp_path, dtype):
    tokens = list(range(100))
    kv = _kv(100, dtype=dtype)
    store = DiskPrefixStore(tmp_path, "model-a", budget_bytes=10**8, min_tokens=10)
    store.save(tokens, kv)
    store.flush()
    again = DiskPrefixStore(tmp_path, "model-a", budget_bytes=10**8, min_tokens=10)  # a restart
    n, entry = again.longest(tokens + [5, 6, 7])
    assert n == 100
    loaded = again.load(entry)
    assert loaded[0][0].dtype == dtype and _same(loaded, kv)
    assert again.longest(tokens[:50])[0] == 50  # a longer file serves a shorter prompt
    assert again.longest([7] + tokens)[0] == 0


def test_foreign_model_file_is_discarded(tmp_path):
    store = DiskPrefixStore(tmp_path, "model-a", 10**8, min_tokens=1)
    store.save([1, 2, 3], _kv(3))
    store.flush()
    path = next((tmp_path / "model-a").glob("*.kv"))
    other = tmp_path / "model-b"
    other.mkdir()
    path.rename(other / path.name)
    assert DiskPrefixStore(tmp_path, "model-b", 10**8).entries == {}
    assert not list(other.glob("*.kv"))


def _stored_file(tmp_path, key="m"):
    store = DiskPrefixStore(tmp_path, key, 10**8, min_tokens=1)
    store.save(list(range(20)), _kv(20))
    store.flush()
    return next((tmp_path / key).glob("*.kv"))


def test_a_flipped_tensor_byte_is_found_at_load_and_the_file_deleted(tmp_path, caplog):
    path = _stored_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    again = DiskPrefixStore(tmp_path, "m", 10**8, min_tokens=1)
    n, entry = again.longest(list(range(25)))
    assert n == 20  # the header still reads...
    assert again.load(entry) is None  # ...but the checksum fails: discarded
    assert not path.exists() and again.longest(list(range(25))) == (0, None)
    assert decode(bytes(data), "m") is None
    assert "deleting a damaged prompt-cache file" in caplog.text


@pytest.mark.parametrize("damage", ["truncate", "length", "tokens", "directory"])
def test_a_damaged_file_never_stops_a_start(tmp_path, damage, caplog):
    path = _stored_file(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":  # the header reads, the file is shorter than it says
        path.write_bytes(bytes(data[: len(data) - 100]))
    elif damage == "length":  # the header's length flipped to petabytes (was a MemoryError)
        data[12 + 7] ^= 0x40
        path.write_bytes(bytes(data))
    elif damage == "tokens":  # a header without its tokens
        path.write_bytes(bytes(data).replace(b'"tokens"', b'"tokenz"'))
    else:  # a folder of that name: not ours, left alone
        path.unlink()
        path.mkdir()
    again = DiskPrefixStore(tmp_path, "m", 10**8, min_tokens=1)
    assert again.entries == {}
    assert path.is_dir() if damage == "directory" else not path.exists()
    assert damage == "directory" or "deleting a damaged prompt-cache file" in caplog.text


def test_writes_go_on_after_the_folder_is_cleared_under_a_running_server(tmp_path):
    import shutil

    store = DiskPrefixStore(tmp_path, "m", 10**8, min_tokens=1)
    shutil.rmtree(tmp_path / "m")  # `locals cache clear` while the server runs
    store.save(list(range(20)), _kv(20))
    store.flush()
    assert len(list((tmp_path / "m").glob("*.kv"))) == 1


def test_a_write_the_disk_refuses_is_counted_with_its_reason_for_status(tmp_path, monkeypatch):
    import errno

    from locals.cli.daemon import disk_line
    from locals.engine.cache import disk_cache

    store = DiskPrefixStore(tmp_path, "m", 10**8, min_tokens=1)
    store.save(list(range(20)), _kv(20))
    store.flush()

    def full(path, parts):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_cache, "write_atomically", full)
    store.save(list(range(100, 130)), _kv(30, seed=1))
    store.flush()
    tiers = TieredPrefixCache(MemoryPrefixCache(10**8), store)
    writes = tiers.disk_writes()
    assert writes["written"] == 1 and writes["failed"] == 1
    assert writes["last_failure"] == f"No space left on device in {tmp_path / 'm'}"
    line = disk_line({"prefix_disk_writes": writes, "prefix_disk_hits": 3})
    assert line.startswith("1 prompt written, 3 loaded") and "1 not written" in line and "No space" in line
    assert disk_line({"prefix_disk_writes": {}}) is None and MemoryPrefixCache(10**8).disk_writes() == {}


def test_budget_evicts_least_recently_used(tmp_path):
    store = DiskPrefixStore(tmp_path, "m", budget_bytes=10**9, min_tokens=1)
    store.save(list(range(10)), _kv(10))
    store.flush()
    size = store.nbytes
    store.budget_bytes = int(size * 2.5)
    store.save(list(range(100, 110)), _kv(10, seed=1))
    store.flush()
    store.load(store.longest(list(range(10)))[1])  # touch the first: most recently used
    store.save(list(range(200, 210)), _kv(10, seed=2))
    store.flush()
    assert store.nbytes <= store.budget_bytes
    assert store.longest(list(range(10)))[0] == 10
    assert store.longest(list(range(100, 110)))[0] == 0


def test_tiers_persist_reused_prefixes_and_serve_after_restart(tmp_path):
    prompt = list(range(300))
    kv = _kv(300)
    tiered = TieredPrefixCache(MemoryPrefixCache(10**9), DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=64))
    tiered.insert(prompt, kv)
    assert tiered.disk.entries == {}  # one-off prompts are not written
    n, hit = tiered.lookup(prompt[:200] + [999])  # a second request reuses 200 tokens
    assert n == 200
    tiered.disk.flush()
    restarted = TieredPrefixCache(MemoryPrefixCache(10**9), DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=64))
    n, kv2 = restarted.lookup(prompt[:200] + [1, 2])
    assert n == 200 and restarted.disk_hits == 1
    assert np.allclose(np.array(kv2[0][0][..., :200, :]), np.array(kv[0][0][..., :200, :]))


def test_a_conversation_file_serves_its_system_prompt_after_restart(tmp_path):
    system, turn1, turn2 = list(range(100)), list(range(500, 540)), list(range(600, 650))
    kv = _kv(190)
    tiered = TieredPrefixCache(MemoryPrefixCache(10**9), DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=64))
    tiered.insert(system + turn1 + turn2, kv)
    tiered.lookup(system + turn1 + [1])  # turn 2 of the conversation: system + turn 1 go to disk
    tiered.disk.flush()
    tiered.lookup(system + turn1 + turn2 + [1])  # turn 3 has not doubled what disk holds: no write
    tiered.disk.flush()
    assert [len(e.tokens) for e in tiered.disk.entries.values()] == [140]
    restarted = TieredPrefixCache(MemoryPrefixCache(10**9), DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=64))
    n, kv2 = restarted.lookup(system + [9, 9, 9])  # another agent, same system prompt
    assert n == 100 and restarted.disk_hits == 1
    assert _same([(k[..., :100, :], v[..., :100, :]) for k, v in kv2], [(k[..., :100, :], v[..., :100, :]) for k, v in kv])
    # The loaded file now sits in memory whole: the next request needs no disk read.
    assert restarted.lookup(system + turn1 + [5])[0] == 140 and restarted.disk_hits == 1


def test_a_file_that_doubles_a_stored_prefix_replaces_it(tmp_path):
    store = DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=1)
    store.save(list(range(50)), _kv(50))
    store.flush()
    store.save(list(range(30)), _kv(30))  # inside a stored file already: not written
    store.save(list(range(120)), _kv(120, seed=3))
    store.flush()
    assert [len(e.tokens) for e in store.entries.values()] == [120]
    assert len(list((tmp_path / "m").glob("*.kv"))) == 1


def test_queued_writes_count_as_stored(tmp_path):
    import threading

    store = DiskPrefixStore(tmp_path, "m", 10**9, min_tokens=1)
    gate, real = threading.Event(), store._write
    store._write = lambda *args: (gate.wait(10), real(*args))  # hold the writer back
    store.save(list(range(100)), _kv(100))
    assert store.covered(list(range(100)) + [5]) == 100 and store.longest(list(range(100)))[0] == 0
    tiered = TieredPrefixCache(MemoryPrefixCache(10**9), store)
    tiered.insert(list(range(150)), _kv(150, seed=4))
    tiered.lookup(list(range(150)) + [1])  # 150 < 2 x the 100 already queued: no second write
    gate.set()
    store.flush()
    assert [len(e.tokens) for e in store.entries.values()] == [100] and store.covered([0]) == 1


def test_cache_cli_lists_and_clears(locals_home):
    from typer.testing import CliRunner

    from locals.cli import app
    from locals.cli.cache import prompts_dir
    from locals.engine.cache.disk_cache import DiskPrefixStore

    store = DiskPrefixStore(prompts_dir(), "abc123", 10**8, min_tokens=1)
    store.save(list(range(77)), _kv(77))
    store.flush()
    runner = CliRunner()
    listed = runner.invoke(app, ["cache", "list"])
    assert listed.exit_code == 0 and "abc123" in listed.output and "77" in listed.output
    # A file cut inside its header is listed as damaged (never loaded), so `clear` can free it.
    damaged = next(prompts_dir().rglob("*.kv")).with_name("cut.kv")
    damaged.write_bytes(next(prompts_dir().rglob("*.kv")).read_bytes()[:20])
    from locals.engine.constrain.compile import disk_folder

    disk_folder().mkdir(parents=True)
    (disk_folder() / "k.index").write_bytes(b"x" * (3 << 20))  # a compiled automaton
    listed = runner.invoke(app, ["cache", "list"])
    assert listed.exit_code == 0 and "damaged" in listed.output and "77" in listed.output, listed.output
    assert "automata: 1 files, 3.0 MiB" in listed.output
    cleared = runner.invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0 and "cleared" in cleared.output
    assert not list(prompts_dir().rglob("*.kv")) and not disk_folder().exists()


def test_cache_clear_reports_what_it_could_not_delete(locals_home, monkeypatch):
    import os

    from typer.testing import CliRunner

    from locals.cli import app
    from locals.cli.cache import prompts_dir

    store = DiskPrefixStore(prompts_dir(), "abc123", 10**8, min_tokens=1)
    store.save(list(range(77)), _kv(77))
    store.flush()
    kept = next(prompts_dir().rglob("*.kv"))
    real_unlink = os.unlink

    def read_only(path, *args, **kwargs):  # as on a read-only mount (root ignores file modes)
        if str(path) == str(kept) or str(path) == kept.name:
            raise PermissionError(13, "Read-only file system", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", read_only)
    cleared = CliRunner().invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 1 and kept.exists()
    assert "cleared 0.0 MiB" in cleared.output and "could not delete" in str(cleared.exception or cleared.output)


def test_files_where_the_cache_folders_belong_cost_the_disk_tier_not_the_server(locals_home, tiny_llama, caplog):
    import uuid

    from typer.testing import CliRunner

    from locals.cli import app
    from locals.config import cache_dir
    from locals.engine import build_constraint, create_engine

    (cache_dir() / "prompts").write_text("not a folder")
    (cache_dir() / "constraint").write_text("not a folder")
    engine = create_engine(tiny_llama)
    assert engine is not None and "prompts are not cached on disk" in caplog.text
    schema = {"type": "object", "properties": {uuid.uuid4().hex[:8]: {"type": "integer"}}}
    assert build_constraint(tiny_llama, json_schema=schema) is not None  # compiled, just not kept
    assert CliRunner().invoke(app, ["cache", "clear"]).exit_code == 0
    assert not (cache_dir() / "prompts").exists() and not (cache_dir() / "constraint").exists()


def test_compiled_automata_on_disk_stay_under_their_cap(locals_home):
    import os

    from locals.engine.constrain.compile import disk_folder, trim_disk

    disk_folder().mkdir(parents=True)
    for i in range(5):  # oldest first
        path = disk_folder() / f"{i}.index"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (1000 + i, 1000 + i))
    assert trim_disk(2500) == 3000
    assert sorted(p.name for p in disk_folder().glob("*.index")) == ["3.index", "4.index"]


def test_cache_cli_lists_compiled_kernels_and_clears_them_when_asked(locals_home, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from locals.cli import app
    from locals.config import kernel_checks_dir, kernels_dir
    from locals.engine.kernels.passed_checks import PassedChecks

    monkeypatch.delenv("MLX_PTX_CACHE_DIR", raising=False)
    ours = kernels_dir() / "0.32.4"
    (ours / "locals").mkdir(parents=True)
    (ours / "mlx_kernel.ptx").write_bytes(b"x" * (1 << 20))  # MLX's own, in locals' kernel cache
    (ours / "locals" / "k.cubin").write_bytes(b"x" * (1 << 20))
    PassedChecks(kernel_checks_dir(), "f" * 64).record("gated: 'k'")
    runner = CliRunner()
    listed = runner.invoke(app, ["cache", "list"])
    assert listed.exit_code == 0 and "compiled CUDA kernels: 2 files, 2.0 MiB" in listed.output, listed.output
    assert "not run again at a start): 1 file" in " ".join(listed.output.split()), listed.output
    cleared = runner.invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0 and "kept 2.0 MiB of compiled CUDA kernels" in cleared.output, cleared.output
    assert (ours / "locals" / "k.cubin").exists()
    assert not kernel_checks_dir().exists()  # a plain clear: the next GPU start checks its kernels again
    cleared = runner.invoke(app, ["cache", "clear", "--kernels"])
    assert cleared.exit_code == 0 and "cleared 2.0 MiB" in cleared.output and "kept" not in cleared.output
    assert not kernels_dir().exists()
    # A kernel folder the user chose: locals deletes only its own cubins there, never MLX's files.
    chosen = tmp_path / "chosen"
    (chosen / "locals").mkdir(parents=True)
    (chosen / "mlx_kernel.ptx").write_bytes(b"x")
    (chosen / "locals" / "k.cubin").write_bytes(b"x")
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(chosen))
    assert runner.invoke(app, ["cache", "clear", "--kernels"]).exit_code == 0
    assert [p.name for p in chosen.iterdir()] == ["mlx_kernel.ptx"]


def test_a_cache_folder_that_cannot_be_written_still_serves_what_it_holds(tmp_path, monkeypatch):
    # A read-only mount, or files another user owns: touching a file for the LRU order fails,
    # and so does deleting a damaged one; neither may fail the request that found it.
    import os

    store = DiskPrefixStore(tmp_path, "m", 10**8, min_tokens=1)
    store.save(list(range(20)), _kv(20))
    store.flush()

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(os, "utime", read_only)
    monkeypatch.setattr(type(tmp_path), "unlink", read_only)
    n, entry = store.longest(list(range(25)))
    assert n == 20 and _same(store.load(entry), _kv(20))
    entry.path.write_bytes(b"damaged")
    assert store.load(entry) is None and store.longest(list(range(25)))[0] == 0  # forgotten, not raised


def test_copies_in_flight_stay_under_their_host_memory_cap(tmp_path, monkeypatch):
    from locals.engine.cache import disk_cache

    store = DiskPrefixStore(tmp_path, "m", 10**8, min_tokens=1)
    one = sum(a.nbytes for pair in _kv(20) for a in pair)
    monkeypatch.setattr(disk_cache, "HOST_COPIES_MAX_BYTES", int(one * 1.5))
    store.save(list(range(20)), _kv(20))
    store.save(list(range(100, 120)), _kv(20, seed=1))  # over the cap with the first in flight: not now
    store.flush()
    assert store.longest(list(range(20)))[0] == 20 and store.longest(list(range(100, 120)))[0] == 0
    store.save(list(range(100, 120)), _kv(20, seed=1))  # a later turn saves it
    store.flush()
    assert store.longest(list(range(100, 120)))[0] == 20


def test_a_second_store_keeps_a_live_writers_temp_file_and_deletes_a_dead_ones(tmp_path):
    """Two processes may share the folder (a server and `locals generate`): opening it must
    not delete the temp file of the other's write in progress, only those of dead writers."""
    import os
    import subprocess
    import sys

    folder = tmp_path / "m"
    folder.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    live_tmp = folder / f"{'a' * 32}.kv.{os.getpid()}.{1234}.tmp"
    dead_tmp = folder / f"{'b' * 32}.kv.{dead}.{1234}.tmp"
    for path in (live_tmp, dead_tmp):
        path.write_bytes(b"half a write")
    DiskPrefixStore(tmp_path, "m", 10**8, min_tokens=1)
    assert live_tmp.exists(), "a running writer's temp file was deleted"
    assert not dead_tmp.exists(), "a dead writer's temp file was kept"
