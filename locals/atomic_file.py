"""Files that are either wholly there or not at all: written to a temp name beside their final
path, flushed to the disk (fsync), renamed over it, and the rename itself flushed.

A process killed mid-write (`kill -9`, a crash, a full disk) leaves at most a `*.tmp` file,
which the next write of the same file deletes (as do the caches' own starts and trims); the
file readers see is the old one or the new one, never a torn one. Without the fsyncs a power cut could still leave the new name
pointing at blocks never written, so readers also check what they load (the prompt cache
and the automata cache carry a checksum; the tuning table must parse whole).
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Iterable
from pathlib import Path


def temp_path(path: Path) -> Path:
    """A temp name beside `path`, unique per process and thread, ending in `.tmp`."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def write_atomically(path: Path, parts: Iterable[bytes | memoryview]) -> int:
    """Write `parts` one after another as the new content of `path`; the bytes written.

    The parts are written as they come (a generator may compute the last part, a checksum,
    from the ones before), so no whole-file copy is held in memory.
    """
    _remove_dead_temps(path)
    tmp, size = temp_path(path), 0
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
                size += len(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)
    return size


def _remove_dead_temps(path: Path) -> None:
    """Delete the temp files of `path` left by processes that died writing it."""
    remove_dead_temps(path.parent, f"{glob.escape(path.name)}.*.tmp")


def remove_dead_temps(folder: Path, pattern: str = "*.tmp") -> None:
    """Delete the temp files in `folder` whose writer has died; a live process's write stays.

    Another process may share the folder (a second server, `locals generate`), so a temp
    file is only deleted once the process its name carries is gone.
    """
    for tmp in folder.glob(pattern):
        parts = tmp.name.rsplit(".", 4)  # <name>.<pid>.<thread>.tmp
        pid = parts[-3] if len(parts) >= 4 else ""
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (where the OS lets a folder be opened for that)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a folder; the rename is still atomic
    finally:
        os.close(fd)
