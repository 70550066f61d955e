"""The llmctl command line: thin commands over the shared core, one module per command."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from llmctl.cli.bench import bench_app
from llmctl.cli.inspect import inspect, license_
from llmctl.cli.plan import plan
from llmctl.cli.quantize import quantize
from llmctl.cli.serve import serve
from llmctl.errors import LlmctlError, debug_enabled

app = typer.Typer(
    name="llmctl",
    help="From a Hugging Face checkpoint to a measured service: inspect, license, ...",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        from llmctl.version import __version__

        print(f"llmctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """From a Hugging Face checkpoint to a measured service."""


app.command()(inspect)
app.command("license")(license_)
app.command()(plan)
app.command()(quantize)
app.command()(serve)
app.add_typer(bench_app, name="bench")


def spread_multi_values(args: list[str]) -> list[str]:
    """vLLM's `--lora-modules a=PATH b=PATH` (argparse nargs='+') as click's repeated option."""
    out, after_value = [], False  # after_value: the previous argument was a --lora-modules value
    for index, arg in enumerate(args):
        extra = after_value and not arg.startswith("-") and ("=" in arg or arg.startswith("{"))
        if extra:
            out.append("--lora-modules")
        out.append(arg)
        after_value = extra or (index > 0 and args[index - 1] == "--lora-modules")
    return out


def main() -> None:
    """Entry point: user errors print one line and exit 2; nothing prints a traceback."""
    try:
        # returns the exit code of typer.Exit in this mode
        result = app(args=spread_multi_values(sys.argv[1:]), standalone_mode=False)
    except LlmctlError as exc:
        _fail(str(exc), exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as exc:  # click usage errors and anything unexpected
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `llmctl`: the help was printed
            sys.exit(0)
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):  # click's usage errors
            exc.show()
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort":
            _fail("aborted", 1)
        if debug_enabled():
            raise
        _fail(f"internal error: {type(exc).__name__}: {exc} (set LLMCTL_DEBUG=1 for a traceback and "
              "please report it)", 3)
    sys.exit(result if isinstance(result, int) else 0)


def _fail(message: str, code: int) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]error:[/bold red] {message}", highlight=False, soft_wrap=True)
    sys.exit(code)
