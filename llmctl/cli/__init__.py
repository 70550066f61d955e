"""The llmctl command line (`llmctl.cli:main` is the console script)."""

from llmctl.cli.app import app, main

__all__ = ["app", "main"]
