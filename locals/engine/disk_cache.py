"""Prefix KV on disk, so a system prompt read once is not read again after a restart.

One file per prefix under `<cache dir>/prompts/<model key>/`: a magic line, a JSON header
(model key, tokens, per-layer shapes and dtype), the raw K/V bytes, then a SHA-256 over the
SHA-256s of everything before it in 16 MiB chunks (so a load checks the chunks on all cores
at once: a 16k-token prompt of a 4B model is a 2.4 GB file). Files are written by a background thread to a temp name and
renamed into place; a file that is truncated, tampered with or made for another model
or tokenizer fails its checks and is deleted, never loaded. Total size is bounded; the
least recently used files go first.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from locals.engine.kv import LayerKV

MAGIC = b"LOCALS-KV-2\n"  # 2: chunked digest (files of version 1 fail the check and go)
CHUNK = 16 << 20
_DTYPES = {"float32": (mx.float32, np.float32, None), "float16": (mx.float16, np.float16, None),
           "bfloat16": (mx.bfloat16, np.uint16, mx.uint16)}


def model_key(model_id: str, tokenizer, revision: str = "") -> str:
    """A short hash naming the weights, their revision and the tokenizer's vocabulary."""
    h = hashlib.sha256(f"{model_id}\0{revision}\0".encode())
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    h.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    return h.hexdigest()[:16]


@dataclass
class DiskEntry:
    """What the index knows of one file without reading its tensors."""

    path: Path
    tokens: np.ndarray
    nbytes: int


class ChunkedDigest:
    """SHA-256 of the SHA-256s of consecutive CHUNK-byte pieces, fed in any pieces."""

    def __init__(self):
        self.digests: list[bytes] = []
        self._current = hashlib.sha256()
        self._fill = 0

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            take = min(CHUNK - self._fill, len(view))
            self._current.update(view[:take])
            self._fill += take
            view = view[take:]
            if self._fill == CHUNK:
                self.digests.append(self._current.digest())
                self._current, self._fill = hashlib.sha256(), 0

    def digest(self) -> bytes:
        tail = [self._current.digest()] if self._fill else []
        return hashlib.sha256(b"".join(self.digests + tail)).digest()


def chunked_digest(body: memoryview) -> bytes:
    """`ChunkedDigest` of `body`, its chunks hashed in parallel (hashlib releases the GIL)."""
    offsets = range(0, len(body), CHUNK)
    with ThreadPoolExecutor(max(1, min(len(offsets), os.cpu_count() or 1))) as pool:
        digests = list(pool.map(lambda at: hashlib.sha256(body[at:at + CHUNK]).digest(), offsets))
    return hashlib.sha256(b"".join(digests)).digest()


def _write_file(path: Path, key: str, tokens: list[int], kv: list[tuple[np.ndarray, np.ndarray]],
                dtype: str) -> int:
    """Write the file format to `path` piece by piece (no whole-file copy in memory); its size."""
    header = {"model_key": key, "tokens": list(map(int, tokens)), "dtype": dtype,
              "shapes": [[list(k.shape), list(v.shape)] for k, v in kv]}
    head = json.dumps(header).encode()
    digest, size = ChunkedDigest(), 0
    with open(path, "wb") as f:
        # hashlib and file writes release the GIL on big buffers: the server keeps running.
        for part in [MAGIC, len(head).to_bytes(8, "little"), head] + [
                memoryview(np.ascontiguousarray(a)).cast("B") for pair in kv for a in pair]:
            digest.update(part)
            f.write(part)
            size += len(part)
        f.write(digest.digest())
    return size + 32


def read_header(path: Path, key: str) -> dict | None:
    """The file's header if it has our magic and model key (tensors not read or checked)."""
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return None
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
    except (OSError, ValueError):
        return None
    return header if header.get("model_key") == key else None


def decode(data, key: str) -> tuple[list[int], list[LayerKV]] | None:
    """Tokens and KV from a file's bytes (bytes or a memory map), or None if any check fails."""
    data = memoryview(data).cast("B")
    if len(data) < len(MAGIC) + 8 + 32 or bytes(data[:len(MAGIC)]) != MAGIC:
        return None
    body, digest = data[:-32], bytes(data[-32:])  # views: no copy of a multi-GB file
    if chunked_digest(body) != digest:
        return None
    size = int.from_bytes(body[len(MAGIC):len(MAGIC) + 8], "little")
    start = len(MAGIC) + 8
    try:
        header = json.loads(bytes(body[start:start + size]))
        mx_dtype, np_dtype, view = _DTYPES[header["dtype"]]
    except (ValueError, KeyError):
        return None
    if header.get("model_key") != key:
        return None
    offset, kv = start + size, []
    for k_shape, v_shape in header["shapes"]:
        pair = []
        for shape in (k_shape, v_shape):
            count = int(np.prod(shape))
            arr = np.frombuffer(body, dtype=np_dtype, count=count, offset=offset).reshape(shape)
            offset += arr.nbytes
            m = mx.array(arr)
            pair.append(m.view(mx_dtype) if view is not None else m)
        kv.append(tuple(pair))
    if offset != len(body):
        return None
    return header["tokens"], kv


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class DiskPrefixStore:
    """Prefixes on disk for one model: an index of headers, background writes, LRU bound."""

    def __init__(self, root: Path, key: str, budget_bytes: int, min_tokens: int = 64):
        self.dir = root / key
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key, self.budget_bytes, self.min_tokens = key, budget_bytes, min_tokens
        self.entries: dict[str, DiskEntry] = {}
        self._queued: dict[str, np.ndarray] = {}  # tokens of writes not on disk yet
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._scan()
        threading.Thread(target=self._writer, name="locals-kv-writer", daemon=True).start()

    def _scan(self) -> None:
        for path in self.dir.glob("*.kv"):
            header = read_header(path, self.key)
            if header is None:
                path.unlink(missing_ok=True)
                continue
            self.entries[path.stem] = DiskEntry(path, np.asarray(header["tokens"], np.int64), path.stat().st_size)
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)

    @staticmethod
    def name_of(tokens: list[int]) -> str:
        return hashlib.sha256(np.asarray(tokens, np.int64).tobytes()).hexdigest()[:32]

    def longest(self, tokens: list[int]) -> tuple[int, DiskEntry | None]:
        """The stored entry sharing the longest leading run with `tokens`, and that run's length.

        Any entry serves any prompt up to their common prefix (a token's KV depends only on
        the tokens before it), so a conversation's file also serves its system prompt.
        """
        query = np.asarray(tokens, np.int64)
        best, best_n = None, 0
        with self._lock:
            entries = list(self.entries.values())
        for entry in entries:
            n = _common_prefix(entry.tokens, query)
            if n > best_n:
                best, best_n = entry, n
        return best_n, best

    def load(self, entry: DiskEntry) -> list[LayerKV] | None:
        """The entry's KV, or None (and the file deleted) if it fails its checks."""
        try:
            with open(entry.path, "rb") as f:
                # Mapped, not read: the pages are hashed and copied to MLX once each.
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
        except (OSError, ValueError):
            data = b""
        decoded = decode(data, self.key)
        if decoded is None or not np.array_equal(np.asarray(decoded[0], np.int64), entry.tokens):
            self._forget(entry.path.stem, delete=True)
            return None
        os.utime(entry.path)  # recently used
        return decoded[1]

    def covered(self, tokens: list[int]) -> int:
        """Leading tokens of `tokens` that disk holds or will hold once queued writes land."""
        query = np.asarray(tokens, np.int64)
        with self._lock:
            stored = [e.tokens for e in self.entries.values()] + list(self._queued.values())
        return max((_common_prefix(t, query) for t in stored), default=0)

    def save(self, tokens: list[int], kv: list[LayerKV]) -> None:
        """Queue a write of this prefix (call on the MLX thread; arrays are copied to host here)."""
        if len(tokens) < self.min_tokens or self.covered(tokens) == len(tokens):
            return  # too short to be worth a file, or already inside a stored or queued one
        dtype = str(kv[0][0].dtype).removeprefix("mlx.core.")
        _, _, view = _DTYPES[dtype]
        host = [tuple(np.array(a.view(view) if view is not None else a) for a in pair) for pair in kv]
        with self._lock:
            self._queued[self.name_of(tokens)] = np.asarray(tokens, np.int64)
        self._queue.put((list(tokens), host, dtype))

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until queued writes are on disk (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def _writer(self) -> None:
        while True:
            tokens, host, dtype = self._queue.get()
            try:
                self._write(tokens, host, dtype)
            except OSError:
                pass  # a full disk must never take the engine down; the prefix stays in memory
            finally:
                with self._lock:
                    self._queued.pop(self.name_of(tokens), None)
                self._queue.task_done()

    def _write(self, tokens, host, dtype) -> None:
        name = self.name_of(tokens)
        if sum(a.nbytes for pair in host for a in pair) > self.budget_bytes:
            return
        final, tmp = self.dir / f"{name}.kv", self.dir / f"{name}.{os.getpid()}.tmp"
        size = _write_file(tmp, self.key, tokens, host, dtype)
        os.replace(tmp, final)
        arr = np.asarray(tokens, np.int64)
        with self._lock:
            self.entries[name] = DiskEntry(final, arr, size)
            covered = [k for k, e in self.entries.items()
                       if k != name and len(e.tokens) <= len(arr) and _common_prefix(e.tokens, arr) == len(e.tokens)]
        for key in covered:  # the new file serves every prompt these served
            self._forget(key, delete=True)
        self._evict()

    def _evict(self) -> None:
        with self._lock:
            by_age = sorted(self.entries.values(), key=lambda e: e.path.stat().st_mtime
                            if e.path.exists() else 0)
            total = sum(e.nbytes for e in by_age)
        for entry in by_age:
            if total <= self.budget_bytes:
                break
            total -= entry.nbytes
            self._forget(entry.path.stem, delete=True)

    def _forget(self, name: str, delete: bool) -> None:
        with self._lock:
            entry = self.entries.pop(name, None)
        if entry is not None and delete:
            entry.path.unlink(missing_ok=True)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())
