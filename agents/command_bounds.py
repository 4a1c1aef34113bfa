"""The bounds every agent command and `--check` runs within, beside its sandbox: memory for its
output, how long a process it leaves behind may hold that output, and no process outliving it.

Output is kept as its head and its tail (`BoundedOutput`), so a command that prints in a loop
costs a fixed amount of memory, and past `FLOOD_BYTES` it is stopped. Every process a command
starts carries `TAG_VARIABLE` in its environment; once the command is over, `kill_tagged`
finds and kills those still alive, which catches daemons that left the process group with
`setsid` (bubblewrap's PID namespace ends them too; `--no-sandbox` and Landlock have none).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import deque

import psutil

from locals import settings

# A check that prints this much is looping, not testing (pytest's most verbose runs of big
# suites stay in single megabytes); stopping it frees the CPU for the other agents.
FLOOD_BYTES = 64 << 20
# After the command itself exits, how long a process it started may keep its output open.
LINGER_S = 2.0
TAG_VARIABLE = settings.COMMAND_TAG.name  # set by locals on the commands it runs, read by no one else
TAG_SCANS = 5


class BoundedOutput:
    """The first and last `cap // 2` bytes of a stream, and how many bytes it had in all."""

    def __init__(self, cap: int):
        self.half = max(1, cap // 2)
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_bytes = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(chunk)
            self.tail_bytes += len(chunk)
            while self.tail_bytes - len(self.tail[0]) >= self.half:
                self.tail_bytes -= len(self.tail.popleft())

    def text(self) -> str:
        tail = b"".join(self.tail)[-self.half:]
        cut = self.total - len(self.head) - len(tail)
        head_text, tail_text = self.head.decode(errors="replace"), tail.decode(errors="replace")
        if cut <= 0:
            return head_text + tail_text
        return f"{head_text}\n... ({cut} characters cut) ...\n{tail_text}"

    async def read(self, stream: asyncio.StreamReader) -> bool:
        """Read `stream` to its end; False when it passed FLOOD_BYTES first."""
        while chunk := await stream.read(1 << 16):
            self.add(chunk)
            if self.total > FLOOD_BYTES:
                return False
        return True


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_tagged(tag: str) -> int:
    """Kill every process of this user whose environment carries `tag`; how many. Scans again
    until one finds none: a process forked while a scan ran is not in that scan's list."""
    killed = 0
    for _ in range(TAG_SCANS):
        found = 0
        for proc in psutil.process_iter():
            try:
                if proc.environ().get(TAG_VARIABLE) == tag:
                    proc.kill()
                    found += 1
            except (psutil.Error, OSError):
                continue  # gone meanwhile, another user's, or a zombie
        if not found:
            break
        killed += found
        time.sleep(0.05)
    return killed
