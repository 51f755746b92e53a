"""Show which workspace and identity the current credential acts as.

Asked through :class:`melchior.mellan.client.caller.RelayClient` (``whoami``), so the
answer is checked and a refusal read the way every client reads it.
"""

from __future__ import annotations

import argparse

from melchior.mellan.commands._common import (
    EXIT_USAGE,
    CliError,
    add_common,
    cli_refusal,
    guarded,
    print_json,
    target,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)


@guarded
def run(ns: argparse.Namespace) -> int:
    from melchior.mellan.client.caller import RelayClient  # httpx: only when it is used
    from melchior.mellan.client.errors import RelayError
    from melchior.mellan.transport import TransportError

    t = target(ns)
    assert t.token is not None  # target() refuses a missing token
    try:
        client = RelayClient(t.relay, t.token, tls=t.tls)
    except TransportError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    try:
        with client:
            me = client.whoami()
    except RelayError as exc:
        raise cli_refusal(exc) from None
    if ns.json:
        print_json(me.raw)
    else:
        print(
            f"{me.kind} {me.subject!r} in workspace {me.workspace!r} at {t.relay} "
            f"(credential {me.credential_id})"
        )
    return 0
