"""Structured outputs: grammars that constrain what a request may generate (vLLM's structured_outputs)."""
