"""Chat templates shipped with llmctl for models whose checkpoints carry none."""
