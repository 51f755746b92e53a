"""Runtime adapters: how one turn of one agent runs."""
