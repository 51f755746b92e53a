"""``melchior integrate pi``: the plane's extension for pi, where pi looks for it.

What it writes (the shipped TypeScript as it is, and ``melchior.json`` naming this
melchior), where (``$PI_CODING_AGENT_DIR``, ``~/.pi/agent``, or the project's
``.pi``), that running it twice changes nothing and that someone else's extension under
our name is never overwritten; and the extension itself type-checked, strict, against
the newest pi's own declarations (the TypeScript compiler pinned in scripts/cli-pins).
The extension at work in a real pi, in a plane, is tests/integrations/test_integrate_real_clis.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clis_kit import need
from melchior.integrations import integrate as plans

BASE = ["/opt/bin/melchior"]


def integrate(
    *args: str, home: Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "PI_CODING_AGENT_DIR"}
    full.update(HOME=str(home), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "melchior.cli", "integrate", "pi", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd or home,
        timeout=60,
        check=False,
    )


def test_it_writes_the_shipped_extension_and_how_to_run_melchior(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    out = integrate(home=home)
    assert out.returncode == 0, out.stderr
    folder = home / ".pi" / "agent" / "extensions" / "melchior"
    shipped = Path(plans.__file__).parent / "pi_extension" / "index.ts"
    assert (folder / "index.ts").read_bytes() == shipped.read_bytes()
    saved = json.loads((folder / "melchior.json").read_text())
    assert saved == {"command": plans.melchior_command()}
    assert Path(saved["command"][0]).is_file()  # an absolute path pi's tools can run
    assert f"wrote {folder / 'index.ts'}" in out.stdout
    again = integrate(home=home)
    assert again.returncode == 0
    assert "wrote" not in again.stdout  # nothing changed, nothing written


def test_where_it_goes(tmp_path: Path) -> None:
    home, proj, agent = tmp_path / "home", tmp_path / "proj", tmp_path / "pi-agent"
    home.mkdir()
    proj.mkdir()
    out = integrate(home=home, env={"PI_CODING_AGENT_DIR": str(agent)})
    assert out.returncode == 0, out.stderr
    assert (agent / "extensions" / "melchior" / "index.ts").is_file()
    out = integrate("--scope", "project", "--name", "plane", home=home, cwd=proj)
    assert out.returncode == 0, out.stderr
    assert (proj / ".pi" / "extensions" / "plane" / "melchior.json").is_file()
    bad = integrate("--scope", "local", home=home)
    assert bad.returncode == 1
    assert bad.stderr.strip() == "melchior integrate: for pi the scope is one of user, project"


def test_print_writes_nothing(tmp_path: Path) -> None:
    out = integrate("--print", home=tmp_path)
    assert out.returncode == 0, out.stderr
    folder = tmp_path / ".pi" / "agent" / "extensions" / "melchior"
    assert f"{folder / 'index.ts'}: the extension shipped with melchior" in out.stdout
    body = out.stdout[out.stdout.index("{") : out.stdout.rindex("}") + 1]
    assert json.loads(body) == {"command": plans.melchior_command()}
    assert not (tmp_path / ".pi").exists()


def test_someone_else_s_extension_under_our_name_is_kept(tmp_path: Path) -> None:
    folder = tmp_path / ".pi" / "agent" / "extensions" / "melchior"
    folder.mkdir(parents=True)
    (folder / "index.ts").write_text("export default function () {}\n")
    out = integrate(home=tmp_path)
    assert out.returncode == 1
    assert "is another extension, not melchior's" in out.stderr
    assert (folder / "index.ts").read_text() == "export default function () {}\n"
    assert not (folder / "melchior.json").exists()


def test_the_plan_names_its_files() -> None:
    plan = plans.pi_plan(
        scope="user", env={}, home=Path("/h"), cwd=Path("/p"), name="melchior", base=BASE
    )
    (index, source), (config, command) = plan.files
    assert index == Path("/h/.pi/agent/extensions/melchior/index.ts")
    assert plans.PI_MARK in source
    assert config == index.with_name("melchior.json")
    assert json.loads(command) == {"command": BASE}
    with pytest.raises(plans.IntegrateError, match="scope is one of user, project"):
        plans.pi_plan(scope="local", env={}, home=Path("/h"), cwd=Path("/p"), name="m", base=BASE)


def test_the_extension_type_checks_against_pi_s_own_types(tmp_path: Path) -> None:
    tsc = need("typescript")
    pi_modules = Path(need("pi")).parent.parent  # node_modules/.bin/pi
    pi_types = pi_modules / "@mariozechner" / "pi-coding-agent"
    source = Path(plans.__file__).parent / "pi_extension" / "index.ts"
    config = {
        "compilerOptions": {
            "strict": True,
            "noEmit": True,
            "target": "ES2022",
            "module": "ESNext",
            "moduleResolution": "Bundler",
            "skipLibCheck": True,
            "types": ["node"],
            "typeRoots": [str(pi_modules / "@types")],
            # what pi's loader aliases for an extension, resolved to the packages it ships
            "paths": {
                "@sinclair/typebox": [str(pi_modules / "typebox")],
                "@mariozechner/pi-coding-agent": [str(pi_types)],
            },
        },
        "files": [str(source)],
    }  # fmt: skip
    (tmp_path / "tsconfig.json").write_text(json.dumps(config))
    done = subprocess.run(
        [tsc, "-p", str(tmp_path / "tsconfig.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
