"""DESIGN.md's import rules, enforced by walking every module's AST."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.repo import REPO

HEAVY = ("mlx", "mlx_lm", "outlines_core")
CLIENT_SIDE_ALLOWED = {"locals", "locals.client", "locals.config", "locals.protocol", "locals.errors", "locals.settings"}
# The engine's rooms, lowest first: a module imports only its own room and the rooms before it
# (the loop files at the top of locals/engine/ come last). docs/architecture.md describes each.
ROOMS = ("constrain", "load", "kernels", "forward", "rows", "cache")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names if node.module == "locals"]
    return names


def _modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def _top(name: str) -> str:
    return name.split(".")[0]


def test_only_the_engine_imports_mlx():
    offenders = []
    for package in ("locals", "agents", "integrations"):
        for path in _modules(package):
            if path.is_relative_to(REPO / "locals" / "engine"):
                continue
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in _imports(path) if _top(n) in HEAVY]
    assert not offenders, offenders


def test_engine_never_imports_server_agents_or_integrations():
    bad = ("locals.server", "locals.cli", "locals.daemon", "agents", "integrations")
    offenders = [f"{p.relative_to(REPO)}: {n}" for p in _modules("locals/engine")
                 for n in _imports(p) if n.startswith(bad)]
    assert not offenders, offenders


def test_agents_and_integrations_use_only_the_client_surface():
    offenders = []
    for package in ("agents", "integrations"):
        for path in _modules(package):
            for name in _imports(path):
                if _top(name) == "locals" and name not in CLIENT_SIDE_ALLOWED and not any(
                        name.startswith(a + ".") for a in CLIENT_SIDE_ALLOWED - {"locals"}):
                    offenders.append(f"{path.relative_to(REPO)}: {name}")
    assert not offenders, offenders


def test_nothing_under_locals_imports_agents_or_integrations_except_the_cli():
    offenders = []
    for path in _modules("locals"):
        if path.is_relative_to(REPO / "locals" / "cli"):
            continue
        offenders += [f"{path.relative_to(REPO)}: {n}" for n in _imports(path)
                      if _top(n) in ("agents", "integrations")]
    assert not offenders, offenders


def test_server_reaches_the_engine_only_through_its_facade():
    allowed = {"locals.engine"}
    offenders = [f"{p.relative_to(REPO)}: {n}" for p in _modules("locals/server")
                 for n in _imports(p) if n.startswith("locals.engine") and n not in allowed]
    assert not offenders, offenders


def _room(module: str) -> int:
    """The rank of an engine module's room; the loop files and the facade rank above every room."""
    parts = module.split(".")
    return ROOMS.index(parts[2]) if len(parts) >= 3 and parts[2] in ROOMS else len(ROOMS)


def test_engine_rooms_import_in_one_direction():
    offenders = []
    for path in _modules("locals/engine"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for name in _imports(path):
            if name.startswith("locals.engine.") and _room(name) > _room(module):
                offenders.append(f"{path.relative_to(REPO)}: {name}")
    assert not offenders, offenders


def test_every_engine_module_lives_in_a_room_or_is_a_loop_file():
    loop_files = {"__init__", "engine", "inbox", "scheduler", "step", "settings", "assemble", "admission", "stats",
                  "warmup", "kernel_setup", "bench"}
    top = {p.stem for p in (REPO / "locals" / "engine").glob("*.py")}
    assert top <= loop_files, sorted(top - loop_files)
    rooms = {p.name for p in (REPO / "locals" / "engine").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(ROOMS), rooms


def test_the_traffic_benchmark_is_only_a_client_of_servers():
    """locals/traffic measures servers over HTTP from a process that loads no model."""
    bad = ("locals.engine", "locals.server", "locals.cli", "locals.daemon")
    offenders = [f"{p.relative_to(REPO)}: {n}" for p in _modules("locals/traffic")
                 for n in _imports(p) if n.startswith(bad) or _top(n) in HEAVY]
    assert not offenders, offenders


def test_the_rules_see_a_violation(tmp_path):
    """The walker itself works: a planted import is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("import mlx.core as mx\nfrom locals.server import app\n")
    assert _imports(bad) == ["mlx.core", "locals.server"]


def test_a_test_module_imports_helpers_never_another_test_module():
    """Shared test code lives in tests/helpers/ (or a folder's own non-test module), so a test
    file can move or be run alone without breaking another."""
    offenders = []
    for path in sorted([*REPO.glob("tests/**/*.py"), *REPO.glob("e2e/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offenders += [f"{path.relative_to(REPO)} imports {n}" for n in names
                          if (n.startswith(("tests.", "e2e.")) or "." not in n)
                          and n.rsplit(".", 1)[-1].startswith(("test_", "conftest"))]
    assert not offenders, "\n".join(offenders)
