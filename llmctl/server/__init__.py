"""The OpenAI-compatible HTTP server over the engine (llmctl serve)."""
