"""A small typed client for the relay's receiver API
(:mod:`melchior.mellan.relay.surfaces.receiver`).

It is what a receiver beside a destination agent uses to take work: ``claim`` (long-poll),
then ``renew`` while working, ``progress`` for status/artifacts, and finally ``complete``
or ``fail``. Every write carries the lease epoch from the claim; the answer is an
:class:`~melchior.mellan.relay.store.base.Outcome` rather than an exception, because "lease
lost" is an ordinary event a receiver must act on (stop the work, discard the result),
not a crash. Transport failures and refusals (bad credential, bad request, 503) raise
:class:`ReceiverError` with the relay's reason.

Payloads come back as the exact JSON the caller sent: bodies are decoded with exact
decimals, so ``12345678901234567890`` stays an int and no float rounding happens.

Minimal loop::

    with ReceiverClient(url, token) as rc:
        for lease in rc.claim(wait=25):
            out = rc.complete(lease.task_id, lease.epoch, {"message": reply})
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from melchior.mellan import transport
from melchior.mellan.client.errors import refusal
from melchior.mellan.client.leases import ClaimedTask, MalformedLease, Route, claimed
from melchior.mellan.client.warm import warm
from melchior.mellan.outcome import Outcome
from melchior.mellan.rawjson import decode, encode
from melchior.mellan.transport import ClientTls

__all__ = [
    "AsyncReceiverClient",
    "ClaimedTask",
    "MalformedLease",
    "ReceiverClient",
    "ReceiverError",
    "Route",
    "WriteResult",
    "answer",
    "claimed",
    "leases_of",
    "refused",
    "write_result",
]


class ReceiverError(Exception):
    """The relay refused a request (or could not be reached); ``reason`` says why."""

    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(f"{reason} ({code}, HTTP {status})" if status else reason)
        self.status = status
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class WriteResult:
    """What a fenced write came to; ``reason`` explains a lease loss ("cancelled", …)."""

    outcome: Outcome
    reason: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.OK, Outcome.DUPLICATE)

    @property
    def lease_lost(self) -> bool:
        return self.outcome is Outcome.LEASE_LOST


def _decoded(response: httpx.Response) -> Any:
    """The body as exact JSON ({} when empty or not JSON: the status then speaks)."""
    try:
        return decode(response.content) if response.content else {}
    except (ValueError, RecursionError):  # not JSON, or nested past what a parser can follow
        return {}


def refused(response: httpx.Response, data: Any) -> ReceiverError:
    """The relay's refusal (its ``error.code`` and ``reason``) as a :class:`ReceiverError`,
    read by the one decoder every relay client uses (:func:`.errors.refusal`)."""
    found = refusal(response.status_code, response.content, response.headers)
    if found.said:
        return ReceiverError(response.status_code, found.code, found.sentence)
    return ReceiverError(response.status_code, "http-error", found.sentence)


def answer(response: httpx.Response) -> Any:
    """The decoded answer of a receiver-API request: a claim's leases or a fenced write's
    outcome (200, 404, 409); anything else is a :class:`ReceiverError` with the reason."""
    data = _decoded(response)
    if (
        response.status_code in (200, 404, 409)
        and isinstance(data, dict)
        and ("outcome" in data or "leases" in data or "results" in data)
    ):
        return data
    raise refused(response, data)


def leases_of(
    data: dict[str, Any], agent: str | None, wait: float
) -> list[ClaimedTask | MalformedLease]:
    """The leases of a claim answer, each checked (a list of them is what the relay owes),
    with how long the relay says it held the claim: a number from 0 to the claim's own
    ``wait`` (anything else counts as 0, the cautious reading)."""
    items = data["leases"]
    if not isinstance(items, list):
        raise ReceiverError(200, "bad-answer", "the relay's claim answer has no list of leases")
    held = data.get("waited")
    waited = 0.0
    if isinstance(held, int | float | Decimal) and not isinstance(held, bool):
        number = float(held)
        waited = number if 0 <= number <= wait else 0.0
    return [claimed(item, agent, waited) for item in items]


def _outcome(value: Any) -> Outcome:
    try:
        return Outcome(value)
    except ValueError:
        raise ReceiverError(
            200, "bad-answer", f"the relay answered with an outcome it has none of: {value!r:.80}"
        ) from None


def write_result(data: dict[str, Any]) -> WriteResult:
    error = data.get("error")
    reason = error.get("reason", "") if isinstance(error, dict) else ""
    return WriteResult(_outcome(data.get("outcome")), str(data.get("reason", "")), str(reason))


class ReceiverClient:
    """Synchronous receiver-API client over one pooled HTTP connection.

    Built by :mod:`melchior.mellan.transport`: the relay's certificate is verified (against
    ``ca_file``, else ``$MELLAN_CA_FILE``, else the public roots), a client certificate is
    presented when ``$MELLAN_CLIENT_CERT``/``$MELLAN_CLIENT_KEY`` (or ``tls``) name one,
    and a plain-HTTP URL to another machine is refused (:class:`ReceiverError`) before the
    token is sent anywhere."""

    def __init__(
        self,
        relay_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        ca_file: str | Path | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        self.relay_url = relay_url.rstrip("/")
        self._timeout = timeout
        try:
            self._http = transport.client(
                self.relay_url,
                token,
                tls or transport.client_tls(ca_file),
                base_url=self.relay_url,
                headers={"content-type": "application/json"},
                timeout=timeout,
            )
        except transport.TransportError as exc:
            raise ReceiverError(0, "insecure-transport", str(exc)) from None

    def __enter__(self) -> ReceiverClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> Any:
        try:
            response = self._http.post(
                path, content=encode(body).encode("utf-8"), timeout=timeout or self._timeout
            )
        except httpx.HTTPError as exc:
            why = transport.untrusted(exc) or f"cannot reach {self.relay_url}: {exc}"
            raise ReceiverError(0, "unreachable", why) from exc
        return answer(response)

    def _write(self, task_id: str, verb: str, body: dict[str, Any]) -> WriteResult:
        return write_result(self._post(f"/api/receiver/tasks/{task_id}/{verb}", body))

    def claim(
        self,
        *,
        limit: int = 1,
        wait: float = 25.0,
        lease_seconds: float = 30.0,
        worker: str | None = None,
        receiver: dict[str, Any] | None = None,
        agent: str | None = None,
    ) -> list[ClaimedTask | MalformedLease]:
        """Lease up to ``limit`` tasks, long-polling up to ``wait`` seconds; [] if none came.

        Each claim is also the receiver's heartbeat (the relay shows it online); ``receiver``
        says what it is: ``{"name", "version", "adapters": [...], "running", "concurrency"}``.
        Renewals count as heartbeats too, so a receiver too busy to claim stays online.
        Every lease is checked before it is handed over (:mod:`~melchior.mellan.client.leases`):
        one that fails comes back as a :class:`MalformedLease` saying why (a lease whose
        task is for another agent than ``agent``, when given, is one)."""
        body: dict[str, Any] = {"limit": limit, "wait": wait, "lease_seconds": lease_seconds}
        if worker:
            body["worker"] = worker
        if receiver is not None:
            body["receiver"] = receiver
        data = self._post("/api/receiver/claim", body, timeout=wait + self._timeout)
        return leases_of(data, agent, wait)

    def renew(self, task_id: str, epoch: int, *, lease_seconds: float = 30.0) -> WriteResult:
        """Extend the lease; ``lease_lost`` (reason "cancelled" on cancel) means stop now."""
        return self._write(task_id, "renew", {"epoch": epoch, "lease_seconds": lease_seconds})

    def progress(self, task_id: str, epoch: int, kind: str, body: dict[str, Any]) -> WriteResult:
        """Record a "status", "artifact" or "message" event the caller can stream."""
        return self._write(task_id, "progress", {"epoch": epoch, "kind": kind, "body": body})

    def complete(
        self,
        task_id: str,
        epoch: int,
        result: dict[str, Any],
        *,
        input_required: bool = False,
    ) -> WriteResult:
        """Record success (``{"message"?, "artifacts"?}``); a repeat answers DUPLICATE.

        Safe to retry after a timeout: the same epoch completing again is "duplicate", so
        reporting can be retried without ever re-running the work.
        """
        return self._write(
            task_id,
            "complete",
            {"epoch": epoch, "result": result, "input_required": input_required},
        )

    def fail(
        self,
        task_id: str,
        epoch: int,
        error: str,
        *,
        retryable: bool = True,
        retry_after: float | None = None,
    ) -> WriteResult:
        """Report a failure; retryable with attempts left queues it again after a backoff."""
        body: dict[str, Any] = {"epoch": epoch, "error": error, "retryable": retryable}
        if retry_after is not None:
            body["retry_after"] = retry_after
        return self._write(task_id, "fail", body)

    def cancel_ack(self, task_id: str, epoch: int) -> WriteResult:
        """Say the work of a cancelled task has stopped, freeing its session slot at once."""
        return self._write(task_id, "cancel-ack", {"epoch": epoch})

    # -- batches: one request and one transaction for many running tasks -----------------------
    def _results(self, path: str, body: dict[str, Any]) -> list[WriteResult]:
        data = self._post(path, body)
        return [
            WriteResult(_outcome(r.get("outcome")), str(r.get("reason", "")),
                        str(r.get("sentence", "")))
            for r in data["results"]
        ]  # fmt: skip

    def renew_many(
        self, leases: list[tuple[str, int]], *, lease_seconds: float = 30.0
    ) -> list[WriteResult]:
        """Renew several leases ``(task_id, epoch)`` at once (at most 100); results in order."""
        items = [{"task_id": t, "epoch": e} for t, e in leases]
        return self._results(
            "/api/receiver/renew", {"leases": items, "lease_seconds": lease_seconds}
        )

    def complete_many(
        self, completions: list[tuple[str, int, dict[str, Any]]]
    ) -> list[WriteResult]:
        """Record several successes ``(task_id, epoch, result)`` at once (at most 100), as
        safe to retry as ``complete``; results in order."""
        items = [{"task_id": t, "epoch": e, "result": r} for t, e, r in completions]
        return self._results("/api/receiver/complete", {"completions": items})


class AsyncReceiverClient:
    """The same API for asyncio code (the receiver process): one pooled connection, the
    same answers and errors as :class:`ReceiverClient`. Task ids are quoted into paths, so
    an id the relay sent can never address another endpoint."""

    def __init__(
        self, relay_url: str, token: str, *, timeout: float = 30.0, tls: ClientTls | None = None
    ) -> None:
        self.relay_url = relay_url.rstrip("/")
        self._timeout = timeout
        try:  # built by the transport module, like every mellan client (see ReceiverClient)
            self._http = transport.async_client(
                self.relay_url,
                token,
                tls or transport.client_tls(),
                base_url=self.relay_url,
                headers={"content-type": "application/json"},
                timeout=timeout,
            )
        except transport.TransportError as exc:
            raise ReceiverError(0, "insecure-transport", str(exc)) from None
        warm(self._http)  # the pool's per-request idle check, made cheap

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: dict[str, Any], read_for: float | None = None) -> Any:
        try:
            response = await self._http.post(
                path, content=encode(body).encode("utf-8"), timeout=read_for or self._timeout
            )
        except httpx.HTTPError as exc:
            raise ReceiverError(
                0, "unreachable", f"cannot reach {self.relay_url}: {exc or type(exc).__name__}"
            ) from exc
        return answer(response)

    async def _write(self, task_id: str, verb: str, body: dict[str, Any]) -> WriteResult:
        path = f"/api/receiver/tasks/{quote(task_id, safe='')}/{verb}"
        return write_result(await self._post(path, body))

    async def whoami(self) -> dict[str, Any]:
        """Who this credential is (``kind``, ``subject``, ``workspace``); a revoked or
        unknown credential raises :class:`ReceiverError` with status 401."""
        return await self._get_object("/api/whoami")

    async def agent_key(self, agent: str) -> Any:
        """``GET /api/keys/AGENT``: the public key the relay holds for ``agent`` (a caller
        of ours, as either side of a grant may read it), to be checked against the pin."""
        return await self._get_object(f"/api/keys/{quote(agent, safe='/')}")

    async def _get_object(self, path: str) -> dict[str, Any]:
        """GET ``path``: its JSON object, or the relay's refusal (or "unreachable") raised."""
        try:
            response = await self._http.get(path)
        except httpx.HTTPError as exc:
            raise ReceiverError(
                0, "unreachable", f"cannot reach {self.relay_url}: {exc or type(exc).__name__}"
            ) from exc
        data = _decoded(response)
        if response.status_code == 200 and isinstance(data, dict):
            return data
        raise refused(response, data)

    async def claim(
        self,
        *,
        limit: int = 1,
        wait: float = 25.0,
        lease_seconds: float = 30.0,
        worker: str | None = None,
        extra: dict[str, Any] | None = None,
        agent: str | None = None,
    ) -> list[ClaimedTask | MalformedLease]:
        body: dict[str, Any] = {"limit": limit, "wait": wait, "lease_seconds": lease_seconds}
        if worker:
            body["worker"] = worker
        body.update(extra or {})
        data = await self._post("/api/receiver/claim", body, read_for=wait + self._timeout)
        return leases_of(data, agent, wait)

    async def renew(self, task_id: str, epoch: int, *, lease_seconds: float = 30.0) -> WriteResult:
        return await self._write(task_id, "renew", {"epoch": epoch, "lease_seconds": lease_seconds})

    async def progress(
        self, task_id: str, epoch: int, kind: str, body: dict[str, Any]
    ) -> WriteResult:
        return await self._write(task_id, "progress", {"epoch": epoch, "kind": kind, "body": body})

    async def report(self, task_id: str, verb: str, body: dict[str, Any]) -> WriteResult:
        """Send a spooled report (``complete`` or ``fail`` with its body, epoch included)."""
        if verb not in ("complete", "fail"):
            raise ValueError(f"a report is complete or fail, not {verb!r}")
        return await self._write(task_id, verb, body)

    async def cancel_ack(self, task_id: str, epoch: int) -> WriteResult:
        return await self._write(task_id, "cancel-ack", {"epoch": epoch})
