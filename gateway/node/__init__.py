"""The gateway node: every session of one daemon, and what they share (gateway.node.node)."""

from gateway.node.attach_tokens import AttachTokens
from gateway.node.node import Node

__all__ = ["AttachTokens", "Node"]
