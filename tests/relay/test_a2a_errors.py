"""The A2A error table, rendered both ways, checked against the a2a-sdk's own mapping."""

from __future__ import annotations

import pytest
from a2a.utils.errors import A2A_ERROR_MAPPING, JSON_RPC_ERROR_CODE_MAP

from melchior.mellan.relay.store.base import StoreUnavailable
from melchior.mellan.relay.surfaces.a2a import errors

SDK_BY_REASON = {m.reason: (cls, m) for cls, m in A2A_ERROR_MAPPING.items()}


@pytest.mark.parametrize("cls", errors.ALL_A2A, ids=lambda c: c.__name__)
def test_codes_statuses_and_reasons_match_the_sdk(cls: type[errors.A2AError]) -> None:
    sdk_cls, mapping = SDK_BY_REASON[cls.reason]
    assert cls.code == JSON_RPC_ERROR_CODE_MAP[sdk_cls]
    assert cls.grpc == mapping.grpc_status
    # the one deliberate difference: ContentTypeNotSupported is 415 (TCK, HTTP), not 400
    assert cls.http == (415 if cls is errors.ContentTypeNotSupported else mapping.http_code)


def test_both_renderings_carry_error_info() -> None:
    err = errors.TaskNotFound(metadata={"taskId": "t1"}, violations=[("id", "unknown")])
    rpc = err.jsonrpc_error()
    assert rpc["code"] == -32001
    assert rpc["message"] == "Task not found"
    info, bad = rpc["data"]
    assert info == {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "TASK_NOT_FOUND",
        "domain": "a2a-protocol.org",
        "metadata": {"taskId": "t1"},
    }
    assert bad["fieldViolations"] == [{"field": "id", "description": "unknown"}]
    rest = err.rest_body()["error"]
    assert (rest["code"], rest["status"], rest["details"]) == (404, "NOT_FOUND", rpc["data"])


def test_unexpected_failures_say_little_and_outages_are_503() -> None:
    assert isinstance(errors.translate(StoreUnavailable("db down")), errors.Unavailable)
    assert errors.translate(StoreUnavailable("x")).http == 503
    internal = errors.translate(RuntimeError("secret detail"))
    assert internal.http == 500
    assert "secret" not in internal.message
    same = errors.TaskNotFound()
    assert errors.translate(same) is same
