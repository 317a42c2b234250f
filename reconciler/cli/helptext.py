"""Help text as the user reads it: an on/off flag shows no `<bool>` value placeholder, and an
argument whose metavar says what it takes (`-- CMD ARGS`) no `<list[str]>` (typer prints the
parameter's type beside every option and argument). Imported by reconciler.cli.main."""

from __future__ import annotations

from typing import Any

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
