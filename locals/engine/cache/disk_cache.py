"""Prefix KV on disk, so a system prompt read once is not read again after a restart.

One file per prefix under `<cache dir>/prompts/<model key>/`: a magic line, a JSON header
(model key, tokens, per-layer shapes and dtype), the raw K/V bytes, then a SHA-256 over the
SHA-256s of everything before it in 16 MiB chunks (so a load checks the chunks on all cores
at once: a 16k-token prompt of a 4B model is a 2.4 GB file). `save` only records the
prefix's arrays; the MLX thread copies them to host memory in bounded slices (`pump`), and
a background thread then hashes and writes them to a temp name, flushed to the disk and
renamed into place (`locals.atomic_file`): a process killed mid-write leaves a `*.tmp`,
deleted at the next start once its writer is gone, never a torn `.kv`. A file that is
truncated, tampered with or made for another model or tokenizer fails its checks and is
deleted, never loaded. Total size is bounded; the least recently used files go first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from locals.atomic_file import remove_dead_temps, write_atomically
from locals.engine.forward.kv import LayerKV

log = logging.getLogger(__name__)
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


def _file_parts(key: str, tokens: list[int], kv: list[tuple[np.ndarray, np.ndarray]], dtype: str):
    """The file format piece by piece (no whole-file copy in memory), its digest last."""
    header = {"model_key": key, "tokens": list(map(int, tokens)), "dtype": dtype,
              "shapes": [[list(k.shape), list(v.shape)] for k, v in kv]}
    head = json.dumps(header).encode()
    digest = ChunkedDigest()
    # hashlib and file writes release the GIL on big buffers: the server keeps running.
    for part in [MAGIC, len(head).to_bytes(8, "little"), head] + [
            memoryview(np.ascontiguousarray(a)).cast("B") for pair in kv for a in pair]:
        digest.update(part)
        yield part
    yield digest.digest()


def read_header(path: Path, key: str | None) -> dict | None:
    """The file's header if it has our magic and model key (any key when None) and the file is
    as long as the header says; the tensors are not read or checked."""
    try:
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            if f.read(len(MAGIC)) != MAGIC:
                return None
            size = int.from_bytes(f.read(8), "little")
            if size > file_size:  # a damaged length: never allocate it
                return None
            header = json.loads(f.read(size))
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict) or _file_size(header, size) != file_size:
        return None
    return header if key is None or header.get("model_key") == key else None


def _file_size(header: dict, head_size: int) -> int | None:
    """The size a file with this header has (None: the header is not one of ours)."""
    tokens, shapes, dtype = header.get("tokens"), header.get("shapes"), header.get("dtype")
    if not isinstance(tokens, list) or not isinstance(shapes, list) or dtype not in _DTYPES:
        return None
    itemsize = np.dtype(_DTYPES[dtype][1]).itemsize
    try:
        tensors = sum(int(np.prod(shape)) * itemsize for pair in shapes for shape in pair)
    except (TypeError, ValueError):
        return None
    return len(MAGIC) + 8 + head_size + tensors + 32


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


class HostCopy:
    """One saved prefix on its way to host memory: its MLX arrays copied a bounded slice at a time.

    `copy` runs on the MLX thread only (an array is read through a zero-copy numpy view of
    its buffer, which evaluates it). The host buffers are allocated and touched beforehand
    by `prepare` on a plain thread: first-touch page faults cost more than the copy itself
    (16 MiB: ~35 ms into fresh pages, ~1 ms into touched ones, on a 2-core VM).
    """

    def __init__(self, tokens: list[int], kv: list[LayerKV], dtype: str):
        self.tokens, self.dtype = tokens, dtype
        _, _, view = _DTYPES[dtype]
        # numpy has no bfloat16: read its bits as uint16 (the file stores the raw bytes).
        self._sources = [a.view(view) if view is not None else a for pair in kv for a in pair]
        # The slices and views are copy-free; queued behind the step in flight rather than
        # waited for here, they are ready (no stream sync) when `copy` reads them.
        mx.async_eval(self._sources)
        self._shapes = [tuple(a.shape) for a in self._sources]
        self.left = sum(a.nbytes for a in self._sources)
        self.ready = threading.Event()
        self.failed = False
        self._host: list[np.ndarray] = []
        self._index, self._row = 0, 0
        self._src: np.ndarray | None = None  # (rows, tokens, width) view of the array being copied

    def prepare(self) -> None:
        """Allocate the host arrays and touch their pages (numpy only; releases the GIL)."""
        try:
            np_dtype = _DTYPES[self.dtype][1]
            for shape in self._shapes:
                self._host.append(np.empty(shape, np_dtype))
                self._host[-1].fill(0)
        except Exception:  # out of memory: the save is dropped, `pump` must not wait forever
            self.failed = True
            self._host.clear()
        self.ready.set()

    def copy(self, budget: float, until: float = float("inf")) -> int:
        """Copy about `budget` bytes (whole token rows, at least one), stopping at the first head's
        rows that ends past `until` (a `time.perf_counter()` value); the bytes copied."""
        copied = 0
        while copied < budget and self.left and (not copied or time.perf_counter() < until):
            if self._src is None:
                self._start()
            dst = self._host[self._index].reshape(self._src.shape)  # a view of the host array
            heads, n, width = self._src.shape
            h, t = divmod(self._row, n)
            rows = (budget - copied) // (width * self._src.itemsize)
            if rows < 1 and copied:
                break  # never past the budget, except by the one row a tiny budget still copies
            take = int(max(1, min(n - t, rows)))
            dst[h, t:t + take] = self._src[h, t:t + take]
            self._row += take
            nbytes = take * width * self._src.itemsize
            copied, self.left = copied + nbytes, self.left - nbytes
            if self._row == heads * n:
                self._src = None  # drops this array's MLX buffer reference
                self._index, self._row = self._index + 1, 0
        return copied

    def _start(self) -> None:
        array, self._sources[self._index] = self._sources[self._index], None  # the view keeps it
        src = np.asarray(array)  # zero-copy, strided over the stored entry's buffer
        self._src = src.reshape(-1, src.shape[-2], src.shape[-1])  # a view: leading axes (1, heads)

    def host(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The host arrays as (K, V) per layer, once `left` is 0."""
        return list(zip(self._host[0::2], self._host[1::2]))


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


# Host memory the copies of saved prefixes may hold at once (allocated whole when saved, freed
# once written): outside the KV budget, so bounded.
HOST_COPIES_MAX_BYTES = 1 << 30


class DiskPrefixStore:
    """Prefixes on disk for one model: an index of headers, background writes, LRU bound."""

    def __init__(self, root: Path, key: str, budget_bytes: int, min_tokens: int = 64):
        self.dir = root / key
        self.dir.mkdir(parents=True, exist_ok=True)
        self.key, self.budget_bytes, self.min_tokens = key, budget_bytes, min_tokens
        self.entries: dict[str, DiskEntry] = {}
        self._queued: dict[str, np.ndarray] = {}  # tokens of writes not on disk yet
        self._host_bytes: dict[str, int] = {}  # the host memory each of them holds until written
        self._lock = threading.Lock()
        self._copies: deque[HostCopy] = deque()  # saved, not yet in host memory
        self._owner: int | None = None  # the thread that saves (owns MLX) and pumps
        self._queue: queue.Queue = queue.Queue()
        self.written = 0  # files written since the start
        self.write_failures = 0  # files that could not be written (a full disk, a read-only folder)
        self.last_failure: str | None = None  # why the latest of them failed, for `locals status`
        self._scan()
        threading.Thread(target=self._writer, name="locals-kv-writer", daemon=True).start()

    def _scan(self) -> None:
        for path in self.dir.glob("*.kv"):
            if not path.is_file():
                continue  # not a file this cache wrote: left alone
            header = read_header(path, self.key)
            if header is None:
                log.warning("deleting a damaged prompt-cache file: %s", path)
                path.unlink(missing_ok=True)
                continue
            self.entries[path.stem] = DiskEntry(path, np.asarray(header["tokens"], np.int64), path.stat().st_size)
        remove_dead_temps(self.dir)

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
            log.warning("deleting a damaged prompt-cache file (its checksum fails): %s", entry.path)
            self._forget(entry.path.stem, delete=True)
            return None
        with contextlib.suppress(OSError):  # a read-only cache folder still serves what it holds
            os.utime(entry.path)  # recently used
        return decoded[1]

    def covered(self, tokens: list[int]) -> int:
        """Leading tokens of `tokens` that disk holds or will hold once queued writes land."""
        query = np.asarray(tokens, np.int64)
        with self._lock:
            stored = [e.tokens for e in self.entries.values()] + list(self._queued.values())
        return max((_common_prefix(t, query) for t in stored), default=0)

    def save(self, tokens: list[int], kv: list[LayerKV]) -> None:
        """Queue a write of this prefix: only records it, nothing is copied here.

        Call on the MLX thread, then `pump` there until `pending_copy_bytes` is 0 (or
        `flush` there); the stored arrays must not change afterwards (prefix-cache entries
        never do).
        """
        if len(tokens) < self.min_tokens or self.covered(tokens) == len(tokens):
            return  # too short to be worth a file, or already inside a stored or queued one
        nbytes = sum(a.nbytes for pair in kv for a in pair)
        if nbytes > self.budget_bytes:
            return  # could never be kept: not worth a copy
        with self._lock:
            in_flight = sum(self._host_bytes.values())
        if in_flight and in_flight + nbytes > HOST_COPIES_MAX_BYTES:
            return  # host memory for copies stays bounded; the prefix stays in memory, a later turn saves it
        self._owner = threading.get_ident()
        with self._lock:
            self._queued[self.name_of(tokens)] = np.asarray(tokens, np.int64)
            self._host_bytes[self.name_of(tokens)] = nbytes
        job = HostCopy(list(tokens), kv, str(kv[0][0].dtype).removeprefix("mlx.core."))
        self._copies.append(job)
        threading.Thread(target=job.prepare, name="locals-kv-alloc", daemon=True).start()

    def pump(self, budget_bytes: int | None, budget_s: float | None = None) -> bool:
        """Copy up to `budget_bytes` (None: all, waiting for buffers) of saved prefixes to host
        memory on the calling (MLX) thread, for about `budget_s` seconds at most (a head's rows
        of one layer past it); finished ones go to the writer thread. True while copying can go
        on now (False too while the next one's buffers are being prepared)."""
        budget = float("inf") if budget_bytes is None else budget_bytes
        until = float("inf") if budget_s is None else time.perf_counter() + budget_s
        while self._copies and budget > 0:
            job = self._copies[0]
            if budget_bytes is None:
                job.ready.wait()
            elif not job.ready.is_set():
                return False
            try:
                if job.failed:
                    raise MemoryError("no host memory for a copy of this prefix")
                budget -= job.copy(budget, until)
            except Exception:  # a failed save must never take the engine down
                log.exception("copying a prompt-cache prefix to host memory failed; not saved")
                self._copies.popleft()
                self._forget_queued(job.tokens)
                continue
            if job.left:
                break  # the budget is spent (down to less than a row, or its time)
            self._copies.popleft()
            self._queue.put((job.tokens, job.host(), job.dtype))
            if time.perf_counter() >= until:
                break
        return bool(self._copies)

    @property
    def pending_copy_bytes(self) -> int:
        """Bytes saved but not yet copied to host memory."""
        return sum(job.left for job in list(self._copies))

    @property
    def pending(self) -> int:
        """Saves not yet on disk (being copied, queued or being written)."""
        return len(self._copies) + self._queue.unfinished_tasks

    def flush(self, timeout: float = 30.0) -> tuple[int, int]:
        """Wait until saved prefixes are on disk; (written meanwhile, still pending at the timeout).

        On the thread that saves, copies what is left first; from any other thread it waits
        for that thread's `pump` (an engine stopping pumps everything before it exits).
        """
        if threading.get_ident() == self._owner:
            self.pump(None)
        before = self.pending
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        left = self.pending
        return max(0, before - left), left

    def _writer(self) -> None:
        while True:
            tokens, host, dtype = self._queue.get()
            try:
                self._write(tokens, host, dtype)
                self.written += 1
            except OSError as exc:  # a full disk must never take the engine down
                log.warning("a prompt-cache file was not written in %s (%s); the prefix stays in memory",
                            self.dir, exc)
                self.write_failures += 1
                self.last_failure = f"{exc.strerror or exc} in {self.dir}"
            finally:
                self._forget_queued(tokens)
                self._queue.task_done()

    def _forget_queued(self, tokens: list[int]) -> None:
        with self._lock:
            self._queued.pop(self.name_of(tokens), None)
            self._host_bytes.pop(self.name_of(tokens), None)

    def _write(self, tokens, host, dtype) -> None:
        name = self.name_of(tokens)
        final = self.dir / f"{name}.kv"
        self.dir.mkdir(parents=True, exist_ok=True)  # again: `locals cache clear` may have removed it
        size = write_atomically(final, _file_parts(self.key, tokens, host, dtype))
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
            with contextlib.suppress(OSError):  # a read-only folder: the index forgets it all the same
                entry.path.unlink(missing_ok=True)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())
