"""A server stopped while its model loads ends cleanly (locals/server/run.py): the loading threads
still inside MLX are let finish their step, an engine already started is stopped, and the process
exits 0, never aborted by MLX ("terminate called without an active exception")."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from locals.server import run


async def test_a_stop_while_loading_lets_the_loading_step_finish():
    finished = threading.Event()

    def load():
        time.sleep(0.3)
        finished.set()

    future = run._in_daemon_thread(load)
    future.cancel()  # the stop: nobody awaits the load any more
    await asyncio.to_thread(run._let_loading_finish, 5.0)
    assert finished.is_set() and not run._LOADERS
    slow = run._in_daemon_thread(time.sleep, 1.0)
    slow.cancel()
    began = time.monotonic()
    await asyncio.to_thread(run._let_loading_finish, 0.2)  # a download may be left behind: bounded
    assert time.monotonic() - began < 0.8 and run._LOADERS
    await asyncio.to_thread(run._let_loading_finish, 5.0)  # (done before this test's loop closes)


@pytest.mark.model
def test_a_real_server_stopped_at_any_moment_of_its_load_exits_cleanly(tmp_path):
    env = {**os.environ, "LOCALS_HOME": str(tmp_path)}
    for delay in (1.6, 2.2, 2.8, 3.2):  # importing, reading the weights, setting the engine up, compiling ahead
        proc = subprocess.Popen([sys.executable, "-m", "locals", "serve", "--port", "18631"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        # 0: stopped cleanly; -SIGTERM: the signal came while Python still imported (a busy machine),
        # before locals handles it, so nothing had started. Never SIGABRT (MLX torn down under a thread).
        assert proc.returncode in (0, -signal.SIGTERM) and "terminate called" not in out, (delay, out[-500:])
