"""Folders of cache files kept under a byte budget: the least recently used files go first.

A file's last use is its modification time: readers `touch` what they read and writers write it
anew, so the oldest time is the least recently used. Temp files of writes cut off by an exit
(`*.tmp`, atomic_file.py) go once they are an hour old. Used by the compiled automata
(constrain/compile.py) and locals' compiled CUDA kernels (kernels/cubin.py); the prompt cache
keeps its own index (cache/disk_cache.py).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

STALE_TEMP_S = 3600


def touch(path: Path) -> None:
    """Mark `path` used now, so a trim takes it last (a read-only folder is left as it is)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def trim(folder: Path, pattern: str, cap: int) -> int:
    """Delete the least recently used files matching `pattern` in `folder` until those left hold
    at most `cap` bytes, and temp files older than an hour; returns the bytes freed."""
    files, now = [], time.time()
    for path in folder.glob("*") if folder.is_dir() else []:
        try:
            stat = path.stat()
            if path.suffix == ".tmp" and now - stat.st_mtime > STALE_TEMP_S:
                path.unlink()
                continue
        except OSError:  # another process trimmed it meanwhile
            continue
        if path.match(pattern) and path.suffix != ".tmp":
            files.append((stat.st_mtime, stat.st_size, path))
    total, freed = sum(size for _, size, _ in files), 0
    for _, size, path in sorted(files):
        if total - freed <= cap:
            break
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        freed += size
    return freed
