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


# vLLM's argparse options that take several values (nargs='+'): click repeats the option instead
MULTI_VALUE_OPTIONS = {
    "--lora-modules": lambda arg: "=" in arg or arg.startswith("{"),  # name=PATH or a JSON object
    "--goodput": lambda arg: ":" in arg,  # ttft:500
}
# serve's --served-model-name takes every word up to the next option, as vLLM's argparse does
SERVE_MULTI_VALUE_OPTIONS = {"--served-model-name": lambda arg: True}


def spread_multi_values(args: list[str]) -> list[str]:
    """`--goodput ttft:500 tpot:50` as click's `--goodput ttft:500 --goodput tpot:50`."""
    options = MULTI_VALUE_OPTIONS | (SERVE_MULTI_VALUE_OPTIONS if args[:1] == ["serve"] else {})
    out: list[str] = []
    option: str | None = None  # the multi-value option whose values may follow
    for index, arg in enumerate(args):
        extra = option is not None and not arg.startswith("-") and options[option](arg)
        if extra:
            out.append(option)
        out.append(arg)
        previous = args[index - 1] if index > 0 else None
        if not extra:
            option = previous if previous in options else None
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
