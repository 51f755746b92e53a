"""Which tool calls are risky once a peer's words are in an agent's context. Pure.

Another agent's message is data, fenced as such, but a model that has read it may still
act on it. So after peer text enters a coding agent's context, its next few *risky*
tool calls go to the operator first (the taint window; ``melchior.integrations.taint``
keeps the count). This module only judges one call: is it a write outside the project,
a push, a deletion, network egress, or something the operator listed as risky?

It reads the call as the agent's hook system reports it (tool name and input), with
the shell commands split into simple commands, so ``cd x && git push`` and
``bash -c 'rm -rf y'`` are seen for what they do. It is a net, not a sandbox: a
program that deletes or connects on its own (a script, a build) is not recognised,
which is why operators can add their own patterns, and why nothing here ever *allows*
a call that the agent's own permission rules would stop.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from melchior.policy.decision import Decision, allow, refuse

CLASSES: tuple[str, ...] = ("write-outside", "push", "delete", "network")
"""The built-in kinds of risky call, each switchable in the operator's configuration."""

SHELL_TOOLS = frozenset({"Bash", "shell", "exec_command", "local_shell", "unified_exec"})
"""Tools whose input ``command`` is a shell command line (Claude Code's Bash, Codex's)."""
FILE_TOOLS = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit"})
"""Tools that write the file named by ``file_path`` (or ``notebook_path``)."""
PATCH_TOOLS = frozenset({"apply_patch"})
"""Tools whose input is a patch naming the files it adds, updates and deletes."""
WEB_TOOLS = frozenset({"WebFetch", "WebSearch", "web_search", "web_fetch"})
"""Tools that reach the network by design."""
RELAY_TOOL = "mcp__*__relay_send"
"""melchior's own relay sender, under whatever name the agent gave the server."""

MAX_DEPTH = 3
"""How deep ``bash -c '…'`` inside ``sh -c '…'`` is unwrapped."""
MAX_COMMAND = 256 * 1024
"""Longest command line read; the rest of a longer one is judged risky unseen."""

_PATTERN = re.compile(r"^([A-Za-z0-9_*?\-]+)(?:\((.*)\))?$", re.DOTALL)
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "`", "|&", ";;", "{", "}", "$"})
_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", ">&", "<>"})
_KEYWORDS = frozenset({"then", "do", "else", "elif", "if", "while", "until", "!", "time"})
_WRAPPERS = frozenset(
    {"sudo", "doas", "env", "command", "exec", "nohup", "nice", "ionice", "stdbuf", "timeout",
     "xargs", "builtin", "chronic", "unbuffer", "flock"}
)  # fmt: skip
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish", "busybox"})
_HARMLESS_TARGETS = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "/dev/fd/")

_NETWORK_PROGRAMS = frozenset(
    {"curl", "wget", "ssh", "scp", "sftp", "nc", "ncat", "netcat", "telnet", "ftp", "socat",
     "http", "https", "xh", "aria2c", "lftp", "mosh", "gh", "glab", "aws", "gcloud", "az"}
)  # fmt: skip
_DELETE_PROGRAMS = frozenset({"rm", "rmdir", "unlink", "shred", "srm", "wipe", "dropdb"})
_WRITE_LAST = frozenset({"cp", "mv", "install", "ln", "rsync"})
_WRITE_ALL = frozenset({"touch", "mkdir", "chmod", "chown", "chgrp", "truncate", "tee", "rm"})


class ToolCall(NamedTuple):
    """One tool call as a hook reports it: the harness's tool name and its input."""

    tool: str
    input: Mapping[str, Any]


class Rules(NamedTuple):
    """What counts as risky: built-in classes switched on, plus the operator's patterns.

    A pattern is ``Tool`` or ``Tool(glob)``, as in Claude Code's permission rules:
    ``Bash(terraform apply*)``, ``mcp__github__*``, ``Write(/etc/*)``. The glob is
    matched against the command line (shell tools), the file path (file tools), the URL
    or query (web tools), or the input as JSON (anything else).
    """

    classes: frozenset[str] = frozenset(CLASSES)
    patterns: tuple[str, ...] = ()


def parse_pattern(text: str) -> tuple[str, str | None]:
    """``Tool(glob)`` → (tool glob, argument glob or None); ValueError saying why not."""
    if not isinstance(text, str):
        raise ValueError(f"a risky-call pattern is text, got {text!r}")
    m = _PATTERN.match(text.strip())
    if m is None:
        raise ValueError(
            f"{text!r} is not a risky-call pattern; write Tool or Tool(glob), e.g. "
            "'Bash(terraform apply*)' or 'mcp__github__*'"
        )
    return m.group(1), m.group(2)


def rules(classes: Sequence[str] = CLASSES, patterns: Sequence[str] = ()) -> Rules:
    """Checked rules: an unknown class or a malformed pattern is an error, not ignored."""
    unknown = [c for c in classes if c not in CLASSES]
    if unknown:
        raise ValueError(
            f"unknown risky-call class(es) {', '.join(map(repr, unknown))}; the classes are "
            f"{', '.join(CLASSES)}"
        )
    for p in patterns:
        parse_pattern(p)
    return Rules(frozenset(classes), tuple(p.strip() for p in patterns))


# -- judging one call ---------------------------------------------------------------------------


def risk(call: ToolCall, rules: Rules, *, project: str, home: str | None = None) -> Decision:
    """Is ``call`` risky? Refused (risky) naming the class and what it does; else allowed.

    ``project`` is the absolute path of the project's top directory (relative paths are
    read against it); ``home`` expands ``~``.
    """
    for found in _findings(call, project, home):
        rule, what = found
        if rule in rules.classes:
            return refuse(rule, what)
    for pattern in rules.patterns:
        if _matches(pattern, call):
            return refuse("pattern", f"{call.tool} matches the operator's risky pattern {pattern}")
    return allow("not-risky", f"{call.tool}: not a write outside the project, push, deletion "
                 "or network call, and no configured pattern matches")  # fmt: skip


def window(remaining: int, judged: Decision, *, source: str) -> Decision:
    """Does this call go to the operator? Refused ("ask first") when the call is risky and
    the window opened by peer text (``source`` says whose) still has ``remaining`` calls."""
    if remaining < 0:
        raise ValueError("a taint window does not have a negative length")
    if judged.allowed:
        return allow("taint-window", judged.reason)
    if remaining == 0:
        return allow("taint-window", "no peer text waits to be vetted before risky calls")
    return refuse(
        "taint-window",
        f"{judged.reason}. A message from {source} entered this session's context, so the "
        f"next {remaining} risky tool call(s) go to the operator first: a peer's message "
        "never widens what this agent may do",
    )


def _matches(pattern: str, call: ToolCall) -> bool:
    tool_glob, arg_glob = parse_pattern(pattern)
    if not fnmatch.fnmatchcase(call.tool, tool_glob):
        return False
    if arg_glob is None:
        return True
    return fnmatch.fnmatchcase(_subject(call), arg_glob)


def _subject(call: ToolCall) -> str:
    """The one string a pattern's glob is matched against."""
    inp = call.input
    if call.tool in SHELL_TOOLS:
        return _command_text(inp.get("command"))
    for key in ("file_path", "notebook_path", "url", "query", "path"):
        value = inp.get(key)
        if isinstance(value, str):
            return value
    return json.dumps(inp, sort_keys=True, ensure_ascii=False, default=str)


def _command_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        # Codex hands a shell call as an argv list: ["bash", "-lc", "git push"].
        return shlex.join(value)
    return ""


def _findings(call: ToolCall, project: str, home: str | None) -> Iterator[tuple[str, str]]:
    """Every (class, description) the call falls under, most specific first."""
    tool, inp = call.tool, call.input
    if tool in SHELL_TOOLS:
        text = _command_text(inp.get("command"))
        if len(text) > MAX_COMMAND:
            yield from (
                (c, f"a {len(text)}-character command line, too long to read") for c in CLASSES
            )
            return
        yield from _shell_findings(text, project, home, 0)
    elif tool in FILE_TOOLS:
        path = inp.get("file_path", inp.get("notebook_path"))
        if isinstance(path, str) and _outside(path, project, home):
            yield "write-outside", f"{tool} writes {path}, outside the project {project}"
    elif tool in PATCH_TOOLS:
        yield from _patch_findings(_patch_text(inp), project, home)
    elif tool in WEB_TOOLS:
        target = inp.get("url") or inp.get("query") or ""
        yield "network", f"{tool} reaches the network ({str(target)[:200]})"
    elif fnmatch.fnmatchcase(tool, RELAY_TOOL):
        yield "network", f"{tool} sends a task to another machine through the relay"


def _patch_text(inp: Mapping[str, Any]) -> str:
    for key in ("patch", "input", "command"):
        value = inp.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return "\n".join(v for v in value if isinstance(v, str))
    return ""


_PATCH_HEADER = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+)$|^\*\*\* Move to: (.+)$", re.M)


def _patch_findings(text: str, project: str, home: str | None) -> Iterator[tuple[str, str]]:
    for m in _PATCH_HEADER.finditer(text[:MAX_COMMAND]):
        kind, path = (m.group(1), m.group(2)) if m.group(1) else ("Move", m.group(3))
        path = path.strip()
        if kind == "Delete":
            yield "delete", f"apply_patch deletes {path}"
        if _outside(path, project, home):
            yield "write-outside", f"apply_patch writes {path}, outside the project {project}"


# -- shell command lines --------------------------------------------------------------------------


def _tokens(text: str) -> list[str]:
    """Words and operators of a command line; a line shlex cannot read is split plainly."""
    prepared = text.replace("\n", " ; ").replace("`", " ` ")
    lexer = shlex.shlex(prepared, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # an unclosed quote: read it word by word rather than not at all
        return re.findall(r"[;&|()<>`$]+|[^\s;&|()<>`$]+", prepared)


def _simple_commands(tokens: list[str]) -> Iterator[tuple[list[str], list[str]]]:
    """(words, redirect targets) of each simple command, split at the shell's operators."""
    words: list[str] = []
    targets: list[str] = []
    expect_target = False
    for tok in tokens:
        if expect_target:
            targets.append(tok)
            expect_target = False
        elif tok in _REDIRECTS or (tok.endswith((">", ">>")) and tok.rstrip(">").isdigit()):
            expect_target = True
        elif tok in _SEPARATORS or tok.startswith(("&&", "||", ";")):
            if words or targets:
                yield words, targets
            words, targets = [], []
        elif tok in ("<", "<<", "<<<"):
            expect_target = False
        else:
            words.append(tok)
    if words or targets:
        yield words, targets


def _program(words: list[str]) -> tuple[str, list[str]]:
    """The program a simple command runs (wrappers such as sudo and env skipped) and its args."""
    i = 0
    while i < len(words):
        w = words[i]
        name = posixpath.basename(w)
        if w in _KEYWORDS or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w, re.DOTALL):
            i += 1
        elif name in _WRAPPERS:
            i += 1
            # the wrapper's own options and numbers (sudo -u root, timeout 5, nice -n 3)
            while i < len(words) and (words[i].startswith("-") or words[i].isdigit()):
                if words[i] in ("-u", "-g", "-n", "-s", "-k", "-E", "-C", "-I"):
                    i += 1
                i += 1
        else:
            return name, words[i + 1 :]
    return "", []


def _subcommand(args: list[str]) -> str:
    """The first argument that is not an option (git -C dir push → push)."""
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-C", "-c", "--git-dir", "--work-tree", "-R", "--repo"):
            skip = True
            continue
        if not a.startswith("-"):
            return a
    return ""


def _shell_findings(
    text: str, project: str, home: str | None, depth: int
) -> Iterator[tuple[str, str]]:
    for words, targets in _simple_commands(_tokens(text)):
        for target in targets:
            if not target.startswith("&") and _outside(target, project, home):
                yield "write-outside", f"the command writes {target}, outside the project {project}"
        prog, args = _program(words)
        if not prog:
            continue
        shown = " ".join([prog, *args])[:200]
        if prog in _SHELLS or prog == "eval":
            inner = _inner_script(prog, args)
            if inner is not None and depth < MAX_DEPTH:
                yield from _shell_findings(inner, project, home, depth + 1)
            elif inner is not None:
                yield from ((c, f"commands nested more than {MAX_DEPTH} deep") for c in CLASSES)
            continue
        yield from _program_findings(prog, args, shown, project, home)


def _inner_script(prog: str, args: list[str]) -> str | None:
    if prog == "eval":
        return " ".join(args)
    for i, a in enumerate(args):
        if a.startswith("-") and "c" in a.lstrip("-") and not a.startswith("--"):
            return args[i + 1] if i + 1 < len(args) else None
    return None


def _program_findings(
    prog: str, args: list[str], shown: str, project: str, home: str | None
) -> Iterator[tuple[str, str]]:
    sub = _subcommand(args)
    flags = set(args)
    if prog == "git":
        if sub in ("push", "send-email"):
            yield "push", f"'{shown}' pushes"
            if flags & {"--delete", "-d", "--force", "-f", "--mirror", "--prune"}:
                yield "delete", f"'{shown}' deletes or overwrites remote history"
        if sub in ("clone", "fetch", "pull", "push", "ls-remote", "submodule", "remote"):
            yield "network", f"'{shown}' reaches a remote"
        if (
            sub in ("rm", "clean")
            or (sub == "reset" and "--hard" in flags)
            or (sub == "branch" and flags & {"-D", "-d", "--delete"})
            or (sub == "stash" and flags & {"drop", "clear"})
            or (sub == "checkout" and "--" in flags)
            or (sub == "restore")
        ):
            yield "delete", f"'{shown}' deletes work"
    if (
        prog in ("gh", "glab")
        and sub in ("pr", "release", "repo", "gist")
        and (flags & {"create", "merge", "upload", "delete", "edit"})
    ):
        yield "push", f"'{shown}' publishes to the forge"
    if (prog in ("npm", "pnpm", "yarn", "cargo", "poetry", "uv", "gem", "hg") and sub in (
        "publish", "push"
    )) or (prog == "twine" and sub == "upload") or (
        prog in ("docker", "podman", "helm") and sub == "push"
    ):  # fmt: skip
        yield "push", f"'{shown}' publishes"
    if prog in _NETWORK_PROGRAMS:
        yield "network", f"'{shown}' reaches the network"
    elif prog == "rsync" and any(":" in a and not a.startswith("-") for a in args):
        yield "network", f"'{shown}' copies to or from another host"
    elif (
        (prog in ("pip", "pip3", "pipx") and sub in ("install", "download"))
        or (prog in ("npm", "pnpm", "yarn", "bun") and sub in ("install", "i", "add", "ci"))
        or (prog == "go" and sub in ("get", "install"))
        or (prog == "cargo" and sub in ("install", "fetch", "update"))
        or (prog in ("docker", "podman") and sub == "pull")
        or (prog == "uv" and sub in ("pip", "add", "sync"))
    ):
        yield "network", f"'{shown}' downloads packages"
    if prog in _DELETE_PROGRAMS or (prog == "find" and flags & {"-delete", "-exec", "-execdir"}):
        yield "delete", f"'{shown}' deletes files"
    if (prog in ("docker", "podman") and sub in ("rm", "rmi", "prune")) or (prog == "truncate"):
        yield "delete", f"'{shown}' deletes"
    yield from _write_targets(prog, args, shown, project, home)


def _write_targets(
    prog: str, args: list[str], shown: str, project: str, home: str | None
) -> Iterator[tuple[str, str]]:
    paths = [a for a in args if not a.startswith("-")]
    targets: list[str] = []
    if prog in _WRITE_LAST and len(paths) >= 2:
        targets = [paths[-1]]
    elif prog in _WRITE_ALL:
        targets = paths
    elif prog == "sed" and any(a.startswith("-i") or a == "--in-place" for a in args):
        targets = paths[1:]
    elif prog == "dd":
        targets = [a[3:] for a in args if a.startswith("of=")]
    for t in targets:
        if _outside(t, project, home):
            yield "write-outside", f"'{shown}' writes {t}, outside the project {project}"
            return


def _outside(path: str, project: str, home: str | None) -> bool:
    """Is ``path`` (relative paths read against the project) outside ``project``?"""
    if not path or path.startswith(_HARMLESS_TARGETS):
        return False
    if path == "~" or path.startswith("~/"):
        if home is None:
            return True
        path = home + path[1:]
    elif path.startswith("~"):
        return True  # another user's home
    if "$" in path:
        return True  # an expansion we cannot see through
    full = posixpath.normpath(posixpath.join(project, path))
    root = posixpath.normpath(project)
    return not (full == root or full.startswith(root.rstrip("/") + "/"))
