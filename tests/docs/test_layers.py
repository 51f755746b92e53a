"""The layers of docs/architecture.md are a contract ``make lint`` checks (import-linter).

The contract is the ``[tool.importlinter]`` table of pyproject.toml, run here as
``make lint`` runs it (the ``lint-imports`` command), over a copy of the package tree:
kept as the tree is, and broken, naming its contract and the import, once one module of
the copy is given an import that points up a layer (or across a rule the doc states).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from paths_kit import REPO

ROOT = REPO
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contracts over the package tree under ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(tree / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of src/melchior and pyproject.toml: what the contract reads, nothing else."""
    root = tmp_path_factory.mktemp("layers")
    shutil.copytree(
        ROOT / "src" / "melchior",
        root / "src" / "melchior",
        ignore=shutil.ignore_patterns("__pycache__", "static", "templates", "*.lua", "*.ts"),
    )
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_tree_as_it_is_keeps_every_contract(tree: Path) -> None:
    result = lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
    for contract in ("melchior's layers", "mellan's layers", "no cycles among the relay"):
        assert contract in result.stdout


UPWARD = [
    # (module given the import, the import, the broken contract's message)
    (
        "runtimes/provider.py",
        "from melchior.plane import verbs",
        "melchior.runtimes is not allowed to import melchior.plane",
    ),
    (
        "tool.py",
        "from melchior.plane import verbs",
        "melchior.tool is not allowed to import melchior.plane",
    ),
    (
        "wire/codec.py",
        "from melchior import envelope",
        "melchior.wire is not allowed to import melchior.envelope",
    ),
    (
        "mellan/relay/store/base.py",
        "from melchior.mellan.relay.server import serve",
        "melchior.mellan.relay.store is not allowed to import melchior.mellan.relay.server",
    ),
    (
        "mellan/client/leases.py",
        "from melchior.mellan.relay import auth",
        "melchior.mellan.client is not allowed to import melchior.mellan.relay",
    ),
    (
        "mellan/relay/auth.py",
        "from melchior.mellan.commands import relay",
        "melchior.mellan.relay is not allowed to import melchior.mellan.commands",
    ),
    (
        "integrations/bridge.py",
        "from melchior.mellan.relay.store import base",
        "melchior.integrations is not allowed to import melchior.mellan.relay",
    ),
    ("policy/walls.py", "import sqlite3", "melchior.policy is not allowed to import sqlite3"),
    (
        "mellan/relay/refusals.py",
        "from melchior.mellan.relay.surfaces import http",
        "No cycles are allowed",
    ),
]


@pytest.mark.parametrize(("module", "line", "message"), UPWARD)
def test_an_import_that_points_up_breaks_the_contract(
    tree: Path, module: str, line: str, message: str
) -> None:
    path = tree / "src" / "melchior" / module
    before = path.read_text(encoding="utf-8")
    try:
        path.write_text(f"{before}\n{line}  # an upward import\n", encoding="utf-8")
        result = lint(tree)
    finally:
        path.write_text(before, encoding="utf-8")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert message in " ".join(result.stdout.split()), result.stdout  # unwrapped
