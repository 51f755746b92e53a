"""Every A2A error as a gRPC status: the code of the spec's table and a
``google.rpc.Status`` detail that decodes to the JSON bindings' own ErrorInfo."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from hypothesis import given
from hypothesis import strategies as st

from melchior.mellan.relay.surfaces.a2a import errors
from melchior.mellan.relay.surfaces.a2a.grpc_binding import DETAILS_KEY, status_of

SPEC = {  # the reference table: A2A error -> gRPC status
    errors.TaskNotFound: "NOT_FOUND",
    errors.TaskNotCancelable: "FAILED_PRECONDITION",
    errors.PushNotificationNotSupported: "FAILED_PRECONDITION",
    errors.UnsupportedOperation: "FAILED_PRECONDITION",
    errors.ContentTypeNotSupported: "INVALID_ARGUMENT",
    errors.InvalidAgentResponse: "INTERNAL",
    errors.ExtendedAgentCardNotConfigured: "FAILED_PRECONDITION",
    errors.ExtensionSupportRequired: "FAILED_PRECONDITION",
    errors.VersionNotSupported: "FAILED_PRECONDITION",
}


def decoded(trailing: tuple[tuple[str, str | bytes], ...]) -> status_pb2.Status:
    (raw,) = [v for k, v in trailing if k == DETAILS_KEY]
    assert isinstance(raw, bytes)
    return status_pb2.Status.FromString(raw)


@pytest.mark.parametrize("cls", errors.ALL_A2A, ids=lambda c: c.__name__)
def test_the_nine_a2a_errors_have_the_spec_codes(cls: type[errors.A2AError]) -> None:
    code, message, trailing = status_of(cls())
    assert code is getattr(grpc.StatusCode, SPEC[cls])
    status = decoded(trailing)
    assert (status.code, status.message) == (code.value[0], message)
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.reason, info.domain) == (cls.reason, "a2a-protocol.org")


text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)


@given(
    cls=st.sampled_from(
        [*errors.ALL_A2A, errors.InvalidParams, errors.Unauthenticated, errors.Forbidden,
         errors.Unavailable, errors.PayloadTooLarge, errors.MethodNotFound]
    ),
    message=text,
    metadata=st.dictionaries(text, text, max_size=4),
    violations=st.lists(st.tuples(text, text), max_size=3),
)  # fmt: skip
def test_any_error_round_trips_through_the_status_detail(
    cls: type[errors.A2AError],
    message: str,
    metadata: dict[str, str],
    violations: list[tuple[str, str]],
) -> None:
    err = cls(message or None, metadata=metadata, violations=violations)
    code, said, trailing = status_of(err)
    assert code is not grpc.StatusCode.OK
    assert code.name == err.grpc
    status = decoded(trailing)
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.reason, info.domain, dict(info.metadata)) == (err.reason, err.domain, metadata)
    assert said == err.message
    if violations:
        bad = error_details_pb2.BadRequest()
        assert status.details[1].Unpack(bad)
        assert [(v.field, v.description) for v in bad.field_violations] == violations
    else:
        assert len(status.details) == 1


def test_a_quota_refusal_says_when_to_retry() -> None:
    _, _, trailing = status_of(errors.QuotaExceeded("slow down", limit="send_rate", retry_after=7))
    assert ("retry-after", "7") in trailing
