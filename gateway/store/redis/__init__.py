"""The Redis backend of the trace store, for several nodes on one store (docs/scale-out.md).

The store class is :class:`gateway.store.redis.store.RedisStore`; its module's
docstring has the data layout and the package's map. Imported only where the
backend is Redis: coredis is slow to import.
"""
