"""An MCP server that never answers: it reads its stdin forever (a handshake that never ends)."""

import sys

for _line in sys.stdin:
    pass
