"""Runtimes other than the gateway's own agent loop (PROTOCOL section 11)."""
