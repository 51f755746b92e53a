"""A shell command line as the taint window reads it: parsed by tree-sitter-bash. Pure.

Splitting a line at ``;``, ``&&`` and quotes misses what a shell really runs: a
here-string fed to ``bash``, ``-c`` after ``--``, a command substitution inside a double
quoted word, a here-document whose end a splitter cannot find. So the line is parsed by
a real grammar (tree-sitter's bash grammar, a maintained parser with no Python
dependencies of its own), and read into every simple command it would run — those inside
``$( )``, backticks and ``<( )`` too — and every redirect it makes.

Only a small part of the language is read: commands, pipelines, lists (``;``, ``&&``,
``||``, ``&``), grouping with ``( )`` and ``{ }``, ``!``, redirects, here-documents and
here-strings, quoting, ``$x``/``${x}`` and substitutions. Anything else (loops, ``if``,
``case``, functions, arithmetic, ``[[ ]]``, declarations, a syntax error, a control
character, a line too long or nested too deep) leaves the line *unread*, with the
reason: the caller treats an unread line as unknown, never as harmless. A character
beyond U+FFFF is never handed to the grammar at all: tree-sitter-bash 0.25 has been seen
to crash its process on one after a ``{`` (a crash would take the bridge down with it). Where the
grammar and bash could disagree about where a here-document ends, the line is unread too.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from tree_sitter import Node, Parser

MAX_COMMAND = 64 * 1024
"""Longest command line read (characters); a longer one is unread."""
MAX_NODES = 20_000
"""Most syntax nodes looked at in one line; more is unread (no unbounded work)."""
MAX_DEPTH = 100
"""Deepest nesting looked into (substitutions inside substitutions …); deeper is unread."""


class Word(NamedTuple):
    """One word of a command or a redirect target.

    ``value`` is what bash makes of the word when that does not depend on anything but
    the text (quotes and backslashes removed); None when it expands: a variable, a glob,
    a brace list, a substitution. ``tilde`` says the word starts with an unquoted ``~``,
    which bash replaces with a home directory.
    """

    text: str
    value: str | None
    tilde: bool = False


class Redirect(NamedTuple):
    """A redirect: its operator (``>``, ``>>``, ``<``, ``<<<``, ``<<`` …) and target
    (None for a here-document, whose body is the command's input)."""

    op: str
    target: Word | None


class Command(NamedTuple):
    """A simple command: its words (the command name first), and the variables set for it."""

    words: tuple[Word, ...]
    assignments: tuple[tuple[str, Word], ...] = ()


class Script(NamedTuple):
    """What a command line would run, or why it was not read (``unread``)."""

    commands: tuple[Command, ...] = ()
    redirects: tuple[Redirect, ...] = ()
    unread: str | None = None


_STRUCTURE = frozenset(
    {"program", "list", "pipeline", "redirected_statement", "subshell", "compound_statement",
     "negated_command", "command_substitution", "process_substitution"}
)  # fmt: skip
_OPERATORS = frozenset(
    {";", "&&", "||", "|", "|&", "&", "(", ")", "{", "}", "!", "\n", "$(", "`", "<(", ">("}
)  # fmt: skip
_REDIRECTS = frozenset({"file_redirect", "herestring_redirect", "heredoc_redirect"})
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_BRACES = re.compile(r"\{[^{}]*(,|\.\.)[^{}]*\}")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


class _Unread(Exception):
    """The line leaves the part of the language read here (the message says how)."""


@functools.cache
def _parser() -> Parser:
    """The grammar, loaded on first use: only the bridge ever reads a command line."""
    import tree_sitter_bash
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_bash.language()))


@functools.lru_cache(maxsize=64)
def read(text: str) -> Script:
    """Every command and redirect of ``text``, or the reason it was not read."""
    if len(text) > MAX_COMMAND:
        return Script(unread=f"a {len(text)}-character command line is too long to read")
    bad = _CONTROL.search(text)
    if bad is not None:
        return Script(unread=f"the command line holds a control character ({bad.group()!r})")
    if _ASTRAL.search(text) is not None:
        # tree-sitter-bash 0.25 can crash the process on one (after a '{'): never parse it
        return Script(unread="the command line holds a character beyond U+FFFF")
    try:
        source = text.encode("utf-8")
    except UnicodeEncodeError:
        return Script(unread="the command line is not valid UTF-8")
    tree = _parser().parse(source)
    root = tree.root_node
    if root.has_error:
        return Script(unread="the command line does not parse as shell")
    reader = _Reader(source)
    try:
        reader.statement(root, 0)
    except _Unread as why:
        return Script(unread=str(why))
    return Script(tuple(reader.commands), tuple(reader.redirects))


class _Reader:
    """One walk over a parsed line; bounded by MAX_NODES and MAX_DEPTH."""

    def __init__(self, source: bytes) -> None:
        self.source = source
        self.commands: list[Command] = []
        self.redirects: list[Redirect] = []
        self.seen = 0

    def _count(self, depth: int) -> None:
        self.seen += 1
        if self.seen > MAX_NODES:
            raise _Unread(f"the command line has more than {MAX_NODES} parts to read")
        if depth > MAX_DEPTH:
            raise _Unread(f"the command line nests more than {MAX_DEPTH} deep")

    def statement(self, node: Node, depth: int) -> None:
        """A structural node: its commands, redirects and nested statements."""
        pending = [(node, depth)]
        while pending:
            n, d = pending.pop()
            self._count(d)
            kind = n.type
            if not n.is_named:
                if kind not in _OPERATORS:
                    raise _Unread(f"'{kind}' is not read")
                continue
            if kind == "comment":
                continue
            if kind == "command":
                self.command(n, d)
            elif kind in _REDIRECTS:
                self.redirect(n, d)
            elif kind in _STRUCTURE:
                pending.extend((c, d + 1) for c in reversed(n.children))
            else:
                raise _Unread(f"{_named(kind)} is not read")

    def command(self, node: Node, depth: int) -> None:
        words: list[Word] = []
        assignments: list[tuple[str, Word]] = []
        for child in node.children:
            kind = child.type
            if kind == "command_name":
                for part in child.children:
                    words.append(self.word(part, depth + 1))
            elif kind == "variable_assignment":
                assignments.append(self.assignment(child, depth + 1))
            elif kind in _REDIRECTS:
                self.redirect(child, depth + 1)
            elif child.is_named:
                words.append(self.word(child, depth + 1))
            else:
                raise _Unread(f"'{kind}' in a command is not read")
        self.commands.append(Command(tuple(words), tuple(assignments)))

    def assignment(self, node: Node, depth: int) -> tuple[str, Word]:
        name, value = "", Word("", "")
        for child in node.children:
            if child.type == "variable_name":
                name = _text(child)
            elif child.is_named:
                value = self.word(child, depth + 1)
        return name, value

    def redirect(self, node: Node, depth: int) -> None:
        kind = node.type
        if kind == "heredoc_redirect":
            self.heredoc(node, depth)
            return
        op, target = "", None
        for child in node.children:
            if child.type == "file_descriptor":
                continue
            if not child.is_named:
                op = child.type
            elif child.type in _REDIRECTS:
                self.redirect(child, depth + 1)
            else:
                target = self.word(child, depth + 1)
        self.redirects.append(Redirect(op, target))

    def heredoc(self, node: Node, depth: int) -> None:
        """A here-document, read only where the grammar and bash agree on its end."""
        op, start, body, end = "<<", "", None, None
        for child in node.children:
            kind = child.type
            if not child.is_named:
                op = kind
            elif kind == "heredoc_start":
                start = _text(child)
            elif kind == "heredoc_body":
                body = child
            elif kind == "heredoc_end":
                end = child
            elif kind in _REDIRECTS:
                self.redirect(child, depth + 1)
            else:
                raise _Unread(f"{_named(kind)} after a here-document's start is not read")
        delimiter, quoted = _unquote(start)
        if end is None or _text(end) != delimiter:
            raise _Unread("a here-document whose end cannot be found is not read")
        after = self.source[end.end_byte : end.end_byte + 1]
        if after not in (b"", b"\n"):
            raise _Unread("a here-document whose end line holds more is not read")
        text = _text(body) if body is not None else ""
        last = text.rsplit("\n", 1)[-1]
        if (last.strip("\t") if op == "<<-" else last) != "":
            raise _Unread("a here-document whose end line is not the delimiter alone is not read")
        for line in text.split("\n")[:-1]:
            if (line.lstrip("\t") if op == "<<-" else line) == delimiter:
                raise _Unread("a here-document bash would end earlier is not read")
            if not quoted and (len(line) - len(line.rstrip("\\"))) % 2 == 1:
                raise _Unread("a here-document with a line continued by '\\' is not read")
        if body is not None and not quoted:
            for child in body.children:
                if child.type != "heredoc_content":
                    self.word(child, depth + 1)
        self.redirects.append(Redirect(op, None))

    def word(self, node: Node, depth: int) -> Word:
        """A word's fixed value (or None), reading the commands any substitution in it runs."""
        self._count(depth)
        kind = node.type
        text = _text(node)
        if kind == "word":
            return _unquoted(text)
        if kind == "number":
            return Word(text, text)
        if kind == "raw_string":
            return Word(text, text[1:-1])
        if kind == "string":
            value: str | None = ""
            for child in node.children:
                if child.type == "string_content":
                    value = None if value is None else value + _in_double_quotes(_text(child))
                elif child.is_named:
                    self.word(child, depth + 1)
                    value = None
            return Word(text, value)
        if kind == "concatenation":
            children = node.children
            parts = [self.word(c, depth + 1) for c in children]
            braces = _BRACES.search(text) is not None  # a{b,c}: pieces the grammar splits
            fixed = not braces and all(p.value is not None for p in parts)
            joined = "".join(p.value or "" for p in parts) if fixed else None
            return Word(text, joined, bool(parts) and parts[0].tilde)
        if kind in ("command_substitution", "process_substitution"):
            self.statement(node, depth + 1)
            return Word(text, None)
        if kind == "simple_expansion":
            return Word(text, None)
        if kind == "expansion":
            if not re.fullmatch(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", text):
                raise _Unread(f"the expansion {text[:40]} is not read (only $name and ${{name}})")
            return Word(text, None)
        if kind in ("ansi_c_string", "translated_string", "brace_expression"):
            return Word(text, None)
        raise _Unread(f"{_named(kind)} is not read")


def _text(node: Node) -> str:
    raw = node.text
    return raw.decode("utf-8", errors="replace") if raw is not None else ""


def _named(kind: str) -> str:
    return {
        "for_statement": "a for loop", "c_style_for_statement": "a for loop",
        "while_statement": "a while loop", "if_statement": "an if", "case_statement": "a case",
        "function_definition": "a function definition", "variable_assignment":
        "setting a variable", "declaration_command": "a declaration (export, local …)",
        "unset_command": "unset", "test_command": "a [[ ]] test",
        "arithmetic_expansion": "arithmetic", "ERROR": "a syntax error",
    }.get(kind, f"a {kind.replace('_', ' ')}")  # fmt: skip


def _unquoted(text: str) -> Word:
    """An unquoted word: backslashes removed; None if bash would expand it (glob, braces)."""
    out: list[str] = []
    plain: list[str] = []  # the unescaped characters, for glob and brace checks
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            if text[i + 1] != "\n":
                out.append(text[i + 1])
                plain.append(" ")
            i += 2
            continue
        out.append(ch)
        plain.append(ch)
        i += 1
    unescaped = "".join(plain)
    tilde = unescaped.startswith("~")
    if any(c in unescaped for c in "*?[") or _BRACES.search(unescaped):
        return Word(text, None, tilde)
    return Word(text, "".join(out), tilde)


def _in_double_quotes(text: str) -> str:
    """Inside double quotes a backslash escapes only $ ` " \\ and a newline."""
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), text)


def _unquote(text: str) -> tuple[str, bool]:
    """A here-document's delimiter as bash reads it, and whether any of it was quoted."""
    out: list[str] = []
    quoted = False
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            quoted = True
            i += 2
        elif ch in "'\"":
            close = text.find(ch, i + 1)
            if close < 0:
                return text, True
            out.append(text[i + 1 : close])
            quoted = True
            i = close + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out), quoted
