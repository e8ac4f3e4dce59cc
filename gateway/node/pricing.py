"""What a model call cost: ``cost_usd`` from ``[model.prices]`` (docs/protocol.md §5)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.config import Price
from gateway.protocol.shapes import Usage


def pricing(prices: Mapping[str, Price], model: str) -> Callable[[Usage], float | None]:
    """``cost_usd`` of a usage on ``model`` (0 when unpriced)."""
    price = prices.get(model)

    def cost(usage: Usage) -> float | None:
        if price is None:
            return 0.0
        return (
            usage.input_tokens * price.input_per_mtok
            + usage.output_tokens * price.output_per_mtok
            + (usage.cache_read_input_tokens or 0) * price.cache_read_per_mtok
            + (usage.cache_creation_input_tokens or 0) * price.cache_write_per_mtok
        ) / 1_000_000

    return cost
