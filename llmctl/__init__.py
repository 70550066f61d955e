"""llmctl: one tool from a Hugging Face checkpoint to a measured service."""

__version__ = "0.1.0"
