"""Standard Webhooks signatures (https://www.standardwebhooks.com, docs/doors/webhooks.md).

A delivery carries three headers: ``webhook-id`` (the gateway's event id, so a
receiver drops a duplicate), ``webhook-timestamp`` (the attempt's time, Unix
seconds) and ``webhook-signature``: ``v1,`` and the base64 HMAC-SHA256 of
``{id}.{timestamp}.{body}``, keyed by the secret's bytes (the base64 after
``whsec_``). The timestamp is the attempt's, so a retry is signed again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

SECRET_PREFIX = "whsec_"


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret (validated by gateway.config); padding optional."""
    body = secret.removeprefix(SECRET_PREFIX)
    return base64.b64decode(body + "=" * (-len(body) % 4))


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,`` and the base64 HMAC-SHA256 of ``{msg_id}.{timestamp}.{body}``."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode("ascii")


def headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one attempt: the three signed ones and the body's type."""
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(key, msg_id, timestamp, body),
    }
