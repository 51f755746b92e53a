"""The Python API's names: pinned, each importable, lazy, typed (docs/api.md)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import melchior
import melchior.mellan
from paths_kit import REPO

ROOT = REPO

MELCHIOR = [
    "Message",
    "Plane",
    "PlaneConfig",
    "Receipt",
    "Runtime",
    "Turn",
    "TurnResult",
    "Unreachable",
    "__version__",
    "call",
    "call_once",
    "connect",
    "load_plane",
    "runtime_for",
]

MELLAN = [
    "AgentCredential",
    "AsyncReceiverClient",
    "AsyncRelayClient",
    "ClientTls",
    "CredentialError",
    "Identity",
    "ReceiverClient",
    "RelayClient",
    "RelayError",
    "TaskEvent",
    "TaskPage",
    "TaskView",
    "TransportError",
    "agent_credential",
]


@pytest.mark.parametrize(
    ("module", "pinned"), [("melchior", MELCHIOR), ("melchior.mellan", MELLAN)]
)
def test_all_is_pinned_and_every_name_imports(module: str, pinned: list[str]) -> None:
    found = importlib.import_module(module)
    assert found.__all__ == pinned  # a change to the API is a change to this list
    for name in pinned:
        value = getattr(found, name)
        assert value is not None
        exec(f"from {module} import {name}", {})  # the statement itself
    assert set(pinned) <= set(dir(found))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        found.nothing_here  # noqa: B018


def test_public_names_are_the_real_ones() -> None:
    from melchior.envelope import Receipt
    from melchior.mellan.client.caller import RelayClient
    from melchior.plane.runner import Plane
    from melchior.runtimes import runtime_for
    from melchior.session.client import connect

    assert melchior.Receipt is Receipt
    assert melchior.Plane is Plane
    assert melchior.runtime_for is runtime_for
    assert melchior.connect is connect
    assert melchior.mellan.RelayClient is RelayClient


def test_importing_the_packages_imports_none_of_their_modules() -> None:
    code = (
        "import sys, melchior, melchior.mellan; "
        "print(sorted(m for m in sys.modules if m.startswith('melchior') or m == 'httpx'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "['melchior', 'melchior.mellan']"


def test_a_mellan_command_loads_no_command_line_of_httpx() -> None:
    """httpx imports its own CLI (click, pygments, rich: a quarter of a command's start-up)
    whenever they are installed, as they are here; importing melchior first keeps it out,
    and httpx still works."""
    code = (
        "import sys\n"
        "import melchior.mellan.commands.agent\n"
        "import httpx\n"
        "assert httpx.Client and httpx.AsyncClient and httpx.Response(200).status_code == 200\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'click', 'pygments', 'rich'}))\n"
        "import melchior.mellan.relay.server.serve\n"  # uvicorn brings click, not the others
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'pygments', 'rich'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["[]", "[]"]
    # the three are installed: without melchior first, httpx does load them
    done = subprocess.run(
        [sys.executable, "-c", "import sys, httpx; print('rich' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "True"


def test_type_hints_ship() -> None:
    assert (ROOT / "src" / "melchior" / "py.typed").is_file()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["melchior"]
    assert (Path(melchior.__file__).parent / "py.typed").is_file()


def test_the_clients_and_the_receiver_do_not_import_the_command_line() -> None:
    """The credential rule and the relay client sit below the CLI: the receiver's
    configuration and status, the MCP bridge's relay caller and the client itself import
    no ``commands`` module (the CLI is flags and printing over them)."""
    code = (
        "import sys\n"
        "import melchior.mellan.receiver.config, melchior.mellan.receiver.status\n"
        "import melchior.integrations.relay_caller, melchior.mellan.client.caller\n"
        "print(sorted(m for m in sys.modules if '.commands' in m))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
