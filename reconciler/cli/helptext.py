"""Help text as the user reads it: an on/off flag shows no `<bool>` value placeholder, and an
argument whose metavar says what it takes (`-- CMD ARGS`) no `<list[str]>` (typer prints the
parameter's type beside every option and argument); a command's docstring flows as paragraphs
(typer keeps its source line breaks, which left ragged lines in `--help` at any width). Imported by
reconciler.cli.main."""

from __future__ import annotations

import inspect
from typing import Any

import typer
from typer.core import TyperArgument, TyperOption


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """An on/off flag takes no value: its help shows none (typer would print a `<bool>` placeholder)."""
    return None if self.is_flag else _option_type(self, ctx)


def _argument_type(self: TyperArgument, ctx: Any) -> str | None:
    """An argument whose metavar says what it takes (`-- CMD ARGS`) needs no `<list[str]>` beside it."""
    return None if self.metavar else _plain_argument_type(self, ctx)


_option_type, _plain_argument_type = TyperOption.display_type_rich, TyperArgument.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]
TyperArgument.display_type_rich = _argument_type  # type: ignore[method-assign,assignment]


def flowing(text: str) -> str:
    """Lines of one paragraph joined with spaces; blank lines, and lines that start indented or as
    a list item, keep their break."""
    out: list[str] = []
    for line in text.splitlines():
        joins = out and out[-1] and line.strip() and not line.startswith((" ", "\t", "- ", "* "))
        if joins:
            out[-1] = f"{out[-1]} {line.strip()}"
        else:
            out.append(line)
    return "\n".join(out)


def flow_command_help(app: typer.Typer) -> None:
    """Every registered command's help, from its docstring, as flowing paragraphs."""
    for info in app.registered_commands:
        doc = info.help if info.help is not None else inspect.getdoc(info.callback) if info.callback else None
        if doc:
            info.help = flowing(doc)
    for group in app.registered_groups:  # `reconciler artifacts ls`, ...
        if group.typer_instance is not None:
            flow_command_help(group.typer_instance)
