"""Sessions: the runtime nursery, the agent loop, turn phases and the hub."""
