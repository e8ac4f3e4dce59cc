"""The gateway node: every session of one daemon, and what they share (gateway.node.node)."""

from gateway.node.node import Node
from gateway.node.tokens import AttachTokens

__all__ = ["AttachTokens", "Node"]
