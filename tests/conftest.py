"""Shared fixtures: an isolated home dir, no network, the embedded model, a tiny random llama.

On Linux the test process re-executes itself with OpenBLAS preloaded when it is installed
(the same thing the CLI does), so model tests run at the speed users see. Tests marked
`needs_sandbox` skip, with the product's own install advice as the reason, where agents'
commands cannot be confined (no bubblewrap): the README's test command passes on a fresh machine.
"""

from __future__ import annotations

import ipaddress
import socket
import tempfile
from pathlib import Path

import pytest

from locals.engine.load.backend import needs_fast_blas_reexec, reexec_with_fast_blas


def pytest_addoption(parser):
    """Sizes of the long chaos and constraint tests, so a quick look, CI and a full run can differ."""
    group = parser.getgroup("chaos")
    group.addoption("--crash-rounds", type=int, default=30,
                    help="kill -9 rounds of the crash-while-writing test (default 30)")
    group.addoption("--churn-minutes", type=float, default=10.0,
                    help="how long the 64-client churn test runs (default 10)")
    group.addoption("--fuzz-batches", type=int, default=640,
                    help="batches of 8 fuzzed bodies sent to a real daemon (default 640: 5,120 bodies)")
    parser.getgroup("constrain").addoption(
        "--generations", type=int, default=104,
        help="generations a schema or tool choice in tests/constrain's slow property tests (default 104)")


def pytest_configure(config):
    """Re-exec with OpenBLAS preloaded (if installed) before any test imports MLX."""
    if not needs_fast_blas_reexec():
        return
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.stop_global_capturing()  # give the new process the real stdout/stderr
    reexec_with_fast_blas()  # does not return


def pytest_sessionstart(session):
    """Say so first (even under -q) when the model tests run on MLX's bundled BLAS (docs/testing.md)."""
    import sys

    from locals.engine.load.backend import blas_in_use

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and sys.platform == "linux" and blas_in_use() != "openblas":
        reporter.write_line("no OpenBLAS: the model tests run two to three times slower "
                            "(`apt-get install libopenblas0-pthread`, or ./install.sh, installs it)", yellow=True)


def pytest_runtest_setup(item):
    """Skip a `needs_sandbox` test, saying what to install, where no sandbox works."""
    if item.get_closest_marker("needs_sandbox") is None:
        return
    from agents.sandbox import SandboxUnavailable, make_sandbox

    scratch = Path(tempfile.gettempdir())
    try:
        make_sandbox(scratch, scratch)  # the runner's own probe: bubblewrap on Linux, sandbox-exec on macOS
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))


def _is_loopback(address) -> bool:
    host = address[0] if isinstance(address, tuple) else address
    if not isinstance(host, str):
        return True  # unix sockets and the like
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Any connection to a non-loopback address fails the test at once."""
    real_connect = socket.socket.connect

    def guarded(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address):
            raise OSError(f"tests must not reach the network (tried {address!r})")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def locals_home(tmp_path, monkeypatch):
    """Point every locals path (state, cache, logs, config) at a temp dir."""
    home = tmp_path / "locals-home"
    monkeypatch.setenv("LOCALS_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct, loaded once per test session."""
    from locals.engine.load.models import load_model

    return load_model("smollm2")


@pytest.fixture(scope="session")
def tiny_llama(smollm2):
    """A tiny random llama (2 layers, width 64) sharing the embedded model's tokenizer."""
    return make_tiny_llama(smollm2)


def make_tiny_llama(reference, seed: int = 0, layers: int = 2, hidden: int = 64):
    """A LoadedModel with random weights and `reference`'s tokenizer, for fast engine tests."""
    import dataclasses

    import mlx.core as mx
    from mlx_lm.models import llama

    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama", hidden_size=hidden, num_hidden_layers=layers, intermediate_size=2 * hidden,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
        vocab_size=reference.vocab_size, rope_traditional=True, tie_word_embeddings=True,
        max_position_embeddings=2048,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    return dataclasses.replace(reference, model=model, name="tiny-llama", model_id="random",
                               context_length=2048, weights_bytes=0)
