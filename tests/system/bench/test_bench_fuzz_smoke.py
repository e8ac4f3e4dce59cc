"""``python -m bench --profile fuzz-smoke``: hostile HTTP against a real daemon, in seconds.

The run (bench/fuzz.py) must end with every check held: no 5xx, every request
answered, ``/healthz`` alive throughout, exit 0 on SIGTERM, a clean log. And
it must have reached what it is there to reach: each refusal of the boundary
(docs/protocol.md §15) and the routes behind it. Its checks are tested too: a
5xx or a missing answer is read as one, and the draws hold each named shape.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.fuzz import FUZZ_SMOKE, draw, final_status, run_fuzz

# slow: the bench's fuzz profile
pytestmark = pytest.mark.slow


def test_the_fuzz_smoke_passes_and_reaches_every_refusal(tmp_path: Path) -> None:
    outcome = run_fuzz(FUZZ_SMOKE, tmp_path)
    assert outcome.ok, outcome.failures[:10]
    assert outcome.sent == FUZZ_SMOKE.requests
    seen = set(outcome.statuses)
    assert {400, 403, 404, 405, 415, 421, 422} <= seen, outcome.statuses
    assert seen & {200, 201, 202}, outcome.statuses  # past the boundary too
    assert max(seen) < 500


def test_the_checks_read_a_5xx_and_a_missing_answer() -> None:
    assert final_status(b"HTTP/1.1 500 Internal Server Error\r\n\r\n") == 500
    assert final_status(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 x\r\n\r\n") == 503
    assert final_status(b"") is None


def test_the_draws_hold_every_named_shape() -> None:
    rng = random.Random(1)
    sent = [draw(rng, 8421, "sess_x") for _ in range(FUZZ_SMOKE.requests)]
    heads = [data.partition(b"\r\n\r\n")[0] for data in sent]
    shapes = {
        "text/plain": any(b"Content-Type: text/plain" in h for h in heads),
        "no content type": any(b"Content-Type" not in h and h.startswith(b"POST") for h in heads),
        "foreign origin": any(b"Origin: https://evil.example" in h for h in heads),
        "null origin": any(b"Origin: null" in h for h in heads),
        "rebinding host": any(b"Host: evil.example" in h for h in heads),
        "no host": any(b"Host:" not in h for h in heads),
        "CL+TE": any(b"Content-Length" in h and b"Transfer-Encoding" in h for h in heads),
        "TE gzip": any(b"Transfer-Encoding: gzip" in h for h in heads),
        "traversal": any(b"%2e%2e" in h or b"/../" in h for h in heads),
        "absolute": any(b" http://evil.example/" in h for h in heads),
        "repeated query": any(b"limit=5&limit=6" in h or b"attach=a&attach=b" in h for h in heads),
        "invalid UTF-8": any(b'": "a\xff' in d or b'": "a\xc3b' in d for d in sent),
    }
    assert all(shapes.values()), [name for name, held in shapes.items() if not held]
