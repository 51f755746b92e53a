"""A bounded TOML file reader: every way a config file can be unreadable is one line.

``tomllib`` is a fine parser for files someone meant to write, but a config file is
input like any other: a stray byte that is not UTF-8 (``agent = "\\xff"``) raised a
``UnicodeDecodeError`` from ``read_text``, and a 100,000-deep array (``a = [[[[…``) a
``RecursionError`` from the parser's recursion — tracebacks where the relay documents
exit 2 and the receiver 78, each with one line saying why. So the file is read here:

* at most :data:`MAX_BYTES` (a config file is a few KiB; a larger one is a mistake or a
  device, and is refused before it is parsed);
* decoded as strict UTF-8, a bad byte named with its line and column;
* parsed by ``tomllib``, a parser's recursion limit reported as nesting too deep;
* nested at most :data:`MAX_DEPTH` tables and arrays deep (no setting needs more).

Errors are :class:`TomlFileError`, one line, naming the file. A file that cannot be
opened raises the ``OSError`` it raised: callers word "no such file" their own way.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

MAX_BYTES = 1024 * 1024
MAX_DEPTH = 32


class TomlFileError(ValueError):
    """A config file that is not readable TOML within the bounds; one line, why."""


def _depth(value: Any) -> int:
    """How deep tables and arrays nest in ``value`` (iteratively: no recursion to run out)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: list[Any] = list(item.values())
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _position(data: bytes, offset: int) -> str:
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    return f"line {line}, column {column}"


def parse(data: bytes, source: str = "<config>") -> dict[str, Any]:
    """The TOML document in ``data``, within the bounds of the module docstring."""
    if len(data) > MAX_BYTES:
        raise TomlFileError(_too_large(source))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TomlFileError(
            f"{source} is not UTF-8: byte 0x{data[exc.start]:02x} at "
            f"{_position(data, exc.start)}; TOML files are UTF-8"
        ) from None
    return loads(text, source)


def _too_large(source: str) -> str:
    return f"{source} is larger than a config file may be ({MAX_BYTES} bytes at most)"


def loads(text: str, source: str = "<config>") -> dict[str, Any]:
    """The TOML document in ``text`` already decoded, within the same bounds.

    For the readers that take a file's text (the plane's, the session's, the providers'
    and the bridge's config files): what ``tomllib.loads`` would give, except that a
    document too large or nested too deep is a :class:`TomlFileError` rather than a
    ``RecursionError`` traceback.
    """
    if len(text) > MAX_BYTES:  # a character is at least a byte: never under the bound
        raise TomlFileError(_too_large(source))
    try:
        document = tomllib.loads(text)
    except RecursionError:
        raise TomlFileError(
            f"{source} nests arrays or tables too deep to read (at most {MAX_DEPTH})"
        ) from None
    except ValueError as exc:  # tomllib.TOMLDecodeError, and a value it cannot convert
        reason = " ".join(str(exc).split())
        raise TomlFileError(f"{source} is not valid TOML: {reason}") from None
    if _depth(document) > MAX_DEPTH:
        raise TomlFileError(f"{source} nests arrays or tables deeper than {MAX_DEPTH}")
    return document


def read(path: Path) -> dict[str, Any]:
    """The TOML document in the file at ``path``; :class:`TomlFileError` if it is not one
    (see the module docstring), ``OSError`` if it cannot be opened or read."""
    with path.open("rb") as f:
        data = f.read(MAX_BYTES + 1)
    return parse(data, str(path))
