"""Crash while writing (slow): a real daemon on the embedded model is `kill -9`ed, round after
round (`--crash-rounds`, 30 by default), at a random moment while it writes a prompt-cache
file (a conversation with a long system prompt, sent a second time, goes to disk) or a
compiled automaton (a new JSON schema), then started again on the same home.

The kill comes either a few milliseconds after the write's temp file appears (it cuts the
write) or just after the finished file does (the next start loads it). Every restart must
come up; no cache file may fail its reader's check (a kill leaves at most a temp file,
which the next start discards); and greedy replies after each restart, and at the end to
every round whose file was left whole, must be the same tokens a server that never
crashed gives. The tuning table is written only on GPUs, so its writer is killed on its
own in test_chaos_writers.py.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from tests.chaos.cache_files import check_caches
from tests.chaos.daemon_process import Daemon


RULES = " ".join(f"Rule {i}: keep function {i} short, name it well, and test it before you commit."
                 for i in range(1, 60))


def conversation(round_no: int) -> dict:
    """A greedy chat with a long system prompt of its own; every third round also a JSON
    schema of its own (a new automaton to compile and write)."""
    body = {"model": "m", "temperature": 0, "max_tokens": 12, "messages": [
        {"role": "system", "content": f"Project {round_no}. You review code. {RULES}"},
        {"role": "user", "content": "Summarize the rules in one line."},
        {"role": "assistant", "content": "Keep functions short, well named and tested."},
        {"role": "user", "content": f"Which rule has the number {round_no + 3}?"}]}
    if writes_automaton(round_no):
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {
            "type": "object", "required": [f"rule_{round_no}"],
            "properties": {f"rule_{round_no}": {"type": "string"}, "number": {"type": "integer"}}}}}
    return body


def writes_automaton(round_no: int) -> bool:
    return round_no % 3 == 2


def reply_text(daemon: Daemon, body: dict) -> str:
    return daemon.post_json("/v1/chat/completions", body)["choices"][0]["message"]["content"]


def kill_around_write(daemon: Daemon, folder: Path, body: dict, rng: random.Random,
                      after: bool) -> str:
    """Send `body` and `kill -9` the daemon a random moment after a new temp file shows up in
    `folder` or, when `after`, just after a new finished file does; what the kill hit:
    "cut" (it left a temp file of its own), "after" (a new file whole) or "other"."""
    done_before, temp_before = _files(folder), set(folder.rglob("*.tmp"))
    request = threading.Thread(target=_send_ignoring_the_kill, args=(daemon, body), daemon=True)
    request.start()
    deadline = time.monotonic() + 300
    while request.is_alive() and time.monotonic() < deadline:
        if (_files(folder) - done_before) if after else (set(folder.rglob("*.tmp")) - temp_before):
            break
        time.sleep(0.001)
    time.sleep(rng.uniform(0, 0.2 if after else 0.03))
    daemon.kill9()
    request.join(timeout=60)
    if set(folder.rglob("*.tmp")) - temp_before:
        return "cut"
    return "after" if _files(folder) - done_before else "other"


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if p.suffix in (".kv", ".index")}


def _send_ignoring_the_kill(daemon: Daemon, body: dict) -> None:
    try:
        reply_text(daemon, body)
    except OSError:
        pass  # the kill cut the request off


def reference_replies(home: Path, rounds: int) -> list[str]:
    """Each round's reply from a server that never crashes (asked twice: cold, then cached)."""
    daemon = Daemon(home).start()
    try:
        replies = []
        for round_no in range(rounds):
            cold, cached = (reply_text(daemon, conversation(round_no)) for _ in range(2))
            assert cold == cached, f"round {round_no}: a cached prefix changed the greedy reply"
            replies.append(cached)
        return replies
    finally:
        daemon.stop()


def _checked_restart(daemon: Daemon, tally: dict) -> None:
    """Check the files the kill left, start the daemon again, and see the temp files go."""
    found = check_caches(daemon.home)
    assert not found.torn, f"torn cache files after a kill: {found.torn}"
    tally["files_checked"] += found.checked
    daemon.start()
    left = list((daemon.home / "cache" / "prompts").rglob("*.tmp"))
    assert not left, f"the restart kept temp files of a cut write: {left}"
    tally["restarts"] += 1


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.timeout(0)  # minutes per round on a CPU
def test_kill_9_while_writing_caches_loses_nothing(tmp_path, request):
    rounds = request.config.getoption("--crash-rounds", 30)
    rng = random.Random(36)
    expected = reference_replies(tmp_path / "reference", rounds)
    daemon = Daemon(tmp_path / "crashing")
    tally = {"restarts": 0, "cut": 0, "after": 0, "other": 0, "files_checked": 0, "mismatches": []}
    written = []  # rounds whose file the kill left whole
    try:
        daemon.start()
        for round_no in range(rounds):
            if round_no:  # the conversation the last kill interrupted, after the restart
                _expect(daemon, round_no - 1, expected, tally)
            body = conversation(round_no)
            if writes_automaton(round_no):
                folder = daemon.home / "cache" / "constraint"
            else:
                folder = daemon.home / "cache" / "prompts"
                reply_text(daemon, body)  # read once: kept in memory; the second send writes it
            hit = kill_around_write(daemon, folder, body, rng, after=rng.random() < 0.4)
            tally[hit] += 1
            if hit == "after":
                written.append(round_no)
            _checked_restart(daemon, tally)
        for round_no in written:  # the files left whole by earlier kills, loaded after later ones
            _expect(daemon, round_no, expected, tally)
        disk_hits = daemon.get_json("/v1/locals/status")["engine"]["extra"].get("prefix_disk_hits")
    finally:
        daemon.stop()
    print(f"\ncrash: {rounds} rounds, {tally['restarts']} restarts came up; kills: {tally['cut']} "
          f"cut a write, {tally['after']} just after one, {tally['other']} elsewhere in the request; "
          f"{tally['files_checked']} cache files checked, 0 torn; {disk_hits} prefixes loaded from "
          f"disk in the last life; {len(tally['mismatches'])} replies differing from a server "
          "that never crashed")
    assert tally["restarts"] == rounds
    assert tally["mismatches"] == []


def _expect(daemon: Daemon, round_no: int, expected: list[str], tally: dict) -> None:
    got = reply_text(daemon, conversation(round_no))
    if got != expected[round_no]:
        tally["mismatches"].append((round_no, got, expected[round_no]))
