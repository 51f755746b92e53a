"""The vocabulary a model calls, one exec per request.

  melchior tool --verb=who
  melchior tool --verb=status [--who=ID]
  melchior tool --verb=tell --who=ID --message=TEXT [--sort=attention|note]
  melchior tool --verb=ask --who=ID --message=TEXT
  melchior tool --verb=answer --about=ID@MSG --message=TEXT
  melchior tool --verb=task --about=ID@MSG        (or a child's bare id: its status)
  melchior tool --verb=report --message=TEXT      (or --about=- to read stdin)
  melchior tool --verb=report --who=ID [--page=N] [--about=json]
  melchior tool --verb=end --who=ID
  melchior tool --schema
  melchior tool --verb=send_to --to=NAME --message=TEXT   (in a plane turn; '-': stdin)
  melchior tool --verb=team                               (in a plane turn)

Prints one JSON reply {"ok","family","n","result"} on stdout; a refusal is
{"ok":false,…,"error":{"code","reason",…}} with exit status 1 (2 for a malformed
request). The caller is $MAGI_MELCHIOR_ID in $MAGI_MELCHIOR_PROJECT; without it the
caller is the operator (who, status, tell and reading reports only)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up, above)
if TYPE_CHECKING:
    import argparse
    from typing import NoReturn

FLAGS = ("verb", "who", "message", "sort", "about", "page", "chain", "to")
"""The flags that take a value; ``--schema`` is the one switch."""


def _page(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a page number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("pages are numbered from 1")
    return value


def parse_fast(args: list[str]) -> SimpleNamespace | None:
    """The common shape of a request (``--flag=value`` only) without argparse.

    argparse and what it pulls in (re-compiles, gettext, shutil, locale) are about a
    fifth of the tool's start-up, and a harness execs the tool once per request. Only
    the unambiguous spelling is taken here; anything else (``--flag value``, ``-h``,
    an abbreviation, an unknown flag, a bad page number) returns None and goes through
    argparse, so its answers, errors included, are argparse's own.
    """
    ns = SimpleNamespace(schema=False, **dict.fromkeys(FLAGS))
    for arg in args:
        if arg == "--schema":
            ns.schema = True
            continue
        name, eq, value = arg.partition("=")
        flag = name[2:]
        if not (eq and name.startswith("--") and flag in FLAGS) or value == "--":
            # (argparse drops a value that is exactly '--'; let it keep its own quirks)
            return None
        if flag == "page":
            if not (value.isascii() and value.isdigit()) or int(value) < 1:
                return None
            setattr(ns, flag, int(value))
        else:
            setattr(ns, flag, value)
    return ns


def _json_usage_error(message: str) -> NoReturn:
    """Even a flag argparse cannot parse is answered on stdout as one JSON refusal.

    The tool's reader is a harness parsing stdout; argparse's own habit (usage on stderr,
    nothing on stdout) would reach it as "the command printed nothing".
    """
    from melchior.wire import argv
    from melchior.wire.calls import refused

    argv.emit(refused(f"{message}; see 'melchior tool --help'", code="bad-args"))
    sys.exit(2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The parser is made by melchior.cli; only its error reporting is replaced here.
    setattr(parser, "error", _json_usage_error)  # noqa: B010
    parser.add_argument("--verb", help="who, status, tell, ask, answer, task, report, end")
    parser.add_argument("--who", metavar="ID", help="the session to reach")
    parser.add_argument("--message", metavar="TEXT", help="the text to send or store")
    parser.add_argument("--sort", metavar="SORT", help="tell: attention (default) or note")
    parser.add_argument("--about", metavar="HANDLE", help="ID@MSG, a child's id, '-' or 'json'")
    parser.add_argument("--page", type=_page, metavar="N", help="report: which page to read")
    parser.add_argument("--chain", metavar="JSON", help="the chain of the message you answer")
    parser.add_argument("--to", metavar="NAME", help="send_to: the plane agent to write to")
    parser.add_argument("--schema", action="store_true", help="print the vocabulary as JSON Schema")


def run(ns: argparse.Namespace | SimpleNamespace) -> int:
    from melchior.wire import argv
    from melchior.wire.calls import Refused, ok, refused

    if ns.schema:
        from melchior.tool import schema

        argv.emit(schema())
        return 0
    if not ns.verb:
        argv.emit(refused("say what to do with --verb=… (or --schema)", code="bad-args"))
        return 2
    if ns.verb == "status":
        # A session asking about itself, the most frequent request, without importing the
        # vocabulary; None when the general path must decide (melchior.quick_status).
        from melchior.quick_status import status

        try:
            quick = status(ns)
        except Refused as exc:
            argv.emit(refused(exc.reason, code=exc.code, **exc.detail))
            return 1
        if quick is not None:
            argv.emit(ok(quick))
            return 0

    import os

    from melchior.tool import PLANE_ENV, PlaneVerbs, Request, Usage, perform

    plane: PlaneVerbs | None = None
    if os.environ.get(PLANE_ENV):  # the plane's verbs, imported only inside a plane turn
        from melchior.plane import verbs as plane

    req = Request(
        verb=ns.verb,
        who=ns.who,
        message=ns.message,
        sort=ns.sort,
        about=ns.about,
        page=ns.page,
        chain=ns.chain,
        stdin=sys.stdin.buffer.read,
        to=ns.to,
    )
    try:
        result = perform(req, plane=plane)
    except Usage as exc:
        argv.emit(refused(str(exc), code="bad-args"))
        return 2
    except Refused as exc:
        argv.emit(refused(exc.reason, code=exc.code, **exc.detail))
        return 1
    argv.emit(ok(result))
    return 0
