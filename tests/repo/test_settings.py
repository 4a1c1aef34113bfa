"""The one settings surface: every LOCALS_* variable declared once, typed, documented from
its declaration, handed to a background server, and read nowhere else."""

import re

import pytest

from locals import settings
from locals.errors import LocalsError

from tests.helpers.repo import REPO

CODE = [p for d in ("locals", "agents", "integrations") for p in (REPO / d).rglob("*.py")]
# Besides the settings module: places that build the environment of a child process (or of
# MLX, which reads its kernel cache folder from this process's environment).
CHILD_ENVIRONMENTS = {"locals/engine/load/backend.py", "locals/service.py", "locals/traffic/servers.py",
                      "agents/sandbox.py", "integrations/launcher.py"}


def test_every_locals_variable_in_the_code_is_declared():
    declared = {s.name for s in settings.ALL}
    used = set()
    for path in CODE:
        used |= set(re.findall(r"\bLOCALS_[A-Z_]+\b", path.read_text()))
    used -= {"LOCALS_URL"}  # the docs' client examples read it, not locals
    assert used <= declared, sorted(used - declared)


def test_only_the_settings_module_reads_the_environment():
    readers = {str(p.relative_to(REPO)) for p in CODE if "os.environ" in p.read_text() or "os.getenv" in p.read_text()}
    assert readers <= {"locals/settings.py"} | CHILD_ENVIRONMENTS, sorted(readers - CHILD_ENVIRONMENTS)
    for name in CHILD_ENVIRONMENTS:  # and there only to copy it for a child
        for line in (REPO / name).read_text().splitlines():
            if "os.environ" in line:
                assert re.search(r"dict\(os\.environ|os\.environ\[\"MLX_(PTX_CACHE_DIR|CUDA_GRAPH_CACHE_SIZE|USE_CUDA_GRAPHS)\"\] =|\*\*os\.environ|"
                                 r"os\.environ if", line), line


def test_the_docs_table_is_the_declarations():
    text = (REPO / "docs" / "how-it-works.md").read_text()
    assert settings.markdown_table() in text


def test_values_parse_by_type_and_bad_ones_name_the_variable(monkeypatch):
    monkeypatch.setenv("LOCALS_MAX_BATCH", "12")
    monkeypatch.setenv("LOCALS_SPECULATE", "Off")
    assert settings.MAX_BATCH.get() == 12 and settings.SPECULATE.get() is False
    monkeypatch.delenv("LOCALS_SPECULATE")
    assert settings.SPECULATE.get() is True
    monkeypatch.setenv("LOCALS_MAX_BATCH", "lots")
    with pytest.raises(LocalsError, match="LOCALS_MAX_BATCH='lots'"):
        settings.MAX_BATCH.get()
    monkeypatch.setenv("LOCALS_KERNELS", "maybe")
    with pytest.raises(LocalsError, match="LOCALS_KERNELS"):
        settings.KERNELS.get()
    # A number that parses but means nothing is refused too, not left to hang every request.
    for name, value in (("LOCALS_MAX_BATCH", "0"), ("LOCALS_KV_BUDGET_MB", "-5"), ("LOCALS_KV_BUDGET_MB", "nan")):
        monkeypatch.setenv(name, value)
        with pytest.raises(LocalsError, match=f"{name}='{value}': must be at least"):
            next(s for s in settings.ALL if s.name == name).get()
    monkeypatch.setenv("LOCALS_PREFIX_CACHE_MB", "0")  # off: a meaning of its own
    assert settings.PREFIX_CACHE_MB.get() == 0


def test_a_background_server_gets_every_setting_that_is_set(monkeypatch):
    for s in settings.ALL:
        monkeypatch.delenv(s.name, raising=False)
    monkeypatch.setenv("LOCALS_MAX_BATCH", "3")
    monkeypatch.setenv("LOCALS_BLAS_REEXEC", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    passed = settings.passed_to_daemon()
    assert passed["LOCALS_MAX_BATCH"] == "3" and passed["HF_HUB_OFFLINE"] == "1"
    assert "LOCALS_BLAS_REEXEC" not in passed  # the re-exec marker stays with its process
