"""`python -m llmctl.cli`: the CLI."""

from llmctl.cli.app import main

main()
