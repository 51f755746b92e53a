"""The vocabulary as MCP tools: generated from ``melchior tool --schema``, never hand-written.

Each verb of :func:`melchior.tool.schema` becomes one tool whose input schema is the
verb's own object schema without the ``verb`` property (the tool's name says it), and
whose arguments become a :class:`melchior.tool.Request` run by the same
:func:`melchior.tool.perform` the CLI runs. So a new verb (``send_to`` and ``team`` once
the plane adds them) is a new tool with nothing written here, and a receipt or refusal
reads exactly as ``melchior tool`` prints it.

The bridge adds a few tools of its own beside the vocabulary: ``inbox`` (read waiting
messages), and the relay caller's ``relay_*`` tools when a mellan credential is
configured. Those live with their code; this module stays data in, data out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from melchior import tool as vocabulary
from melchior.tool import Request, Usage

PLANE_VERBS = frozenset({"send_to", "team"})
"""Verbs that only mean something inside a turn the plane is running."""

SEND_VERBS = frozenset({"tell", "ask", "answer"})
"""Verbs that send a message another agent will read: counted by the per-turn quota.
(The plane's own ``send_to`` is counted by the plane; ``report`` stores rather than sends.)"""

MAX_ARGUMENT = 1024 * 1024 + 4096
"""Largest string argument accepted (a message is at most 1 MiB; the rest is headroom)."""


class ToolSpec(NamedTuple):
    """One MCP tool: what ``tools/list`` shows."""

    name: str
    description: str
    input_schema: dict[str, Any]


def in_plane_turn(env: Mapping[str, str]) -> bool:
    """The tool's own rule (``melchior.tool.PLANE_ENV``): a plane turn names its outbox."""
    return bool(env.get(vocabulary.PLANE_ENV))


def vocabulary_tools(
    env: Mapping[str, str], document: Mapping[str, Any] | None = None
) -> list[ToolSpec]:
    """One tool per verb of the schema document (by default ``melchior tool --schema``).

    The plane's verbs are offered only inside a plane turn: outside one there is no
    outbox for ``send_to`` to write to, and a tool that can only refuse is noise.
    """
    doc = vocabulary.schema() if document is None else document
    plane = in_plane_turn(env)
    out = []
    for verb in doc.get("oneOf", []):
        name = verb["title"]
        if name in PLANE_VERBS and not plane:
            continue
        props = {k: v for k, v in verb.get("properties", {}).items() if k != "verb"}
        required = [r for r in verb.get("required", []) if r != "verb"]
        schema: dict[str, Any] = {
            "type": "object",
            "properties": props,
            "additionalProperties": False,
        }
        if required:
            schema["required"] = required
        out.append(ToolSpec(name, _describe(name, verb.get("description", "")), schema))
    return out


def _describe(name: str, text: str) -> str:
    """The verb's description, plus what the bridge does that the CLI leaves to its caller."""
    if name in ("tell", "ask"):
        text += (
            ". The hop chain of the messages you are answering is carried for you; leave "
            "'chain' out"
        )
    if name == "report":
        text += ". Give the body as 'message' (about='-' reads stdin, which an MCP server has not)"
    return text


def check_arguments(spec: ToolSpec, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
    """The arguments, checked against the tool's schema; :class:`Usage` saying what is wrong.

    MCP clients are not obliged to validate before calling, and a model writes these, so
    the schema is enforced here: no unknown names, required ones present, types as
    declared (a page is a whole number of at least 1), enums honoured, sizes bounded.
    """
    args = dict(arguments or {})
    props: dict[str, Any] = spec.input_schema.get("properties", {})
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise Usage(
            f"'{spec.name}' takes {', '.join(props) or 'no arguments'}; not {', '.join(unknown)}"
        )
    for name in spec.input_schema.get("required", []):
        if args.get(name) is None:
            raise Usage(f"'{spec.name}' needs '{name}'")
    for name, value in list(args.items()):
        if value is None:
            del args[name]
            continue
        want = props[name].get("type", "string")
        if want == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                raise Usage(f"'{name}' must be a whole number, got {json.dumps(value)[:40]}")
            if value < props[name].get("minimum", value):
                raise Usage(f"'{name}' must be at least {props[name]['minimum']}")
        elif want == "boolean":
            if not isinstance(value, bool):
                raise Usage(f"'{name}' must be true or false, got {json.dumps(value)[:40]}")
        elif want == "string":
            if not isinstance(value, str):
                raise Usage(f"'{name}' must be text, got {type(value).__name__}")
            if len(value) > MAX_ARGUMENT:
                raise Usage(f"'{name}' is {len(value)} characters; at most {MAX_ARGUMENT}")
        enum = props[name].get("enum")
        if enum is not None and value not in enum:
            raise Usage(f"'{name}' must be one of {', '.join(enum)}, got {value!r}")
    return args


def request(verb: str, args: Mapping[str, Any]) -> Request:
    """The CLI's request for ``verb`` with these (checked) arguments."""
    fields = set(Request._fields) - {"verb", "stdin"}
    unknown = sorted(set(args) - fields)
    if unknown:  # a verb whose schema names a flag Request does not carry: a bug, said plainly
        raise Usage(
            f"'{verb}' cannot be run here: melchior.tool.Request has no {', '.join(unknown)}"
        )
    if verb == "report" and args.get("about") == "-":
        raise Usage("give the report's body as 'message'; an MCP server has no stdin to read")
    return Request(verb=verb, **args)
