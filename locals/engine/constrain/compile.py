"""Compiling regexes into `CompiledIndex`es: cached in memory and on disk, built off-thread with a time limit.

Keys are (outlines-core version, tokenizer fingerprint, regex). Compiles run on daemon
threads, two at a time (outlines-core releases the GIL while it builds), so a request waits
on its own compile without stalling the server, and a compile that runs past its limit
becomes a RequestError naming the schema; it keeps running and lands in the cache for next
time, but never keeps a finished process (`locals generate`) from exiting. On disk each
automaton is a pickle behind a magic line and its SHA-256, written atomically
(`locals.atomic_file`); a file that fails the check is deleted and rebuilt, never loaded.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import threading
from collections import OrderedDict
from concurrent.futures import Future, TimeoutError as FutureTimeout
from importlib.metadata import version

import outlines_core

from locals import disk_budget, settings
from locals.atomic_file import write_atomically
from locals.config import constraint_dir
from locals.engine.constrain.index import CompiledIndex
from locals.engine.constrain.vocab import TokenVocab
from locals.errors import RequestError

log = logging.getLogger(__name__)

MEMORY_ENTRIES = 128
# Automata on disk take 5-30 MB each with a 49k-token vocabulary: the least recently used
# go once the folder passes this (`locals cache clear` empties it).
DISK_CAP_BYTES = 512 << 20
_OUTLINES_VERSION = version("outlines_core")
# Files written before the checksum fail the magic check and are rebuilt.
_DISK_MAGIC = b"LOCALS-AUTOMATON-1\n"

_memory: "OrderedDict[str, CompiledIndex]" = OrderedDict()
_inflight: dict[str, Future] = {}
_lock = threading.Lock()
_slots = threading.BoundedSemaphore(2)  # compiles at once


def _run_detached(fn, *args) -> Future:
    """`fn(*args)` on a daemon thread once a slot is free. Not a ThreadPoolExecutor: Python
    joins its workers at exit, so a compile past its limit (minutes, gigabytes: outlines-core
    on `"minLength": 60`) kept `locals generate` from exiting after it printed its error."""
    future: Future = Future()

    def run() -> None:
        with _slots:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the waiter, as an executor would
                future.set_exception(exc)

    threading.Thread(target=run, name="locals-constrain", daemon=True).start()
    return future


def cache_key(regex: str, vocab: TokenVocab) -> str:
    text = f"{_OUTLINES_VERSION}\0{vocab.fingerprint}\0{regex}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def disk_folder():
    """Where compiled automata are kept across restarts."""
    return constraint_dir()


def _disk_path(key: str):
    folder = disk_folder()
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{key}.index"


def _load_disk(key: str) -> outlines_core.Index | None:
    try:
        path = _disk_path(key)
        payload = _unsealed(path.read_bytes())
        if payload is None:  # cut short or damaged on the disk: rebuilt, and the file goes
            log.warning("deleting a damaged constraint cache entry %s", key)
            path.unlink(missing_ok=True)
            return None
        index = pickle.loads(payload)
    except FileNotFoundError:
        return None
    except Exception as exc:  # a stale file (another outlines-core) is rebuilt, never fatal
        log.warning("ignoring unreadable constraint cache entry %s: %s", key, exc)
        return None
    disk_budget.touch(path)  # recently used: trimmed last
    return index


def _save_disk(key: str, index: outlines_core.Index) -> None:
    try:
        write_atomically(_disk_path(key), _sealed(pickle.dumps(index)))
        trim_disk(DISK_CAP_BYTES)
    except OSError as exc:
        log.warning("could not write constraint cache entry %s: %s", key, exc)


def _sealed(payload: bytes) -> list[bytes]:
    """A cache file's parts: magic, the payload's SHA-256, the payload."""
    return [_DISK_MAGIC, hashlib.sha256(payload).digest(), payload]


def _unsealed(data: bytes) -> bytes | None:
    """The payload of a sealed file, or None when it is not one or fails its checksum."""
    start = len(_DISK_MAGIC) + 32
    if not data.startswith(_DISK_MAGIC):
        return None
    payload = data[start:]
    return payload if hashlib.sha256(payload).digest() == data[len(_DISK_MAGIC):start] else None


def trim_disk(cap: int) -> int:
    """Delete the least recently used automata until the folder holds at most `cap` bytes; bytes freed."""
    return disk_budget.trim(disk_folder(), "*.index", cap)


def _build(key: str, regex: str, vocab: TokenVocab) -> CompiledIndex:
    hit = _cached(key)  # built meanwhile on a request's own thread (compile_now)
    if hit is not None:
        with _lock:
            _inflight.pop(key, None)
        return hit
    index = _load_disk(key)
    if index is None:
        index = outlines_core.Index(regex, vocab.outlines_vocabulary())
        _save_disk(key, index)
    compiled = CompiledIndex(index, vocab)
    with _lock:
        _memory[key] = compiled
        _memory.move_to_end(key)
        while len(_memory) > MEMORY_ENTRIES:
            _memory.popitem(last=False)
        _inflight.pop(key, None)
    return compiled


def _cached(key: str) -> CompiledIndex | None:
    with _lock:
        hit = _memory.get(key)
        if hit is not None:
            _memory.move_to_end(key)
        return hit


def submit(regex: str, vocab: TokenVocab) -> Future:
    """A future of the compiled regex (done at once on a memory hit; shared by concurrent callers)."""
    key = cache_key(regex, vocab)
    hit = _cached(key)
    if hit is not None:
        done: Future = Future()
        done.set_result(hit)
        return done
    with _lock:
        future = _inflight.get(key)
        if future is None:
            future = _run_detached(_build, key, regex, vocab)
            future.add_done_callback(lambda f, k=key: (f.cancelled() or f.exception()) and _forget(k))
            _inflight[key] = future
        return future


def _forget(key: str) -> None:
    with _lock:
        _inflight.pop(key, None)


def wait(future: Future, label: str, timeout: float | None = None) -> CompiledIndex:
    """The compiled index, or RequestError naming `label` when it fails or takes too long."""
    limit = settings.CONSTRAINT_TIMEOUT.get() if timeout is None else timeout
    try:
        return future.result(timeout=limit)
    except FutureTimeout:
        raise RequestError(f"{label} takes too long to compile for constrained decoding "
                           f"(over {limit:g} s); simplify it (fewer optional fields, shorter "
                           "patterns or enums)") from None
    except (ValueError, RuntimeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RequestError(f"{label} cannot be compiled for constrained decoding: {detail}") from None


def compile_regex(regex: str, vocab: TokenVocab, label: str, timeout: float | None = None) -> CompiledIndex:
    """Compile (or fetch from cache) `regex` for `vocab`, waiting at most `timeout` seconds."""
    return wait(submit(regex, vocab), label, timeout)


def compile_now(regex: str, vocab: TokenVocab, future: Future | None, label: str) -> CompiledIndex:
    """Compile on the calling thread unless a worker already runs it (used when a request
    needs this one next and queued prefetches must not delay it).

    A queued future is left alone, never cancelled: other requests with the same tools may
    wait on it, and a cancelled future reaches them as asyncio's CancelledError, which
    drops their connection without a response. The worker finds the result cached later.
    """
    key = cache_key(regex, vocab)
    if future is not None and (future.done() or future.running()):
        return wait(future, label)
    hit = _cached(key)
    if hit is not None:
        return hit
    try:
        return _build(key, regex, vocab)
    except (ValueError, RuntimeError) as exc:
        raise RequestError(f"{label} cannot be compiled for constrained decoding: {exc}") from None
