"""The cache writers killed mid-write on their own: a child process writes file after file and
is `kill -9`ed at a random moment; what is left must read as the old file or the new one,
never part of one. The daemon-level version (prompt cache and automata, restarts, replies)
is test_chaos_crash.py; the tuning table is tested here because only GPU servers write it.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from locals.atomic_file import write_atomically

# Each file: 4 MiB of one repeated byte, then the SHA-256 of it (the child's loop counter
# picks the byte, so consecutive files differ everywhere).
ATOMIC_WRITER = """
import hashlib, sys
from pathlib import Path
from locals.atomic_file import write_atomically
path = Path(sys.argv[1])
i = 0
while True:
    body = bytes([i % 256]) * (4 << 20)
    write_atomically(path, [body[: 1 << 20], body[1 << 20:], hashlib.sha256(body).digest()])
    i += 1
    print(i, flush=True)
"""
TABLE_WRITER = """
import mlx.core as mx
from locals.engine.kernels.tuning.tuner import TuningTable, save_table
i = 0
while True:
    i += 1
    choices = {f"layer{j}": {"1": "mlx"} for j in range(i % 400)}
    save_table(TuningTable(chip="cpu:chaos", mlx=mx.__version__, kernels="none", choices=choices))
    print(i, flush=True)
"""


def kill_mid_loop(script: str, args: list[str], rng: random.Random, env: dict | None = None) -> int:
    """Run `script` until it has written once, `kill -9` it a random moment later; its count."""
    child = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                             text=True, env=env)
    first = child.stdout.readline()
    assert first.strip(), "the writer died before its first write"
    time.sleep(rng.uniform(0, 0.05))
    child.kill()
    child.wait(timeout=30)
    return int(first)


def test_a_file_written_atomically_is_old_or_new_after_kill_9(tmp_path):
    rng, path = random.Random(36), tmp_path / "out" / "data.bin"
    path.parent.mkdir()  # a folder of its own: tmp_path also holds the test's locals home
    for _ in range(12):
        kill_mid_loop(ATOMIC_WRITER, [str(path)], rng)
        data = path.read_bytes()
        body, digest = data[:-32], data[-32:]
        assert len(body) == 4 << 20 and hashlib.sha256(body).digest() == digest
    leftovers = sorted(p.name for p in path.parent.iterdir() if p.name != "data.bin")
    assert len(leftovers) <= 1 and all(name.endswith(".tmp") for name in leftovers)  # the last kill's


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "table.json"
    write_atomically(path, [b"old"])

    def parts():
        yield b"half of the new"
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_atomically(path, parts())
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["table.json"]


def test_a_damaged_automaton_on_disk_is_deleted_and_rebuilt(locals_home):
    from locals.engine.constrain import compile as constrain_compile

    constrain_compile._save_disk("k", {"states": [1, 2, 3]})
    assert constrain_compile._load_disk("k") == {"states": [1, 2, 3]}
    path = constrain_compile._disk_path("k")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert constrain_compile._load_disk("k") is None and not path.exists()


@pytest.mark.slow
def test_the_tuning_table_is_old_or_new_after_kill_9(locals_home, request):
    from locals.engine.kernels.tuning.tuner import load_table

    rng = random.Random(36)
    env = {**__import__("os").environ, "LOCALS_HOME": str(locals_home)}
    rounds = request.config.getoption("--crash-rounds", 30)
    folder, cut = Path(locals_home) / "cache" / "tuning", 0
    for _ in range(rounds):
        kill_mid_loop(TABLE_WRITER, [], rng, env)
        cut += any(folder.glob("*.tmp"))  # this kill came mid-write
        table = load_table("cpu:chaos")
        assert table is not None, "a kill left a tuning table that does not load"
        assert all(choice == {"1": "mlx"} for choice in table.choices.values())
    assert len(list(folder.glob("*.tmp"))) <= 1, "temp files of cut writes pile up"
    print(f"\ntuning table: {rounds} kills ({cut} mid-write), loaded whole after each")
