"""What a stream's subscriber uses of its session, for tests without a gateway.

:class:`FakeSession` stands for :class:`gateway.session.session.Session`
where a :class:`~gateway.session.delivery.DeliveryQueue` (an AG-UI run's, an
AI SDK response's) is tested alone: its hub records who left, its warnings
are kept.
"""

from __future__ import annotations


class FakeHub:
    def __init__(self) -> None:
        self.gone: list[object] = []

    def unsubscribe(self, sub: object) -> bool:
        self.gone.append(sub)
        return True


class FakeSession:
    """``id``, ``hub``, ``warn`` and ``unregistered``: what a subscriber calls."""

    id = "sess_1"

    def __init__(self) -> None:
        self.hub = FakeHub()
        self.warnings: list[tuple[str, str, str]] = []

    def warn(self, subscription: str, reason: str, detail: str) -> None:
        self.warnings.append((subscription, reason, detail))

    def unregistered(self, sub: object, reason: str) -> None:
        pass
