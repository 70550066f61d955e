"""Parse an `llmctl …` command line with the real CLI's own parser, without running the command."""

from __future__ import annotations

import shlex

import typer

from llmctl.cli import app
from llmctl.cli.app import spread_multi_values


def parse(args: list[str]) -> dict:
    """The parameters the command line gives the command, without running it (typer ships its own click,
    so its classes, not the click package's, are the ones to use)."""
    command = typer.main.get_command(app)
    ctx, name, rest = None, "llmctl", list(args)
    while hasattr(command, "get_command"):  # a group: llmctl's groups take no options of their own
        if not rest:  # the group itself (`llmctl bench`): its name resolved
            return {}
        ctx = command.context_class(command, info_name=name, parent=ctx)
        name, rest = rest[0], rest[1:]
        command = command.get_command(ctx, name)
    return command.make_context(name, rest, parent=ctx).params


def parse_line(line: str) -> tuple[str, dict]:
    """`llmctl CMD …` as printed in docs or by `plan`: the command's name and its parameters."""
    words = shlex.split(line, comments=True)
    assert words[0] == "llmctl", line
    return words[1], parse(spread_multi_values(words[1:]))


def engine_config(params: dict):
    """The EngineConfig `llmctl serve` builds from these parsed parameters (before validate())."""
    from llmctl.cli.engine_flags import ENGINE_FLAGS, EngineFlags

    flags = EngineFlags({name: params[name] for name in ENGINE_FLAGS if name in params})
    return flags.config(model=params["model"], revision=params.get("revision"))
