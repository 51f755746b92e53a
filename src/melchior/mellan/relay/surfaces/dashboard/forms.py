"""Form bodies, read within bounds: a dashboard form is small, so a body past
:data:`FORM_LIMIT` bytes, a body that is not UTF-8, or more than :data:`MAX_FIELDS`
fields is refused before any of it is used."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import Request

from melchior.mellan.relay.refusals import ApiError
from melchior.mellan.relay.surfaces.body import BodyError, media_type, read_bytes

FORM_LIMIT = 64 * 1024
MAX_FIELDS = 300
FORM_TYPE = "application/x-www-form-urlencoded"


class Form:
    """The fields of a posted form, in order; repeated names keep every value."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs

    def get(self, name: str, default: str = "") -> str:
        for key, value in self.pairs:
            if key == name:
                return value
        return default

    def all(self, name: str) -> list[str]:
        return [value for key, value in self.pairs if key == name]


async def read_form(request: Request, deadline: float) -> Form:
    """The request's urlencoded form, or an :class:`ApiError` saying what was wrong."""
    if media_type(request) != FORM_TYPE:
        raise ApiError(
            415,
            "unsupported-media-type",
            f"the dashboard takes forms as {FORM_TYPE}; submit the page's own form",
        )
    try:
        raw = await read_bytes(request, FORM_LIMIT, deadline)
    except BodyError as exc:
        raise ApiError(exc.status, exc.code, exc.reason) from None
    try:
        text = raw.decode("utf-8")
        pairs = parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FIELDS, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise ApiError(
            400,
            "bad-form",
            f"the form is not UTF-8 text or has more than {MAX_FIELDS} fields",
        ) from None
    return Form(pairs)
