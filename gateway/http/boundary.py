"""The boundary: who may connect over HTTP (docs/protocol.md §15), and with which key.

:class:`Boundary`: which ``Host`` names the gateway answers (421 otherwise:
DNS rebinding) and which ``Origin`` may send it requests (403 otherwise:
cross-site requests), with the CORS answers for the origins listed in
``[auth] allowed_origins``. :func:`authenticate`: the caller a request's
``Authorization: Bearer`` names, by the keys of :mod:`gateway.tenancy`.
"""

from __future__ import annotations

import ipaddress
import logging
import urllib.parse
from collections.abc import Mapping

from gateway.config import Config
from gateway.errors import ApiError
from gateway.http.server import Request
from gateway.tenancy import ApiKeys

log = logging.getLogger("gateway.auth")


def _event(logger: logging.Logger, level: int, name: str, message: str, **fields: object) -> None:
    """Log the event ``name`` with its fields, as gateway.logs formats them (docs/operating.md)."""
    logger.log(level, message, extra={"event": name, "fields": fields})


# --- the boundary: Host and Origin (docs/protocol.md §15) --------------------------

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
"""The names a loopback-bound gateway answers by default (``[server] allowed_hosts`` empty)."""

_WILDCARDS = frozenset({"", "0.0.0.0", "::"})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}

CORS_METHODS = "GET, HEAD, POST, DELETE"
CORS_HEADERS = "Authorization, Content-Type, Idempotency-Key, Last-Event-ID"
CORS_MAX_AGE_S = 600
"""How long a browser may keep a preflight's answer (Chromium caps it at 7200)."""


def host_name(value: str, *, bare_ipv6: bool = False) -> str | None:
    """The name of a ``Host`` value (RFC 9110 section 7.2), port dropped, lower case.

    ``name``, ``name:port``, ``[v6]`` or ``[v6]:port``; a trailing dot is
    dropped (``localhost.`` is ``localhost``). None for anything else (an
    empty value, two values joined by a comma, a port that is not digits).
    ``bare_ipv6``: an unbracketed IPv6 address is also accepted (a config
    entry may say ``::1``; a Host header may not).
    """
    text = value.strip().lower()
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not (rest[:1] == ":" and rest[1:].isdigit())):
            return None
        return inside if _is_ipv6(inside) else None
    if text.count(":") > 1:
        return text if bare_ipv6 and _is_ipv6(text) else None
    name, colon, port = text.partition(":")
    if colon and not port.isdigit():
        return None
    name = name.removesuffix(".")
    if not name or any(c in name for c in " ,/\\@?#[]"):
        return None
    return name


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``text`` as an IP address, or None for a name (or anything else)."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _is_ipv6(text: str) -> bool:
    return isinstance(_address(text), ipaddress.IPv6Address)


def _is_ip(name: str) -> bool:
    return _address(name) is not None


def canonical_origin(value: str) -> str | None:
    """An origin as one string to compare: ``scheme://host:port``, lower case, port explicit.

    ``null`` stays ``null``. None for what is not an origin (a path, a query,
    credentials, a scheme other than http(s) or ws(s)).
    """
    text = value.strip().lower()
    if text == "null":
        return text
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    if (
        parts.scheme not in _DEFAULT_PORTS
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
        or not parts.hostname
    ):
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host.removesuffix('.')}:{port or _DEFAULT_PORTS[parts.scheme]}"


class Boundary:
    """The ``Host`` names and the ``Origin``\\ s the gateway answers (docs/protocol.md §15).

    **Host** (DNS rebinding: a page of ``evil.example`` whose name is made to
    resolve to 127.0.0.1 reaches the gateway as a same-origin page, but its
    requests say ``Host: evil.example``): a request whose Host name, port
    aside, is not allowed is refused with 421 ``misdirected_request``, on
    every route (``/healthz`` included: a load balancer's probe sends a name
    the operator lists) and the stream handshake. A request with no Host
    (HTTP/1.0) is refused the same way. Allowed:

    - ``[server] allowed_hosts`` when it is set;
    - when it is empty: the loopback names (``localhost``, ``127.0.0.1``,
      ``[::1]``); and when the daemon binds an address that is not loopback,
      that address itself (bound to ``0.0.0.0`` or ``::``: any IP address
      literal, which no DNS answer can rebind), with a warning at start
      (:func:`warn_open_hosts`) that ``allowed_hosts`` should name the
      gateway's host names;
    - in both cases, the host of ``[server] public_url``.

    **Origin** (a page of another site that sends a request): a request that
    carries ``Origin`` is refused with 403 ``origin_not_allowed`` unless it
    is the gateway's own origin (the request's scheme and Host, or
    ``public_url``'s) or is listed in ``[auth] allowed_origins``; ``null``
    only when listed. A listed origin gets the CORS headers
    (:meth:`cors_headers`) and its preflights answered (:meth:`preflight_headers`);
    the own origin needs neither. Origins compare scheme, host and port
    (default ports made explicit), case-insensitively.
    """

    def __init__(self, config: Config) -> None:
        server = config.server
        public = urllib.parse.urlsplit(server.public_url) if server.public_url else None
        public_host = host_name(public.netloc.rpartition("@")[2]) if public else None
        self.any_ip = False
        hosts: set[str] = set()
        if server.allowed_hosts:
            hosts = {h for entry in server.allowed_hosts if (h := host_name(entry, bare_ipv6=True))}
        else:
            hosts = set(LOOPBACK_NAMES)
            bound = host_name(server.host, bare_ipv6=True) or server.host.lower()
            if server.host.strip() in _WILDCARDS:
                self.any_ip = True
            elif not _is_loopback(bound):
                hosts.add(bound)
        if public_host:
            hosts.add(public_host)
        self.hosts = frozenset(hosts)
        self.public_origin = canonical_origin(server.public_url) if server.public_url else None
        self.origins = frozenset(
            canonical_origin(entry) or entry.strip().lower()
            for entry in config.auth.allowed_origins
        )

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` header value is answered."""
        name = host_name(host) if host is not None else None
        if name is None:
            return False
        return name in self.hosts or (self.any_ip and _is_ip(name))

    def check_host(self, host: str | None) -> None:
        """Raises: ApiError 421 ``misdirected_request`` for a Host that is not allowed."""
        if not self.host_allowed(host):
            shown = "no Host header" if host is None else f"Host {host[:100]!r}"
            raise ApiError(
                421,
                "misdirected_request",
                f"{shown} is not a name this gateway answers"
                " ([server] allowed_hosts; docs/protocol.md §15)",
            )

    def check_origin(self, origin: str | None, scheme: str, host: str | None) -> str | None:
        """The listed origin to send CORS headers to, or None (no Origin, or the own one).

        Raises:
            ApiError: 403 ``origin_not_allowed`` for any other Origin.
        """
        if origin is None:
            return None  # not sent by a browser page: nothing cross-site about it
        canonical = canonical_origin(origin)
        if canonical is not None and canonical != "null":
            own = canonical_origin(f"{scheme}://{host}") if host else None
            if canonical in (own, self.public_origin):
                return None
        if (canonical or origin.strip().lower()) in self.origins:
            return origin.strip()
        raise ApiError(
            403,
            "origin_not_allowed",
            f"Origin {origin[:100]!r} is not allowed ([auth] allowed_origins)",
        )

    @staticmethod
    def cors_headers(origin: str) -> list[tuple[str, str]]:
        """The headers of an actual answer to a listed origin."""
        return [
            ("Access-Control-Allow-Origin", origin),
            ("Access-Control-Expose-Headers", "Retry-After, Idempotent-Replayed"),
            ("Vary", "Origin"),
        ]

    @staticmethod
    def preflight_headers(origin: str) -> list[tuple[str, str]]:
        """The headers of a preflight's 204 to a listed origin."""
        return [
            ("Access-Control-Allow-Origin", origin),
            ("Access-Control-Allow-Methods", CORS_METHODS),
            ("Access-Control-Allow-Headers", CORS_HEADERS),
            ("Access-Control-Max-Age", str(CORS_MAX_AGE_S)),
            ("Vary", "Origin"),
        ]


def _is_loopback(name: str) -> bool:
    address = _address(name)
    return name in LOOPBACK_NAMES or (address is not None and address.is_loopback)


def warn_open_hosts(config: Config) -> None:
    """Log once, at start, that a gateway bound beyond loopback should name its hosts."""
    server = config.server
    if server.allowed_hosts or _is_loopback(host_name(server.host, bare_ipv6=True) or server.host):
        return
    _event(
        log,
        logging.WARNING,
        "allowed_hosts_unset",
        f"listening on {server.host!r} with [server] allowed_hosts empty: only the loopback"
        " names, the bound address (any IP address when bound to all), and public_url's host"
        " are answered; set allowed_hosts to the names clients use",
        host=server.host,
    )


# --- the key ------------------------------------------------------------------------


def authenticate(keys: ApiKeys, req: Request) -> str | None:
    """The caller: the id of its API key, or ``None`` where no keys are configured.

    Raises:
        ApiError: 401 ``unauthorized`` without ``Authorization: Bearer``, 403
            ``forbidden`` for a key that is not (or no longer) accepted.
    """
    return caller_of(keys, req.headers)


def caller_of(keys: ApiKeys, headers: Mapping[str, str]) -> str | None:
    """:func:`authenticate` from a request's headers alone (a large body's head, before
    the body is read: gateway.http.server.HttpLimits)."""
    if not keys.enabled:
        return None
    header = headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(401, "unauthorized", "send Authorization: Bearer <api key>")
    caller = keys.identify(key.strip())
    if caller is None:
        raise ApiError(403, "forbidden", "the API key is not valid")
    return caller
