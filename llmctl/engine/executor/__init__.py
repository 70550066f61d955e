"""Running the ranks: executors (local, TP × PP), stages, launchers (spawned processes, torchrun, Ray)."""
