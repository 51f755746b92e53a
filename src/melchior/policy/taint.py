"""The taint window's rule: after a peer's words, only calls known to be harmless run unasked. Pure.

Another agent's message is data, fenced as such, but a model that has read it may still
act on it. So once peer text is in a coding agent's context, every tool call that is not
*known* harmless (:mod:`melchior.policy.harmless`, an allow-list) goes to the operator
first, until the operator's next prompt or the end of the turn
(``melchior.integrations.taint`` keeps that state and does the I/O).

A refusal names what the call would do where that is recognisable — a write outside the
project, a push, a deletion, network egress (:data:`CLASSES`), or one of the operator's
``risky_patterns`` — but those only word the reason: what passes is decided by the
allow-list alone. A risky pattern does one more thing: it wins over the allow-list, so
an operator who lists ``Bash(make *)`` as harmless can still have ``Bash(make deploy*)``
asked.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from melchior.policy import harmless, shell
from melchior.policy.decision import Decision, allow, refuse
from melchior.policy.harmless import Facts

CLASSES: tuple[str, ...] = ("write-outside", "push", "delete", "network")
"""What a refusal names a call as, where it can tell (the rule of the refusal)."""

WEB_TOOLS = frozenset({"WebFetch", "WebSearch", "web_search", "web_fetch"})
"""Tools that reach the network by design."""
RELAY_TOOL = "mcp__*__relay_send"
"""melchior's own relay sender, under whatever name the agent gave the server."""

MAX_DEPTH = 3
"""How deep ``bash -c '…'`` inside ``sh -c '…'`` is looked into to name a refusal."""

_PATTERN = re.compile(r"^([A-Za-z0-9_*?\-]+)(?:\((.*)\))?$", re.DOTALL)
_WRAPPERS = frozenset(
    {"sudo", "doas", "env", "command", "exec", "nohup", "nice", "ionice", "stdbuf", "timeout",
     "xargs", "builtin", "chronic", "unbuffer", "flock", "busybox", "time"}
)  # fmt: skip
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish"})
_NETWORK_PROGRAMS = frozenset(
    {"curl", "wget", "ssh", "scp", "sftp", "nc", "ncat", "netcat", "telnet", "ftp", "socat",
     "http", "https", "xh", "aria2c", "lftp", "mosh", "gh", "glab", "aws", "gcloud", "az"}
)  # fmt: skip
_DELETE_PROGRAMS = frozenset({"rm", "rmdir", "unlink", "shred", "srm", "wipe", "dropdb"})
_WRITE_LAST = frozenset({"cp", "mv", "install", "ln", "rsync"})
_WRITE_ALL = frozenset({"touch", "mkdir", "chmod", "chown", "chgrp", "truncate", "tee"})


class ToolCall(NamedTuple):
    """One tool call as a hook reports it: the harness's tool name and its input."""

    tool: str
    input: Mapping[str, Any]


class Rules(NamedTuple):
    """The operator's additions: risky patterns (always asked) and harmless ones.

    A pattern is ``Tool`` or ``Tool(glob)``, as in Claude Code's permission rules:
    ``Bash(terraform apply*)``, ``mcp__github__*``, ``Write(/etc/*)``. A risky pattern's
    glob is matched against the command line (shell tools), the file path (file tools),
    the URL or query (web tools), or the input as JSON (anything else). A harmless
    pattern for a shell tool is matched against each simple command of the line, its
    words fixed text (``Bash(make test)`` passes ``make test && ls``, never
    ``make test; curl …``).
    """

    patterns: tuple[str, ...] = ()
    harmless: tuple[str, ...] = ()


def parse_pattern(text: str) -> tuple[str, str | None]:
    """``Tool(glob)`` → (tool glob, argument glob or None); ValueError saying why not."""
    if not isinstance(text, str):
        raise ValueError(f"a tool-call pattern is text, got {text!r}")
    m = _PATTERN.match(text.strip())
    if m is None:
        raise ValueError(
            f"{text!r} is not a tool-call pattern; write Tool or Tool(glob), e.g. "
            "'Bash(terraform apply*)' or 'mcp__github__*'"
        )
    return m.group(1), m.group(2)


def rules(patterns: Sequence[str] = (), harmless_patterns: Sequence[str] = ()) -> Rules:
    """Checked rules: a malformed pattern is an error, not ignored."""
    for p in (*patterns, *harmless_patterns):
        parse_pattern(p)
    return Rules(tuple(p.strip() for p in patterns), tuple(p.strip() for p in harmless_patterns))


# -- judging one call -----------------------------------------------------------------------------


def judge(call: ToolCall, rules: Rules, facts: Facts) -> Decision:
    """Known harmless (allowed, the rule saying how) or not (refused, saying why not and,
    where it can tell, what the call would do)."""
    for pattern in rules.patterns:
        if _matches(pattern, call.tool, _subject(call)):
            return refuse("pattern", f"{call.tool} matches the operator's risky pattern {pattern}")

    def operator(tool: str, subject: str) -> bool:
        return any(_matches(p, tool, subject) for p in rules.harmless)

    known = harmless.judge(call.tool, call.input, facts, operator)
    if known.allowed:
        return known
    named = next(classify(call, facts), None)
    if named is None:
        return known
    rule, what = named
    if _SAID[rule] in known.reason.lower():
        return refuse(rule, known.reason)
    return refuse(rule, f"{known.reason}; it {what}")


_SAID = {"write-outside": "outside the project", "push": "push", "delete": "delet",
         "network": "network"}  # fmt: skip
"""What a reason already says when it names the class itself."""


class Needs(NamedTuple):
    """The paths (absolute, as written) and program names a judgement reads."""

    paths: frozenset[str]
    programs: frozenset[str]


V = TypeVar("V")


class _Asking(Mapping[str, V]):
    """Answers from ``known``, and for anything else a stand-in, noting what was asked."""

    def __init__(self, known: Mapping[str, V], stand_in: Callable[[str], V]) -> None:
        self.known = known
        self.stand_in = stand_in
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> V:
        if key in self.known:
            return self.known[key]
        self.asked.add(key)
        return self.stand_in(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.known)

    def __len__(self) -> int:
        return len(self.known)


def needs(call: ToolCall, rules: Rules, facts: Facts) -> Needs:
    """What :func:`judge` would read that ``facts`` does not answer yet.

    The judgement is run with each unanswered path standing for itself and each program
    unfound; the caller resolves what was asked and asks again until nothing is new, so
    a symlink that changes the way through is followed too.
    """
    paths: _Asking[str] = _Asking(facts.resolved, posixpath.normpath)
    programs: _Asking[str | None] = _Asking(facts.programs, lambda _: None)
    judge(call, rules, facts._replace(resolved=paths, programs=programs))
    return Needs(frozenset(paths.asked), frozenset(programs.asked))


def window(
    judged: Decision, *, source: str | None, asked: int, limit: int | None, edited: bool
) -> Decision:
    """Does this call go to the operator? Refused (``taint-window``: ask first) when peer
    text from ``source`` is in the context and the call is not known harmless.

    ``edited``: the project was written since the peer text arrived, so a call that runs
    the project's own code (``project-code``) is no longer known harmless. ``limit``:
    how many calls one window may put to the operator (None: no limit, where they are
    refused rather than asked); past it the call is refused (``taint-limit``) and the
    turn should stop, so peer text can make neither a flood of prompts nor a way around.
    """
    if asked < 0 or (limit is not None and limit < 0):
        raise ValueError("a taint window does not count below zero")
    if source is None:
        return allow("taint-window", "no peer text waits to be vetted before risky calls")
    reason = judged.reason
    if judged.allowed:
        if not (edited and judged.rule == harmless.PROJECT_CODE):
            return allow("taint-window", judged.reason)
        reason = (
            f"{reason}, but the project was edited since the message arrived, and this runs "
            "the project's code"
        )
    if limit is not None and asked >= limit:
        return refuse(
            "taint-limit",
            f"{reason}. Since a message from {source} entered this session's context, "
            f"{asked} call(s) have been put to the operator, the most one message may cause; "
            "this one is refused and the turn stops here",
        )
    return refuse(
        "taint-window",
        f"{reason}. A message from {source} entered this session's context, so until the "
        "operator's next prompt only calls known to be harmless run unasked: a peer's "
        "message never widens what this agent may do",
    )


def _matches(pattern: str, tool: str, subject: str) -> bool:
    tool_glob, arg_glob = parse_pattern(pattern)
    if not fnmatch.fnmatchcase(tool, tool_glob):
        return False
    return arg_glob is None or fnmatch.fnmatchcase(subject, arg_glob)


def _subject(call: ToolCall) -> str:
    """The one string a risky pattern's glob is matched against."""
    inp = call.input
    if call.tool in harmless.SHELL_TOOLS:
        value = harmless.command_text(inp.get("command", inp.get("cmd")))
        return " ".join(value) if isinstance(value, list) else value or ""
    for key in ("file_path", "notebook_path", "url", "query", "path"):
        value = inp.get(key)
        if isinstance(value, str):
            return value
    return json.dumps(inp, sort_keys=True, ensure_ascii=False, default=str)


# -- naming what a refused call would do ----------------------------------------------------------


def classify(call: ToolCall, facts: Facts) -> Iterator[tuple[str, str]]:
    """Every (class, what it does) the call is recognised as, most specific first.

    A net, used only to word a refusal: a call it does not recognise is refused all the
    same when it is not known harmless."""
    tool, inp = call.tool, call.input
    if tool in harmless.SHELL_TOOLS:
        script, _ = harmless.script_of(inp)
        yield from _script_findings(script, facts, 0)
    elif tool in harmless.FILE_TOOLS:
        path = inp.get("file_path", inp.get("notebook_path"))
        if isinstance(path, str) and _outside(path, facts):
            yield "write-outside", f"writes {path}, outside the project {facts.project}"
    elif tool in harmless.PATCH_TOOLS:
        text = next(
            (v for k in ("patch", "input", "command") if isinstance(v := inp.get(k), str)), ""
        )
        for m in re.finditer(
            r"^\*\*\* (Add|Update|Delete) File: (.+)$", text[: shell.MAX_COMMAND], re.M
        ):
            if m.group(1) == "Delete":
                yield "delete", f"deletes {m.group(2).strip()}"
            elif _outside(m.group(2).strip(), facts):
                yield "write-outside", f"writes {m.group(2).strip()}, outside the project"
    elif tool in WEB_TOOLS:
        target = inp.get("url") or inp.get("query") or ""
        yield "network", f"reaches the network ({str(target)[:200]})"
    elif fnmatch.fnmatchcase(tool, RELAY_TOOL):
        yield "network", "sends a task to another machine through the relay"


def _script_findings(script: shell.Script, facts: Facts, depth: int) -> Iterator[tuple[str, str]]:
    for r in script.redirects:
        value = r.target.value if r.target is not None else None
        if value is None or r.op in ("<<", "<<-", "<<<"):
            continue
        if value.startswith(harmless.NETWORK_FILES):
            yield "network", f"opens a network connection ({value})"
        elif not r.op.startswith("<") and not value.startswith("/dev/") and _outside(value, facts):
            yield "write-outside", f"writes {value}, outside the project {facts.project}"
    for command in script.commands:
        words = [w.value if w.value is not None else w.text for w in command.words]
        prog, args = _program(words)
        if prog in _SHELLS or prog == "eval":
            inner = " ".join(args) if prog == "eval" else _inner_script(args)
            if inner is not None and depth < MAX_DEPTH:
                yield from _script_findings(shell.read(inner), facts, depth + 1)
            continue
        if prog:
            yield from _program_findings(prog, args, " ".join([prog, *args])[:200], facts)


def _program(words: list[str]) -> tuple[str, list[str]]:
    """The program a simple command runs (wrappers such as sudo and env skipped) and its args."""
    i = 0
    while i < len(words):
        name = posixpath.basename(words[i])
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[i], re.DOTALL):
            i += 1
        elif name in _WRAPPERS:
            i += 1
            while i < len(words) and (words[i].startswith("-") or words[i].isdigit()):
                if words[i] in ("-u", "-g", "-n", "-s", "-k", "-E", "-C", "-I", "-S"):
                    i += 1
                i += 1
        else:
            return name, words[i + 1 :]
    return "", []


def _inner_script(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a.startswith("-") and "c" in a.lstrip("-") and not a.startswith("--"):
            rest = args[i + 1 :]
            if rest and rest[0] == "--":
                rest = rest[1:]
            return rest[0] if rest else None
    return None


def _subcommand(args: list[str]) -> str:
    """The first argument that is not an option (git -C dir push → push)."""
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in ("-C", "-c", "--git-dir", "--work-tree", "-R", "--repo"):
            skip = True
        elif not a.startswith("-"):
            return a
    return ""


def _program_findings(
    prog: str, args: list[str], shown: str, facts: Facts
) -> Iterator[tuple[str, str]]:
    sub = _subcommand(args)
    flags = set(args)
    if prog == "git":
        if sub in ("push", "send-email"):
            yield "push", f"pushes ('{shown}')"
        if sub in ("clone", "fetch", "pull", "ls-remote", "submodule", "remote"):
            yield "network", f"reaches a remote ('{shown}')"
        if (
            sub in ("rm", "clean", "restore")
            or (sub == "reset" and "--hard" in flags)
            or (sub == "branch" and flags & {"-D", "-d", "--delete"})
            or (sub == "stash" and flags & {"drop", "clear"})
            or (sub == "checkout" and "--" in flags)
        ):
            yield "delete", f"deletes work ('{shown}')"
    if (
        prog in ("gh", "glab")
        and sub in ("pr", "release", "repo", "gist")
        and (flags & {"create", "merge", "upload", "delete", "edit"})
    ):
        yield "push", f"publishes to the forge ('{shown}')"
    if (prog in ("npm", "pnpm", "yarn", "cargo", "poetry", "uv", "gem", "hg") and sub in (
        "publish", "push"
    )) or (prog == "twine" and sub == "upload") or (
        prog in ("docker", "podman", "helm") and sub == "push"
    ):  # fmt: skip
        yield "push", f"publishes ('{shown}')"
    if prog in _NETWORK_PROGRAMS:
        yield "network", f"reaches the network ('{shown}')"
    elif (
        (prog in ("pip", "pip3", "pipx") and sub in ("install", "download"))
        or (prog in ("npm", "pnpm", "yarn", "bun") and sub in ("install", "i", "add", "ci"))
        or (prog == "go" and sub in ("get", "install"))
        or (prog == "cargo" and sub in ("install", "fetch", "update"))
        or (prog in ("docker", "podman") and sub == "pull")
        or (prog == "uv" and sub in ("pip", "add", "sync"))
    ):
        yield "network", f"downloads packages ('{shown}')"
    if prog in _DELETE_PROGRAMS or (prog == "find" and flags & {"-delete", "-exec", "-execdir"}):
        yield "delete", f"deletes files ('{shown}')"
    paths = [a for a in args if not a.startswith("-")]
    targets = (
        paths[-1:] if prog in _WRITE_LAST and len(paths) >= 2
        else paths if prog in _WRITE_ALL
        else [a[3:] for a in args if a.startswith("of=")] if prog == "dd"
        else []
    )  # fmt: skip
    for t in targets:
        if _outside(t, facts):
            yield "write-outside", f"writes {t}, outside the project {facts.project}"
            return


def _outside(path: str, facts: Facts) -> bool:
    """Is ``path`` (relative paths read against the call's directory) outside the project?
    Lexical: only for naming a refusal; what passes is judged on resolved paths."""
    if path == "~" or path.startswith("~/"):
        if facts.home is None:
            return True
        path = facts.home + path[1:]
    elif path.startswith("~") or "$" in path:
        return True
    full = posixpath.normpath(posixpath.join(facts.cwd, path))
    root = posixpath.normpath(facts.project)
    return not (full == root or full.startswith(root.rstrip("/") + "/"))
