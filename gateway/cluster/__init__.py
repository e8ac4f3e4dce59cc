"""Several nodes on one Redis (docs/scale-out.md).

- :mod:`gateway.cluster.ops`: the typed operations a node asks of a session's
  owner, and their answers (no Redis in it: every node imports it);
- :mod:`gateway.cluster.link`: the link itself, over Redis pub/sub (imported
  only by a node whose store is Redis).
"""
