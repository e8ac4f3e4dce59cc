"""Subscription filters and presets (docs/protocol.md sections 3 and 5).

A client's filter is validated strictly (an unknown type or actor is a
``subscribe_error: invalid_filter`` naming it), presets are expanded, and the
result is compiled once into a hashable :class:`FilterKey`, so that the hub can
match each event once per *distinct* filter rather than once per client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import msgspec

from gateway.errors import SubscribeRejected
from gateway.protocol.events import ACTORS, CATALOG_TYPES, EVENT_TYPES, STREAMING_TYPES


class Filter(msgspec.Struct, forbid_unknown_fields=True):
    """``Filter`` of docs/protocol.md §3. ``null`` lists mean "all"."""

    event_types: list[str] | None = None
    actors: list[str] | None = None
    include_worker_sessions: bool = False


def _chat_types() -> list[str]:
    """``preset:chat``: streaming-only types, ``tool.*``, ``permission.*``,
    ``route.decided``, ``turn.*``, ``llm.call_failed``, ``feedback.recorded``,
    ``history.rewound``, ``session.forked``, ``delegate.*`` (docs/protocol.md §5)."""
    prefixes = ("tool.", "permission.", "turn.", "delegate.")
    singles = {
        "route.decided",
        "llm.call_failed",
        "feedback.recorded",
        "history.rewound",
        "session.forked",
    }
    return [
        t for t in EVENT_TYPES if t in STREAMING_TYPES or t in singles or t.startswith(prefixes)
    ]


PRESETS: dict[str, Filter] = {
    "preset:full": Filter(event_types=list(EVENT_TYPES)),
    "preset:chat": Filter(event_types=_chat_types()),
}


class Routable(Protocol):
    """What a filter looks at: an event's type and actor."""

    @property
    def type(self) -> str: ...

    @property
    def actor(self) -> str: ...


R = TypeVar("R", bound=Routable)


TO_ANCESTORS = frozenset({"permission.requested", "permission.resolved"})
"""A worker's events that reach every ancestor's stream whatever ``include_worker_sessions``
says (docs/protocol.md §5): someone has to answer them. The filter's types and actors
still apply."""


@dataclass(frozen=True, slots=True)
class FilterKey:
    """A resolved filter in hashable form; equal filters share one key."""

    event_types: frozenset[str] | None
    actors: frozenset[str] | None
    include_worker_sessions: bool

    def matches(self, type_: str, actor: str, from_worker: bool) -> bool:
        if from_worker and not self.include_worker_sessions and type_ not in TO_ANCESTORS:
            return False
        if self.event_types is not None and type_ not in self.event_types:
            return False
        return self.actors is None or actor in self.actors

    def select(self, events: Sequence[R], from_worker: bool) -> Sequence[R]:
        """The events of a batch that match, in order: :meth:`matches` for a whole batch.

        The hub's hot path: one pass per distinct filter, and no pass at all
        for a filter that takes everything.
        """
        types, actors = self.event_types, self.actors
        if from_worker and not self.include_worker_sessions:
            return [
                e
                for e in events
                if e.type in TO_ANCESTORS
                and (types is None or e.type in types)
                and (actors is None or e.actor in actors)
            ]
        if types is None and actors is None:
            return events
        return [
            e
            for e in events
            if (types is None or e.type in types) and (actors is None or e.actor in actors)
        ]


def resolve_filter(raw: Filter | str) -> tuple[Filter, FilterKey]:
    """Validate a client's filter and expand presets.

    Returns:
        The resolved filter (sent back in ``subscribe_ack.resolved_filter``) and
        its compiled key.

    Raises:
        SubscribeRejected: ``invalid_filter``, naming the offending preset, type or actor.
    """
    if isinstance(raw, str):
        resolved_preset = _RESOLVED_PRESETS.get(raw)
        if resolved_preset is None:
            raise SubscribeRejected(
                "invalid_filter",
                f"unknown preset {raw!r}; use 'preset:chat', 'preset:full' or a filter object",
            )
        return resolved_preset  # shared by every connection that asks for it
    resolved = raw
    for t in resolved.event_types or ():
        if t not in EVENT_TYPES:
            raise SubscribeRejected(
                "invalid_filter", f"unknown event type {t!r} in filter.event_types"
            )
    for a in resolved.actors or ():
        if a not in ACTORS:
            raise SubscribeRejected(
                "invalid_filter",
                f"unknown actor {a!r} in filter.actors; actors are {', '.join(ACTORS)}",
            )
    key = FilterKey(
        None if resolved.event_types is None else frozenset(resolved.event_types),
        None if resolved.actors is None else frozenset(resolved.actors),
        resolved.include_worker_sessions,
    )
    return resolved, _KEYS.setdefault(key, key)  # equal filters share one key object


# Interned: 10,000 idle connections on two presets hold two filters, not 10,000.
_KEYS: dict[FilterKey, FilterKey] = {}
_RESOLVED_PRESETS: dict[str, tuple[Filter, FilterKey]] = {
    name: resolve_filter(Filter(list(p.event_types or ()), None, False))
    for name, p in PRESETS.items()
}


__all__ = ["CATALOG_TYPES", "PRESETS", "TO_ANCESTORS", "Filter", "FilterKey", "resolve_filter"]
