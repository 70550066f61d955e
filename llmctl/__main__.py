"""`python -m llmctl`: the CLI."""

from llmctl.cli import main

main()
