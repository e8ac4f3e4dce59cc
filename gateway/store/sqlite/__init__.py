"""The embedded SQLite backend of the trace store (docs/reference.md ``[store]``).

The store class is :class:`gateway.store.sqlite.store.SqliteStore`; its module's
docstring has the decisions and the package's map.
"""
