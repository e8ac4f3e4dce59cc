"""The HTTP side of ``Idempotency-Key`` (gateway.doors.rest.idempotency): header, fingerprint."""

from __future__ import annotations

import pytest

from gateway.doors.rest.idempotency import fingerprint, key_of
from gateway.errors import ApiError
from gateway.http.server import Request


def request(**headers: str) -> Request:
    return Request("POST", "/sessions", {}, headers, b"{}", "test")


@pytest.mark.parametrize("value", ["a", "k" * 255, " ~", "sess key: 1/2"])
def test_a_key_is_1_to_255_printable_ascii_characters(value: str) -> None:
    assert key_of(request(**{"idempotency-key": value})) == value


@pytest.mark.parametrize("value", ["", "k" * 256, "caf\u00e9", "a\tb", "a\x7f", "\x00"])
def test_anything_else_is_400_naming_the_header(value: str) -> None:
    with pytest.raises(ApiError) as refused:
        key_of(request(**{"idempotency-key": value}))
    assert (refused.value.status, refused.value.code) == (400, "invalid_idempotency_key")
    assert "Idempotency-Key" in refused.value.message


def test_no_header_is_no_key() -> None:
    assert key_of(request()) is None


def test_the_fingerprint_is_of_the_canonical_body() -> None:
    same = fingerprint("POST", "/sessions", b'{"a": 1, "b": {"d": [1, 2], "c": null}}')
    assert same == fingerprint("POST", "/sessions", b'{"b":{"c":null,"d":[1,2]},"a":1}')
    assert fingerprint("POST", "/sessions", b"") == fingerprint("POST", "/sessions", b"{}")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/sessions", b'{"a": 2}'),
        ("POST", "/sessions/sess_2/turns", b'{"a": 1}'),
        ("PUT", "/sessions", b'{"a": 1}'),
        ("POST", "/sessions", b'{"a": [1]}'),
        ("POST", "/sessions", b"not json"),
    ],
)
def test_another_method_path_or_body_is_another_request(
    method: str, path: str, body: bytes
) -> None:
    assert fingerprint(method, path, body) != fingerprint("POST", "/sessions", b'{"a": 1}')
