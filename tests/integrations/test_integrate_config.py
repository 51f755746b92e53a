"""``melchior integrate``: the configuration it writes, merged into what is already there.

The shapes themselves are checked against the real CLIs in test_integrate_real_clis.py;
here, without them: what is printed and written, that running it twice changes
nothing, that other servers and hooks survive, and that a setting it would have to
overwrite stops it with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from melchior.integrations import integrate as plans
from paths_kit import REPO

BASE = ["/opt/bin/melchior"]


def melchior(
    *args: str, home: Path, cwd: Path | None = None, path: str = ""
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CODEX_HOME",)}
    env.update(HOME=str(home), PATH=path or os.path.dirname(sys.executable))
    return subprocess.run(
        [sys.executable, "-m", "melchior.cli", "integrate", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or home,
        timeout=60,
        check=False,
    )


def test_print_shows_the_exact_configuration_and_writes_nothing(tmp_path: Path) -> None:
    out = melchior("claude-code", "--print", home=tmp_path)
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[1]
    assert first.startswith("claude mcp add -s user melchior -- ")
    assert first.endswith(" mcp")
    settings = json.loads(out.stdout[out.stdout.index("{") :])
    assert set(settings["hooks"]) == {"UserPromptSubmit", "PreToolUse", "PostToolUse", "Stop"}
    assert settings["hooks"]["PreToolUse"][0]["matcher"] == "*"
    assert settings["hooks"]["Stop"][0]["hooks"][0]["command"].endswith(" hook Stop")
    assert not (tmp_path / ".claude").exists()

    out = melchior("codex", "--print", "--as", "local/codex", home=tmp_path)
    assert out.returncode == 0, out.stderr
    toml_part = out.stdout.split("# the hooks")[0]
    data = tomllib.loads(
        "\n".join(line for line in toml_part.splitlines() if not line.startswith("#"))
    )
    assert data["features"]["hooks"] is True
    assert data["notify"][-3:] == ["hook", "notify", "--agent=codex"]
    server = data["mcp_servers"]["melchior"]
    assert server["args"][-3:] == ["mcp", "--as", "local/codex"]
    assert server["default_tools_approval_mode"] == "approve"
    assert "XDG_RUNTIME_DIR" in server["env_vars"]
    assert "MAGI_MELCHIOR_ID" in server["env_vars"]
    assert "--agent=codex" in out.stdout
    assert "/hooks" in out.stdout
    assert not (tmp_path / ".codex").exists()


def test_codex_config_is_merged_kept_and_idempotent(tmp_path: Path) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    original = 'model = "o5"\n\n[features]\nweb = true\n\n[mcp_servers.other]\ncommand = "x"\n'
    (home / "config.toml").write_text(original)
    (home / "hooks.json").write_text(
        json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "mine.sh"}]}]}})
    )
    out = melchior("codex", "--codex-home", str(home), home=tmp_path)
    assert out.returncode == 0, out.stderr
    data = tomllib.loads((home / "config.toml").read_text())
    assert data["model"] == "o5"
    assert data["features"] == {"web": True, "hooks": True}
    assert data["mcp_servers"]["other"] == {"command": "x"}
    assert "melchior" in data["mcp_servers"]
    assert data["notify"][-3:] == ["hook", "notify", "--agent=codex"]
    hooks = json.loads((home / "hooks.json").read_text())["hooks"]
    assert hooks["Stop"][0]["hooks"][0]["command"] == "mine.sh"
    assert hooks["Stop"][1]["hooks"][0]["command"].endswith("hook Stop --agent=codex")

    before = {p.name: p.read_text() for p in home.iterdir()}
    again = melchior("codex", "--codex-home", str(home), home=tmp_path)
    assert again.returncode == 0
    assert "wrote" not in again.stdout
    assert {p.name: p.read_text() for p in home.iterdir()} == before


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ('notify = ["my-notifier"]\n', "another notify program"),
        ("[features]\nhooks = false\n", "switches hooks off"),
        ('[mcp_servers.melchior]\ncommand = "elsewhere"\n', "different [mcp_servers.melchior]"),
        ("model = [\n", "not valid TOML"),
    ],
)
def test_codex_settings_of_the_user_are_never_overwritten(
    tmp_path: Path, config: str, why: str
) -> None:
    home = tmp_path / "codex"
    home.mkdir()
    (home / "config.toml").write_text(config)
    out = melchior("codex", "--codex-home", str(home), home=tmp_path)
    assert out.returncode == 1
    assert why in out.stderr
    assert (home / "config.toml").read_text() == config
    assert not (home / "hooks.json").exists()


def test_top_level_notify_lands_above_the_first_table() -> None:
    text = plans.merge_codex_config('# mine\n[profiles.fast]\nmodel = "x"\n', "melchior", BASE, [])
    data = tomllib.loads(text)
    assert "notify" in data
    assert "notify" not in data["profiles"]["fast"]
    assert text.startswith("# mine\nnotify = ")


def test_hook_merge_replaces_only_our_entries() -> None:
    theirs = {"matcher": "Bash", "hooks": [{"type": "command", "command": "audit.sh"}]}
    old_ours = {"hooks": [{"type": "command", "command": "/old/venv/bin/melchior hook PreToolUse"}]}
    existing = {"model": "x", "hooks": {"PreToolUse": [theirs, old_ours]}}
    ours = plans.hook_settings(plans.hook_commands(BASE, "claude-code", "melchior"))
    merged = plans.merge_hooks(existing, ours, BASE)
    assert merged["model"] == "x"
    pre = merged["hooks"]["PreToolUse"]
    assert pre[0] == theirs
    assert len(pre) == 2
    assert pre[1]["hooks"][0]["command"] == "/opt/bin/melchior hook PreToolUse"
    assert plans.merge_hooks(merged, ours, BASE) == merged
    named = plans.hook_commands(BASE, "codex", "peers")
    assert named["Stop"] == "/opt/bin/melchior hook Stop --agent=codex --server=peers"


def test_claude_scopes_and_a_missing_claude_cli(tmp_path: Path) -> None:
    home, proj = tmp_path / "home", tmp_path / "proj"
    proj.mkdir()
    for scope, path in (
        ("user", home / ".claude" / "settings.json"),
        ("project", proj / ".claude" / "settings.json"),
        ("local", proj / ".claude" / "settings.local.json"),
    ):
        plan = plans.claude_plan(
            scope=scope, home=home, cwd=proj, name="melchior", mcp_args=[], base=BASE
        )
        assert plan.files[0][0] == path
        assert plan.commands[1][:6] == ("claude", "mcp", "add", "-s", scope, "melchior")
    out = melchior("claude-code", home=home, cwd=proj, path="/nonexistent")
    assert out.returncode == 1
    assert "claude CLI is not on PATH" in out.stderr
    assert not (home / ".claude").exists()  # nothing half-written
    bad = melchior("claude-code", "--name", "x y", "--print", home=home, cwd=proj)
    assert bad.returncode == 2


def test_the_docs_show_what_integrate_writes() -> None:
    import re

    from melchior.integrations.settings import parse

    doc = (REPO / "docs" / "integrations.md").read_text()
    base = ["/abs/path/to/melchior"]
    blocks = re.findall(r"```(\w+)\n(.*?)```", doc, re.S)
    jsons = [json.loads(b) for lang, b in blocks if lang == "json" and '"hooks"' in b]
    assert jsons == [plans.hook_settings(plans.hook_commands(base, "claude-code", "melchior"))]
    tomls = [tomllib.loads(b) for lang, b in blocks if lang == "toml"]
    assert tomls[0] == tomllib.loads("\n".join(plans.codex_fragments("melchior", base, [])))
    settings = parse(
        next(b for lang, b in blocks if lang == "toml" and "[melchior.mcp]" in b), "demo"
    )
    assert settings.taint_calls == 20
    assert "Bash(terraform apply*)" in settings.rules.patterns
    assert "Bash(make lint)" in settings.rules.harmless
