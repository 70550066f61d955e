"""Groups of flags declared once from a dataclass's fields and added to every command that takes
them: the command names one parameter (e.g. `engine_flags`, `dataset`) and receives the group's
values built into one object. Defaults are the dataclass's own unless a command overrides them."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    type: Any  # what the command line takes
    help: str | None = None
    parse: Callable[[Any], Any] | None = None  # command-line value -> the field's value


@dataclass(frozen=True)
class FlagGroup:
    param: str  # the command's parameter that receives the group
    flags: dict[str, Flag]  # field name -> its flag, in --help order
    fields_of: type  # the dataclass whose fields and defaults these are
    build: Callable[[dict[str, Any]], Any]  # parsed values by field name -> what the command receives

    def parsed(self, values: dict[str, Any]) -> dict[str, Any]:
        return {name: self.flags[name].parse(value) if self.flags[name].parse else value
                for name, value in values.items()}


def with_flags(group: FlagGroup, exclude: tuple[str, ...] = (), **defaults: Any) -> Callable[[F], F]:
    """Add the group's flags (but `exclude`) to a command, with these `defaults` over the dataclass's."""
    fields = {f.name: f for f in dataclasses.fields(group.fields_of)}
    unknown = set(group.flags) - set(fields) | set(defaults) - set(group.flags)
    if unknown:
        raise TypeError(f"not fields of {group.fields_of.__name__} with flags: {sorted(unknown)}")
    names = [name for name in group.flags if name not in exclude]
    options = [_option(name, group.flags[name], defaults.get(name, _default(fields[name]))) for name in names]

    def decorate(command: F) -> F:
        signature = inspect.signature(command)
        hints = typing.get_type_hints(command, include_extras=True)  # resolved: typer sees no strings
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()
               if p.name != group.param]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names}
            return command(**kwargs, **{group.param: group.build(values)})

        wrapper.__signature__ = signature.replace(parameters=own + options)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in own + options}
        return wrapper  # type: ignore[return-value]

    return decorate


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return field.default_factory()  # type: ignore[misc]
    return field.default


def with_negation(flag_name: str) -> str:
    """A boolean flag with its --no- form, as vLLM's argparse BooleanOptionalAction makes every one."""
    return flag_name if "/" in flag_name else f"{flag_name}/--no-{flag_name.removeprefix('--')}"


def _option(name: str, flag: Flag, default: Any) -> inspect.Parameter:
    names = (with_negation(flag.names[0]), *flag.names[1:]) if flag.type is bool else flag.names
    annotation = Annotated[flag.type, typer.Option(*names, help=flag.help)]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
