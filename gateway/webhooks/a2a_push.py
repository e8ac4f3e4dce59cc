"""A2A push notifications in the webhook outbox (docs/doors/a2a.md "Push notifications").

An outbox lane whose hook is ``a2a.{config id}`` (a webhook's name has no dot)
holds a task's push notifications (gateway.doors.a2a.push puts them there):
each entry's body is a :class:`PushDelivery`, the client's URL and token and
the A2A ``StreamResponse`` to POST. The delivery loop (gateway.webhooks.delivery)
sends it as a webhook's delivery (signed, in order, retried), with the token as
``X-A2A-Notification-Token``, once :func:`url_problem` says the URL is still
one the operator allows.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence

import msgspec

HOOK_PREFIX = "a2a."
"""An outbox lane's hook of a push config is ``a2a.{config id}``."""
MAX_URL = 2048
TOKEN_HEADER = "X-A2A-Notification-Token"


class PushDelivery(msgspec.Struct, frozen=True):
    """An outbox entry's body on an ``a2a.`` lane: where it goes, and what."""

    url: str
    token: str
    body: msgspec.Raw


def url_problem(url: str, prefixes: Sequence[str]) -> str | None:
    """Why a client's push URL is refused (None: taken). It begins with one of the
    operator's prefixes (each ``scheme://host/``, gateway.config) at a path segment's
    end (:func:`within`), is at most :data:`MAX_URL` characters of visible ASCII, and
    its path has no dot segment and no backslash (it cannot leave the prefix's path)
    and no fragment."""
    if not prefixes:
        return "push notifications are not offered"
    if len(url) > MAX_URL or not url.isascii() or not url.isprintable() or " " in url:
        return f"a URL of at most {MAX_URL} visible ASCII characters is expected"
    if not any(within(url, prefix) for prefix in prefixes):
        return "the URL is not one the operator allows ([a2a] push_url_prefixes)"
    path = url.partition("?")[0]
    segments = urllib.parse.unquote(path).replace("\\", "/").split("/")
    if "\\" in url or "#" in url or any(s in (".", "..") for s in segments[3:]):
        return "the URL's path has a dot segment, a backslash or a fragment"
    return None


def within(url: str, prefix: str) -> bool:
    """Whether ``url`` begins with ``prefix`` where a path segment ends (docs/doors/a2a.md
    "Push notifications"): ``https://HOST/a2a`` takes ``/a2a``, ``/a2a/...`` and
    ``/a2a?...``, never ``/a2a-admin`` (a prefix ending with ``/`` ends a segment)."""
    return url.startswith(prefix) and (
        prefix.endswith("/") or url[len(prefix) : len(prefix) + 1] in ("", "/", "?")
    )
