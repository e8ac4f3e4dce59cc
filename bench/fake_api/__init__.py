"""A local stand-in for the model APIs, shared by ``bench/ttft.py`` and the provider tests.

- :mod:`bench.fake_api.server`: a local HTTP server that replays recorded SSE
  transcripts byte for byte and records each request it was sent.
- ``bench/fake_api/transcripts/``: the transcripts, written to the documented
  streaming formats (Anthropic Messages API events; OpenAI Chat Completions
  chunks).

It lives in ``bench/`` because the bench runs without the test suite (``python
-m bench``); the tests import it from here.
"""

from __future__ import annotations

from bench.fake_api.server import (
    Cut,
    FakeServer,
    Json,
    Recorded,
    Replay,
    context_length_exceeded,
    prompt_too_long,
    transcript,
)

__all__ = [
    "Cut",
    "FakeServer",
    "Json",
    "Recorded",
    "Replay",
    "context_length_exceeded",
    "prompt_too_long",
    "transcript",
]
