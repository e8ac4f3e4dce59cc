"""The doors: each a way for a client onto the same sessions, over the HTTP transport."""
