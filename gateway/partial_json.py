"""Best-effort parsing of a JSON object cut anywhere (docs/protocol.md §8).

A tool block's input arrives as ``input_json_delta`` fragments that only parse
once the block ends. When the stream stops early (a cancel, a provider error),
``tool.use_end`` still owes the client a ``final_input``: docs/protocol.md §8
says "what parses, else ``{}``". This module decides, in one place, what
"what parses" means for a prefix of a JSON object:

- complete key/value pairs are kept;
- a string *value* cut short is closed (a half-sent escape sequence is dropped);
- a trailing key, colon or comma without its value is dropped;
- a number at the very end is dropped, since ``1`` may be the start of ``10``;
  ``true``, ``false`` and ``null`` cannot grow, so they are kept;
- open arrays and objects are closed, so ``{"a": [1, {"b": 2`` gives
  ``{"a": [1, {}]}`` (the ``2`` is a number at the very end);
- input that is malformed rather than cut keeps what came before the fault;
- anything that is not an object (an array, a string, nothing at all) gives
  ``{}``.

PyPI's ``partial-json-parser`` does a similar job, but keeps partial numbers
and partial keys by default and would be a dependency for some eighty lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import msgspec

_WHITESPACE = r"[ \t\n\r]*"
# The inside of a JSON string: plain characters and complete escape sequences.
_STRING_BODY = r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*'

_TOKEN = re.compile(
    rf"""{_WHITESPACE}(?:
        (?P<string>{_STRING_BODY}")
      | (?P<punct>[{{}}\[\],:])
      | (?P<scalar>true|false|null
          | -?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?(?=[ \t\n\r,\]}}])
        )
    )""",
    re.VERBOSE,
)
# A string cut short, possibly in the middle of an escape sequence (dropped).
_CUT_STRING = re.compile(rf"{_WHITESPACE}({_STRING_BODY})(?:\\(?:u[0-9a-fA-F]{{0,3}})?)?\Z")
# A high surrogate escape whose low half was cut off: msgspec refuses it alone.
_DANGLING_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\Z")

# What the scanner expects next, and where each token leads. ``_AFTER_VALUE``
# is resolved by the enclosing container into ``_AFTER_MEMBER`` or ``_AFTER_ITEM``.
_VALUE = "value"  # after ':' or after ',' in an array
_ITEM_OR_CLOSE = "value or ]"  # right after '['
_KEY = "key"  # after ',' in an object
_KEY_OR_CLOSE = "key or }"  # right after '{'
_COLON = "colon"  # after a key
_AFTER_MEMBER = ", or }"  # after a complete value in an object
_AFTER_ITEM = ", or ]"  # after a complete value in an array
_AFTER_VALUE = "after a value"

_VALUE_MOVES = {
    "{": _KEY_OR_CLOSE,
    "[": _ITEM_OR_CLOSE,
    "string": _AFTER_VALUE,
    "scalar": _AFTER_VALUE,
}
_MOVES: dict[tuple[str, str], str] = {
    **{(_VALUE, token): then for token, then in _VALUE_MOVES.items()},
    **{(_ITEM_OR_CLOSE, token): then for token, then in _VALUE_MOVES.items()},
    (_ITEM_OR_CLOSE, "]"): _AFTER_VALUE,
    (_KEY_OR_CLOSE, "string"): _COLON,
    (_KEY_OR_CLOSE, "}"): _AFTER_VALUE,
    (_KEY, "string"): _COLON,
    (_COLON, ":"): _VALUE,
    (_AFTER_MEMBER, ","): _KEY,
    (_AFTER_MEMBER, "}"): _AFTER_VALUE,
    (_AFTER_ITEM, ","): _VALUE,
    (_AFTER_ITEM, "]"): _AFTER_VALUE,
}
# Where the text so far closes into valid JSON by closing its open containers.
_SAFE = frozenset({_KEY_OR_CLOSE, _ITEM_OR_CLOSE, _AFTER_MEMBER, _AFTER_ITEM})
_CLOSERS = {"{": "}", "[": "]"}


def best_effort(text: str) -> dict[str, Any]:
    """Parse a possibly truncated JSON object; see the module docstring for the rules.

    Args:
        text: the ``partial_json`` fragments of a tool block, joined.

    Returns:
        The largest object the text's complete parts describe; ``{}`` when the
        text is not (the start of) a JSON object. Never raises.
    """
    for candidate in _candidates(text):
        try:
            value = msgspec.json.decode(candidate)
        except msgspec.DecodeError:
            continue
        return value if isinstance(value, dict) else {}
    return {}


def _candidates(text: str) -> Iterator[str]:
    """Texts to try decoding, best first: the text itself, then its repairs."""
    yield text
    stack: list[str] = []  # the closers of the open containers, innermost last
    expect = _VALUE
    safe_end, safe_closers = -1, ""  # the longest prefix that closes into valid JSON
    pos = 0
    while match := _TOKEN.match(text, pos):
        token = match["punct"] or match.lastgroup or ""
        if not stack and token != "{":
            return  # not an object, or trailing junk after a whole one
        then = _MOVES.get((expect, token))
        if then is None:
            break  # malformed rather than cut: keep what came before
        if token in _CLOSERS:
            stack.append(_CLOSERS[token])
        elif token in ("}", "]"):
            stack.pop()
            if not stack:
                yield text[: match.end()]  # a whole object followed by junk
                return
        if then == _AFTER_VALUE:
            then = _AFTER_MEMBER if stack[-1] == "}" else _AFTER_ITEM
        expect, pos = then, match.end()
        if expect in _SAFE:
            safe_end, safe_closers = pos, "".join(reversed(stack))
    if safe_end < 0:
        return
    cut = _CUT_STRING.match(text, pos)
    if cut is not None and expect in (_VALUE, _ITEM_OR_CLOSE):
        body = _DANGLING_SURROGATE.sub("", cut[1])
        yield text[: cut.start(1)] + body + '"' + "".join(reversed(stack))
    yield text[:safe_end] + safe_closers
