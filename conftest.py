"""Root conftest: nothing is registered here (the plugin comes from its pytest11 entry point)."""
