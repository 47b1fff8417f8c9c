"""The scoring engine: everything that runs on the agent's event loop."""
