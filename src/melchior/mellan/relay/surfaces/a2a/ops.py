"""The A2A 1.0 operations by name, so every binding dispatches to one implementation.

Each operation takes the binding-neutral request object (the JSON-RPC ``params``, what
the HTTP+JSON binding assembled from path, query and body, or the gRPC request message
in its JSON mapping) and returns either a JSON value or an async iterator of
``StreamResponse`` objects.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request

from melchior.mellan.relay.context import Relay
from melchior.mellan.relay.surfaces.a2a import (
    cards,
    jsontext,
    listing,
    pushconfigs,
    requests,
    tasks,
)
from melchior.mellan.relay.surfaces.a2a.access import Caller
from melchior.mellan.relay.surfaces.body import parsed_inline

Result = dict[str, Any] | AsyncIterator[dict[str, Any]]
Op = Callable[[Relay, Caller, Any, Request], Awaitable[Result]]

STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})

CARRY_TASKS = frozenset({"SendMessage", "GetTask", "ListTasks", "CancelTask"})
"""Operations whose answer carries tasks, so can carry a result of many MiB: encoded on a
worker thread (one thread hop), never on the event loop — unless it is small
(:data:`INLINE_ENCODE`)."""

INLINE_ENCODE = 64 * 1024
"""Characters of text in an answer of :data:`CARRY_TASKS` up to which it is encoded on the
event loop (:func:`~.jsontext.within`; the bound views are built there too,
``tasks.INLINE_VIEW``): a worker-thread hop is two cross-thread wake-ups, more than
encoding a few KiB, and a blocking SendMessage's answer is on the path the caller waits
for (docs/benchmarks.md, issue 25, the relay's own path)."""


async def encoded(relay: Relay, op_name: str, answer: dict[str, Any]) -> list[bytes]:
    """The answer's JSON bytes, in chunks (:func:`~.jsontext.dumpb_chunks`, a big stored
    answer spliced, not re-encoded): off the event loop for :data:`CARRY_TASKS` answers
    bigger than :data:`INLINE_ENCODE`."""
    if op_name in CARRY_TASKS and not jsontext.within(answer, INLINE_ENCODE):
        return await relay.call(jsontext.dumpb_chunks, answer)
    return jsontext.dumpb_chunks(answer)


async def _read_send(relay: Relay, params: Any, request: Request) -> requests.SendRequest:
    """The send's request, checked where its body was parsed: a big body's on a worker
    thread, since reading it is in proportion to its size (every ``raw`` part's base64)."""
    if parsed_inline(request):
        return requests.parse_send(params, inline=True)
    return await relay.call(requests.parse_send, params, inline=False)


async def send_message(relay: Relay, caller: Caller, params: Any, request: Request) -> Result:
    req = await _read_send(relay, params, request)
    return await tasks.send_blocking(relay, caller, req, request.is_disconnected)


async def send_streaming_message(
    relay: Relay, caller: Caller, params: Any, request: Request
) -> Result:
    req = await _read_send(relay, params, request)
    return await tasks.send_streaming(relay, caller, req)


async def get_task(relay: Relay, caller: Caller, params: Any, request: Request) -> Result:
    ref = requests.parse_task_ref(params, history=True)
    return await tasks.get(relay, caller, ref.id, ref.history_length)


async def list_tasks(relay: Relay, caller: Caller, params: Any, request: Request) -> Result:
    return await listing.list_tasks(relay, caller, requests.parse_list(params))


async def cancel_task(relay: Relay, caller: Caller, params: Any, request: Request) -> Result:
    return await tasks.cancel(relay, caller, requests.parse_task_ref(params).id)


async def subscribe_to_task(relay: Relay, caller: Caller, params: Any, request: Request) -> Result:
    return await tasks.subscribe(relay, caller, requests.parse_task_ref(params).id)


async def extended_card(relay: Relay, caller: Caller, params: Any, request: Request) -> Result:
    seen = await relay.call(cards.visible_capabilities, relay.store, caller)
    request.state.last_modified = seen.last_modified  # for Last-Modified on HTTP+JSON
    grpc = relay.grpc.target if relay.grpc is not None else None
    return cards.extended_card(
        relay.public_url, caller, seen.agent, seen.capabilities, grpc, seen.fingerprint
    )


async def create_push_config(relay: Relay, caller: Caller, params: Any, request: Request) -> Result:
    return await pushconfigs.create(relay, caller, params)


async def get_push_config(relay: Relay, caller: Caller, params: Any, request: Request) -> Result:
    return await pushconfigs.get(relay, caller, params)


async def list_push_configs(relay: Relay, caller: Caller, params: Any, request: Request) -> Result:
    return await pushconfigs.list_configs(relay, caller, params)


async def delete_push_config(relay: Relay, caller: Caller, params: Any, request: Request) -> Result:
    return await pushconfigs.delete(relay, caller, params)


OPERATIONS: dict[str, Op] = {
    "SendMessage": send_message,
    "SendStreamingMessage": send_streaming_message,
    "GetTask": get_task,
    "ListTasks": list_tasks,
    "CancelTask": cancel_task,
    "SubscribeToTask": subscribe_to_task,
    "GetExtendedAgentCard": extended_card,
    "CreateTaskPushNotificationConfig": create_push_config,
    "GetTaskPushNotificationConfig": get_push_config,
    "ListTaskPushNotificationConfigs": list_push_configs,
    "DeleteTaskPushNotificationConfig": delete_push_config,
}
