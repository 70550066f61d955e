"""Memory and parallelism planning: pure arithmetic over ModelSpec, shared with the engine."""
