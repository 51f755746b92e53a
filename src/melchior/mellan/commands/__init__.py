"""The ``mellan`` subcommands, one small module per command group (imported lazily)."""
