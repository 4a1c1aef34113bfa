"""Folders of cache files under a byte budget (locals/disk_budget.py): the least recently used
go first, temp files of cut-off writes go once stale, and a read makes a file recent."""

import os
import time

from locals import disk_budget


def _file(folder, name: str, size: int, used_at: float):
    path = folder / name
    path.write_bytes(b"x" * size)
    os.utime(path, (used_at, used_at))
    return path


def test_the_least_recently_used_go_until_the_rest_fit(tmp_path):
    for i in range(5):
        _file(tmp_path, f"{i}.cubin", 1000, 1000 + i)
    _file(tmp_path, "other.index", 5000, 0)  # another pattern: neither counted nor deleted
    assert disk_budget.trim(tmp_path, "*.cubin", 2500) == 3000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3.cubin", "4.cubin", "other.index"]
    assert disk_budget.trim(tmp_path, "*.cubin", 2500) == 0


def test_a_file_read_again_is_kept_over_newer_ones(tmp_path):
    old = _file(tmp_path, "old.cubin", 1000, 1000)
    _file(tmp_path, "newer.cubin", 1000, 2000)
    disk_budget.touch(old)
    assert disk_budget.trim(tmp_path, "*.cubin", 1000) == 1000
    assert [p.name for p in tmp_path.iterdir()] == ["old.cubin"]


def test_stale_temp_files_go_and_fresh_ones_stay(tmp_path):
    now = time.time()
    _file(tmp_path, "a.cubin.123.456.tmp", 10, now - 2 * disk_budget.STALE_TEMP_S)
    _file(tmp_path, "b.cubin.123.789.tmp", 10, now)  # a write under way in another process
    assert disk_budget.trim(tmp_path, "*.cubin", 1 << 20) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["b.cubin.123.789.tmp"]


def test_a_missing_folder_frees_nothing(tmp_path):
    assert disk_budget.trim(tmp_path / "absent", "*.cubin", 0) == 0
