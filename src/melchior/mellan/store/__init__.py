"""Durable state of the relay: SQLite by default, PostgreSQL for several replicas.

Both backends implement :class:`melchior.mellan.store.base.Store`; ``open_store``
picks one from a database URL.
"""
