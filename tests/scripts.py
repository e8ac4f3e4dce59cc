"""Scripts of the scripted model that many tests send as a turn's content (docs/reference.md).

A turn whose text is one of these (as JSON) plays it: ``rounds`` of text,
``lorem`` words, tool calls; ``delay_ms`` between deltas.
"""

from __future__ import annotations

import json

TEXT = {"script": {"rounds": [[{"text": "Hello there, friend."}]]}}
"""One round of text."""

LONG_NAP = {
    "script": {
        "rounds": [
            [{"text": "Napping."}, {"tool_use": {"name": "sleep", "input": {"seconds": 60}}}],
            [{"text": "Awake."}],
        ]
    }
}
"""Text, then a tool that runs for a minute: a turn that stays in flight."""

SLOW_TEXT = {"script": {"delay_ms": 5, "rounds": [[{"lorem": 400}]]}}
"""400 words, 5 ms apart: a reply that streams for about two seconds."""

LONG_TEXT = {"script": {"delay_ms": 0, "rounds": [[{"lorem": 400}]]}}
"""400 words at once: a turn of some 400 events, as fast as the gateway streams them."""

WORKER_TASK = json.dumps({"script": {"rounds": [[{"text": "worked"}]]}})
"""A delegated worker's task: one round of text."""

DELEGATE = {
    "script": {
        "rounds": [
            [{"tool_use": {"name": "delegate", "input": {"task": WORKER_TASK}}}],
            [{"text": "delegated"}],
        ]
    }
}
"""A turn that delegates :data:`WORKER_TASK` to a worker session, then says so."""
