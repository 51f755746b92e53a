"""Which tool calls are known to be harmless: the taint window's allow-list. Pure.

After another agent's words reach a model, a tool call runs without the operator only
when it is *known* harmless: a read-only tool, a write inside the project (symlinks
followed), or a shell command line that parses completely into simple commands from a
read-only set. Everything else — a wrapper, an interpreter given code, a program this
list does not name, an option that makes a listed program write or run something, a
redirect outside the project, a line that does not parse — is not known harmless, and
the window puts it to the operator. A list of dangerous things would always miss one;
this list names what is allowed, and the operator can extend it.

What it cannot know: a program in the list that runs the project's own code (a test
runner) does whatever that code does. So ``pytest`` counts only inside the project and
is marked ``project-code``, and the window asks for it once the project has been edited
since the peer's words arrived (:func:`melchior.policy.taint.window`).

Paths and programs arrive already resolved (:class:`Facts`): the caller asks
:func:`melchior.policy.taint.needs` which ones the judgement reads, resolves them
(``os.path.realpath``, the agent's ``PATH``) and hands the answers in, as
``policy/allowlist.py`` takes its paths.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from melchior.policy import shell
from melchior.policy.decision import Decision, allow, refuse

READ_ONLY = "read-only"
PROJECT_WRITE = "project-write"
PROJECT_CODE = "project-code"
OPERATOR = "operator"
NOT_HARMLESS = "not-known-harmless"

SHELL_TOOLS = frozenset({"Bash", "shell", "exec_command", "local_shell", "unified_exec"})
"""Tools whose input (``command`` or ``cmd``) is a command line or an argv list."""
FILE_TOOLS = frozenset({"Write", "Edit", "MultiEdit", "NotebookEdit"})
"""Tools that write the file named by ``file_path`` (or ``notebook_path``)."""
PATCH_TOOLS = frozenset({"apply_patch"})
"""Tools whose input is a patch naming the files it adds, updates and deletes."""

READ_TOOLS = frozenset(
    {"Read", "Grep", "Glob", "LS", "NotebookRead", "ToolSearch", "ListAgents", "CronList",
     "TodoRead", "TodoWrite", "BashOutput", "AskUserQuestion", "ExitPlanMode",
     "view_image", "request_user_input", "get_goal"}
)  # fmt: skip
"""Claude Code's and Codex's tools that only read, or only talk to the operator."""
READ_VERBS = frozenset({"who", "status", "task", "inbox", "relay_agents", "relay_get"})
"""The bridge's own tools that only read (``mcp__<server>__<verb>``)."""

CONTROL = frozenset({".git", ".claude", ".codex", ".mcp.json", ".envrc"})
"""Names inside the project that git, the coding agents or direnv run or load on their own
(hooks, configuration, MCP servers): a write there is never known harmless."""
SINKS = ("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty")
"""Write targets that are not files."""
NETWORK_FILES = ("/dev/tcp/", "/dev/udp/")
"""Names bash itself turns into network connections when redirected to or from."""
SAFE_ENV = frozenset({"LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "NO_COLOR", "COLUMNS"})
"""Variables a command may be given on its own line (``LC_ALL=C grep …``)."""
MAX_CWDS = 16
"""Most working directories a line's ``cd`` commands may lead to; more is not read."""
MAX_ARGV = 64
"""Longest argv list (Codex's ``["bash", "-lc", …]`` form) read."""
MAX_PATH = 4096

BUILTINS = frozenset({"echo", "pwd", "true", "false", "test", "[", ":"})
"""Shell builtins that only print or test (``cd`` and ``printf`` are read separately)."""


class Program(NamedTuple):
    """A read-only program, and the options that would make it write or run something.

    An entry ``--name`` matches ``--name`` and ``--name=…``; ``-x`` the letter x in any
    cluster of short options; anything else the word exactly (``find -exec``). A program
    with such options must have fixed words (no ``$x`` or glob that could become one);
    ``operands`` bounds how many non-option words it may take (``uniq in out`` writes).
    """

    refused: tuple[str, ...] = ()
    operands: int | None = None


READ_PROGRAMS: Mapping[str, Program] = {
    **{name: Program() for name in (
        "ls", "cat", "head", "tail", "wc", "grep", "egrep", "fgrep", "diff", "cmp", "comm",
        "cut", "tr", "nl", "fold", "column", "paste", "basename", "dirname", "realpath",
        "readlink", "stat", "du", "df", "whoami", "id", "uname", "printenv", "which",
        "md5sum", "sha1sum", "sha256sum", "sha512sum", "cksum", "od", "hexdump", "strings",
        "tac", "rev", "seq", "sleep", "jq",
    )},
    "file": Program(("-C", "--compile")),
    "date": Program(("-s", "--set")),
    "sort": Program(("-o", "--output", "--compress-program")),
    "tree": Program(("-o",)),
    "rg": Program(("--pre", "--hostname-bin", "-z", "--search-zip")),
    "printf": Program(("-v",)),
    "fd": Program(("-x", "--exec", "-X", "--exec-batch")),
    "find": Program(("-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fprint0",
                     "-fprintf", "-fls")),
    "uniq": Program(operands=0),
}  # fmt: skip
"""Programs that only read and print, whatever their words (but the options named)."""

GIT_READ = frozenset(
    {"status", "log", "diff", "show", "blame", "shortlog", "rev-parse", "ls-files",
     "ls-tree", "describe", "rev-list", "merge-base", "show-ref", "cat-file", "grep",
     "count-objects"}
)  # fmt: skip
"""git's subcommands that only read."""
GIT_LISTING: Mapping[str, frozenset[str]] = {
    "branch": frozenset({"-a", "-r", "-v", "-vv", "-l", "--list", "--all", "--remotes",
                         "--verbose", "--show-current", "--no-color"}),
    "tag": frozenset({"-l", "--list"}),
    "remote": frozenset({"-v", "--verbose"}),
    "stash": frozenset({"list"}),
}  # fmt: skip
"""git's subcommands that read only in these forms (no other words)."""
GIT_REFUSED = ("--output", "-O", "--open-files-in-pager", "--ext-diff")
"""Options of git's read subcommands that write a file or run a configured command."""
GIT_GLOBAL = frozenset({"--no-pager", "-P", "--no-optional-locks", "--literal-pathspecs"})
GIT_UNPAGED = frozenset(
    {"status", "rev-parse", "ls-files", "ls-tree", "describe", "rev-list", "merge-base",
     "show-ref", "cat-file", "count-objects", "remote"}
)  # fmt: skip
"""Subcommands git never starts a pager for."""

PYTEST_FLAGS = frozenset(
    {"-q", "-qq", "-v", "-vv", "-vvv", "-x", "-s", "-l", "--quiet", "--verbose",
     "--exitfirst", "--showlocals", "--lf", "--last-failed", "--ff", "--failed-first",
     "--nf", "--new-first", "--sw", "--stepwise", "--co", "--collect-only", "--no-header",
     "--no-summary", "--strict-markers", "--setup-show", "--disable-warnings",
     "--runxfail", "--"}
)  # fmt: skip
PYTEST_VALUED = frozenset(
    {"-k", "-m", "-n", "--tb", "--maxfail", "--durations", "--color", "--capture",
     "--numprocesses", "--deselect", "--timeout"}
)  # fmt: skip
"""pytest options that take a value; ``-p`` is read apart (only ``-p no:NAME``)."""


class Facts(NamedTuple):
    """What the caller found out about the world a call runs in (the I/O done for us).

    ``project`` is the project's top directory, resolved; ``cwd`` the call's working
    directory; ``home`` expands ``~``; ``server`` is the bridge's MCP server name.
    ``resolved`` maps each absolute path the judgement reads to its ``realpath``;
    ``programs`` each program name to the file the agent's ``PATH`` finds (resolved), or
    None where none is found. ``terminal``: the agent may give a command a terminal
    whose later input no hook sees (Codex's ``write_stdin``), so a program that turns
    interactive there is not harmless.
    """

    project: str
    cwd: str
    home: str | None = None
    server: str = "melchior"
    resolved: Mapping[str, str] = {}
    programs: Mapping[str, str | None] = {}
    terminal: bool = False


Matcher = Callable[[str, str], bool]
"""(tool, subject) → does an operator's harmless pattern name it."""


def judge(call_tool: str, inp: Mapping[str, object], facts: Facts, patterns: Matcher) -> Decision:
    """Allowed (rule: ``read-only``, ``project-write``, ``project-code``, ``operator``)
    when the call is known harmless; refused (``not-known-harmless``) saying why not."""
    tool = call_tool
    if tool in READ_TOOLS:
        return allow(READ_ONLY, f"{tool} only reads")
    verb = tool.removeprefix(f"mcp__{facts.server}__")
    if verb != tool and verb in READ_VERBS:
        return allow(READ_ONLY, f"{tool} only reads this session's own state")
    if tool in SHELL_TOOLS:
        return _shell_call(tool, inp, facts, patterns)
    if tool in FILE_TOOLS:
        path = inp.get("file_path", inp.get("notebook_path"))
        if not isinstance(path, str):
            return refuse(NOT_HARMLESS, f"{tool} names no file to write")
        return _write(path, facts.cwd, facts, tool)
    if tool in PATCH_TOOLS:
        return _patch(inp, facts)
    if patterns(tool, _subject(inp)):
        return allow(OPERATOR, f"{tool} matches the operator's harmless patterns")
    return refuse(
        NOT_HARMLESS,
        f"{tool} is not one of the tools known to be harmless (tools that only read, "
        "writes inside the project, read-only shell commands)",
    )


def _subject(inp: Mapping[str, object]) -> str:
    import json

    for key in ("file_path", "notebook_path", "url", "query", "path"):
        value = inp.get(key)
        if isinstance(value, str):
            return value
    return json.dumps(dict(inp), sort_keys=True, ensure_ascii=False, default=str)


# -- files ---------------------------------------------------------------------------------------


def _real(path: str, facts: Facts) -> str | None:
    return facts.resolved.get(path)


def _inside(path: str, root: str) -> bool:
    root = posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _absolute(value: str, tilde: bool, cwd: str, facts: Facts) -> str | None:
    """The absolute path a word names, before symlinks (None: a home we cannot know)."""
    if tilde:
        if value == "~" or value.startswith("~/"):
            if facts.home is None:
                return None
            return facts.home + value[1:]
        return None  # another user's home
    return value if value.startswith("/") else posixpath.join(cwd, value)


def _write(value: str, cwd: str, facts: Facts, actor: str, tilde: bool = False) -> Decision:
    """A write to ``value`` is harmless when it resolves inside the project, out of CONTROL."""
    if len(value) > MAX_PATH or not value:
        return refuse(NOT_HARMLESS, f"{actor} writes {value[:200]!r}, not a path that can be read")
    path = _absolute(value, tilde, cwd, facts)
    if path is None:
        return refuse(NOT_HARMLESS, f"{actor} writes {value}, in a home directory not known here")
    real = _real(path, facts)
    if real is None:
        return refuse(NOT_HARMLESS, f"{actor} writes {value}, a path that was not resolved")
    project = posixpath.normpath(facts.project)
    if not _inside(real, project):
        through = " (through a symlink)" if real != posixpath.normpath(path) else ""
        return refuse(
            NOT_HARMLESS, f"{actor} writes {real}{through}, outside the project {project}"
        )
    parts = posixpath.relpath(real, project).split("/")
    control = [p for p in parts if p.casefold() in CONTROL]
    if control:
        return refuse(
            NOT_HARMLESS,
            f"{actor} writes {real}, inside {control[0]}, which git or a coding agent runs or "
            "loads on its own",
        )
    return allow(PROJECT_WRITE, f"{actor} writes {real}, inside the project")


_PATCH_LINE = re.compile(r"^\*\*\* (Add File|Update File|Delete File|Move to): (.+)$")
_PATCH_MARKS = frozenset({"*** Begin Patch", "*** End Patch", "*** End of File"})


def _patch(inp: Mapping[str, object], facts: Facts) -> Decision:
    text = next((v for k in ("patch", "input", "command") if isinstance(v := inp.get(k), str)), "")
    if not text.lstrip().startswith("*** Begin Patch") or len(text) > shell.MAX_COMMAND:
        return refuse(NOT_HARMLESS, "apply_patch: the patch cannot be read")
    touched = 0
    for line in text.splitlines():
        if not line.startswith("*** ") or line.strip() in _PATCH_MARKS:
            continue
        m = _PATCH_LINE.match(line)
        if m is None:
            return refuse(NOT_HARMLESS, f"apply_patch: the patch line {line[:80]!r} is not read")
        kind, path = m.group(1), m.group(2).strip()
        if kind == "Delete File":
            return refuse(NOT_HARMLESS, f"apply_patch deletes {path}")
        decided = _write(path, facts.cwd, facts, "apply_patch")
        if not decided.allowed:
            return decided
        touched += 1
    if touched == 0:
        return refuse(NOT_HARMLESS, "apply_patch: the patch names no file")
    return allow(PROJECT_WRITE, f"apply_patch writes {touched} file(s) inside the project")


# -- the shell -----------------------------------------------------------------------------------


def command_text(value: object) -> str | list[str] | None:
    """A shell tool's command: a line, an argv list, or None (neither)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def script_of(inp: Mapping[str, object]) -> tuple[shell.Script, str]:
    """The call's command line read as a script, and the line as shown in reasons.

    Codex hands shell calls as ``command`` or ``cmd``, a line or an argv list; a list
    ``[sh|bash|dash, -c|-lc, LINE]`` is that line run by a shell, any other list one
    program run directly, with its words as given."""
    value = command_text(inp.get("command", inp.get("cmd")))
    if isinstance(value, str):
        return shell.read(value), value
    if value is None:
        return shell.Script(unread="the call names no command"), ""
    shown = " ".join(value)
    if len(value) > MAX_ARGV or sum(map(len, value)) > shell.MAX_COMMAND:
        return shell.Script(unread=f"an argv list of {len(value)} words is too long to read"), shown
    if (
        len(value) == 3
        and posixpath.basename(value[0]) in ("sh", "bash", "dash")
        and value[1] in ("-c", "-lc", "-cl")
    ):
        return shell.read(value[2]), value[2]
    if not value:
        return shell.Script(unread="the argv list is empty"), shown
    words = tuple(shell.Word(v, v) for v in value)
    return shell.Script(commands=(shell.Command(words),)), shown


def _shell_call(tool: str, inp: Mapping[str, object], facts: Facts, patterns: Matcher) -> Decision:
    script, shown = script_of(inp)
    line = shown if len(shown) <= 200 else shown[:200] + "…"
    decided = shell_script(script, facts, lambda words: patterns(tool, words))
    if decided.allowed:
        return allow(decided.rule, f"'{line}': {decided.reason}")
    why = decided.reason.removeprefix(f"'{line}': ")
    return refuse(decided.rule, f"'{line}' is not known to be harmless: {why}")


def shell_script(script: shell.Script, facts: Facts, pattern: Callable[[str], bool]) -> Decision:
    """Harmless when every command and redirect of the line is (the worst kind wins)."""
    if script.unread is not None:
        return refuse(NOT_HARMLESS, script.unread)
    cwds = _cwds(script, facts)
    if isinstance(cwds, Decision):
        return cwds
    kinds: set[str] = set()
    for command in script.commands:
        decided = _command(command, cwds, facts, pattern)
        if not decided.allowed:
            return decided
        kinds.add(decided.rule)
    for redirect in script.redirects:
        decided = _redirect(redirect, cwds, facts)
        if not decided.allowed:
            return decided
        kinds.add(decided.rule)
    for kind, why in (
        (PROJECT_CODE, "runs the project's tests inside the project"),
        (PROJECT_WRITE, "read-only commands, writing only inside the project"),
        (OPERATOR, "commands the operator listed as harmless"),
    ):
        if kind in kinds:
            return allow(kind, why)
    return allow(READ_ONLY, "read-only commands")


def _cwds(script: shell.Script, facts: Facts) -> list[str] | Decision:
    """Every directory the line's commands may run in: where it starts, and each place a
    ``cd`` (taken in the order written, any of them possibly failing) may lead."""
    cwds = [posixpath.normpath(facts.cwd)]
    for command in script.commands:
        if not command.words or command.words[0].value != "cd":
            continue
        args = list(command.words[1:])
        if args and args[0].value == "--":
            args = args[1:]
        if len(args) > 1 or (args and (args[0].value is None or args[0].value.startswith("-"))):
            return refuse(NOT_HARMLESS, f"'{_shown(command)}' is not a cd this list reads")
        target = args[0] if args else shell.Word("~", "~", True)
        assert target.value is not None
        for cwd in list(cwds):
            where = _absolute(target.value, target.tilde, cwd, facts)
            if where is None:
                return refuse(NOT_HARMLESS, f"'{_shown(command)}' goes to a home not known here")
            where = posixpath.normpath(where)
            if where not in cwds:
                cwds.append(where)
        if len(cwds) > MAX_CWDS:
            return refuse(NOT_HARMLESS, f"the line's cd commands lead to over {MAX_CWDS} places")
    return cwds


def _shown(command: shell.Command) -> str:
    return " ".join(w.text for w in command.words)[:200]


def _redirect(redirect: shell.Redirect, cwds: Sequence[str], facts: Facts) -> Decision:
    target, op = redirect.target, redirect.op
    if target is None or op in ("<<<", "<<", "<<-"):
        return allow(READ_ONLY, "input from the line itself")
    value = target.value
    if op in (">&", "<&") and value is not None and (value.isdigit() or value == "-"):
        return allow(READ_ONLY, "a copy of a file descriptor")
    if value is None:
        return refuse(NOT_HARMLESS, f"the redirect {op} {target.text} goes to a path that expands")
    normal = posixpath.normpath(value) if value.startswith("/") else value
    if any(normal.startswith(n) for n in NETWORK_FILES):
        return refuse(NOT_HARMLESS, f"the redirect {op} {value} opens a network connection")
    if op in ("<", "<&"):
        return allow(READ_ONLY, f"reads {value}")
    if normal in SINKS or re.fullmatch(r"/dev/fd/[0-9]+", normal):
        return allow(READ_ONLY, f"writes to {value}")
    for cwd in cwds:
        decided = _write(value, cwd, facts, f"the redirect {op} {value}", target.tilde)
        if not decided.allowed:
            return decided
    return allow(PROJECT_WRITE, f"the redirect {op} {value} writes inside the project")


def _command(
    command: shell.Command, cwds: Sequence[str], facts: Facts, pattern: Callable[[str], bool]
) -> Decision:
    shown = _shown(command)
    for name, value in command.assignments:
        if name not in SAFE_ENV or value.value is None:
            return refuse(NOT_HARMLESS, f"'{shown}' sets {name} for the program it runs")
    if not command.words:
        return allow(READ_ONLY, "no command")
    first = command.words[0].value
    if first is None:
        return refuse(NOT_HARMLESS, f"'{shown}': the program's name is not fixed text")
    values = [w.value for w in command.words]
    if all(v is not None for v in values) and pattern(" ".join(v or "" for v in values)):
        return allow(OPERATOR, f"'{shown}' matches the operator's harmless patterns")
    if "/" in first:
        return refuse(
            NOT_HARMLESS, f"'{shown}' runs a program by its path; only programs found on PATH count"
        )
    args = command.words[1:]
    if first == "cd" or first in BUILTINS:
        return allow(READ_ONLY, f"{first} only prints, tests or moves")
    if first in ("pytest", "py.test"):
        return _pytest(shown, args, cwds, facts)
    if first in ("python", "python3") and [a.value for a in args[:2]] == ["-m", "pytest"]:
        return _pytest(shown, args[2:], cwds, facts)
    program = READ_PROGRAMS.get(first)
    if program is None and first != "git":
        return refuse(
            NOT_HARMLESS,
            f"{first} is not one of the read-only programs (ls, cat, grep, rg, git status|"
            "log|diff|show, pytest inside the project, …; the operator can add more)",
        )
    found = None if first == "printf" else _program(first, shown, facts)  # a builtin
    if found is not None:
        return found
    if program is None:
        return _git(shown, args, cwds, facts)
    if program.refused or program.operands is not None:
        if any(a.value is None for a in args):
            return refuse(NOT_HARMLESS, f"'{shown}': a word expands, and {first} has options "
                          "that write or run programs")  # fmt: skip
        for a in args:
            hit = _option(a.value or "", program.refused)
            if hit:
                return refuse(NOT_HARMLESS, f"'{shown}': {first} {hit} writes or runs something")
        operands = [a for a in args if not (a.value or "").startswith("-")]
        if program.operands is not None and len(operands) > program.operands:
            return refuse(NOT_HARMLESS, f"'{shown}': {first} with a file operand may write it")
    return allow(READ_ONLY, f"{first} only reads")


def _program(name: str, shown: str, facts: Facts) -> Decision | None:
    """Refused if the agent's PATH finds ``name`` inside the project, where it can write."""
    where = facts.programs.get(name)
    if where is not None and _inside(where, facts.project):
        return refuse(
            NOT_HARMLESS,
            f"'{shown}': {name} is {where}, inside the project, where this agent can write",
        )
    return None


def _option(arg: str, refused: Sequence[str]) -> str | None:
    """The refused option ``arg`` is (or holds, in a cluster of short options), if any."""
    for opt in refused:
        if opt.startswith("--"):
            if arg == opt or arg.startswith(opt + "="):
                return opt
        elif len(opt) == 2:
            cluster = re.match(r"-([A-Za-z0-9]+)", arg)
            if cluster is not None and not arg.startswith("--") and opt[1] in cluster.group(1):
                return opt
        elif arg == opt:
            return opt
    return None


def _inside_all(value: str, cwds: Sequence[str], facts: Facts) -> bool:
    for cwd in cwds:
        path = value if value.startswith("/") else posixpath.join(cwd, value)
        real = _real(path, facts)
        if real is None or not _inside(real, facts.project):
            return False
    return True


def _git(shown: str, args: Sequence[shell.Word], cwds: Sequence[str], facts: Facts) -> Decision:
    if any(a.value is None for a in args):
        return refuse(NOT_HARMLESS, f"'{shown}': a word expands (git reads options anywhere)")
    words = [a.value or "" for a in args]
    unpaged = False
    i = 0
    while i < len(words) and words[i].startswith("-"):
        w = words[i]
        if w in ("-c", "--config-env") or w.startswith(("-c", "--config-env=")):
            return refuse(NOT_HARMLESS, f"'{shown}': git {w} sets configuration for the call, "
                          "and an alias or a pager set so can be any command")  # fmt: skip
        if w == "-C" and i + 1 < len(words):
            if not _inside_all(words[i + 1], cwds, facts):
                return refuse(NOT_HARMLESS, f"'{shown}': git -C {words[i + 1]} reads a "
                              "repository outside the project, and its configuration")  # fmt: skip
            i += 2
            continue
        if w not in GIT_GLOBAL:
            return refuse(NOT_HARMLESS, f"'{shown}': git {w} is not an option this list reads")
        unpaged = unpaged or w in ("--no-pager", "-P")
        i += 1
    if i == len(words):
        return allow(READ_ONLY, "git alone prints its help")
    sub, rest = words[i], words[i + 1 :]
    listing = GIT_LISTING.get(sub)
    if listing is not None:
        if any(w not in listing for w in rest) or (sub == "stash" and not rest):
            return refuse(NOT_HARMLESS, f"'{shown}': git {sub} changes things in this form "
                          f"(read-only: git {sub} {' '.join(sorted(listing))})")  # fmt: skip
    elif sub not in GIT_READ:
        return refuse(
            NOT_HARMLESS,
            f"'{shown}': git {sub} is not one of git's read-only subcommands "
            f"({', '.join(sorted(GIT_READ))}); an alias set in git's configuration is not one",
        )
    for w in rest:
        hit = _option(w, GIT_REFUSED)
        if hit:
            return refuse(NOT_HARMLESS, f"'{shown}': git {sub} {hit} writes or runs something")
    if facts.terminal and not unpaged and sub not in GIT_UNPAGED:
        return refuse(
            NOT_HARMLESS,
            f"'{shown}': on a terminal git {sub} starts a pager, which input sent later "
            "(that no hook sees) can make run commands; use git --no-pager",
        )
    return allow(READ_ONLY, f"git {sub} only reads")


def _pytest(shown: str, args: Sequence[shell.Word], cwds: Sequence[str], facts: Facts) -> Decision:
    """pytest inside the project, with options that only choose what to run and show."""
    for cwd in cwds:
        real = _real(cwd, facts)
        if real is None or not _inside(real, facts.project):
            return refuse(NOT_HARMLESS, f"'{shown}' may run in {cwd}, outside the project")
    if any(a.value is None for a in args):
        return refuse(NOT_HARMLESS, f"'{shown}': a word expands")
    words = [a.value or "" for a in args]
    i = 0
    while i < len(words):
        w = words[i]
        name = w.split("=", 1)[0]
        if w in PYTEST_FLAGS or re.fullmatch(r"-[qvxsl]+|-r[a-zA-Z]+", w):
            pass
        elif w in PYTEST_VALUED or w == "-p":
            if i + 1 == len(words) or (w == "-p" and not words[i + 1].startswith("no:")):
                return refuse(NOT_HARMLESS, f"'{shown}': pytest {w} {' '.join(words[i + 1:i + 2])}"
                              " is not an option this list reads")  # fmt: skip
            i += 1
        elif (name in PYTEST_VALUED and name.startswith("--")) or re.fullmatch(
            r"-[kmn].+|-pno:.+", w
        ):
            pass
        elif w.startswith("-"):
            return refuse(
                NOT_HARMLESS,
                f"'{shown}': pytest {w} is not an option this list reads (some write or delete "
                "files elsewhere, load plugins or start a debugger)",
            )
        elif not _inside_all(w.split("::", 1)[0], cwds, facts):
            return refuse(NOT_HARMLESS, f"'{shown}': {w} is outside the project")
        i += 1
    return allow(PROJECT_CODE, "pytest runs the project's tests inside the project")
