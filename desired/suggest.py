"""The fields a manifest could have named where it named an unknown one: for "did you mean" hints,
and to name the field as the user wrote it (without the tag pydantic puts in a location inside a
tagged union such as a provider's `settings`)."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation can hold: itself, a union's members, a list's or dict's items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin is not None or isinstance(annotation, types.UnionType):
        for arg in typing.get_args(annotation):
            out += _models_in(arg)
    return out


def _names(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def fields_at(root: type[BaseModel], loc: Sequence[str | int]) -> tuple[list[str], set[str]]:
    """Walks `loc` (pydantic's location of an unknown field) from `root`: returns the location as
    the manifest spells it (union tags dropped) and the field names allowed beside the last part."""
    models = [root]
    shown: list[str] = []
    for part in loc[:-1]:
        inner = [m for model in models if isinstance(part, str) and part in _names(model)
                 for m in _models_in(_field(model, part))]
        if inner:
            models = inner
            shown.append(str(part))
        elif isinstance(part, int) or len(models) == 1:
            shown.append(str(part))  # a list index or a dict key: the same models go on
        else:  # a tagged union's tag: the member it names
            models = [m for m in models
                      if typing.get_args(m.model_fields.get("type", _NO).annotation) == (part,)] or models
    return [*shown, str(loc[-1])] if loc else shown, set().union(*(_names(m) for m in models))


class _NoField:
    annotation = None


_NO = _NoField()


def _field(model: type[BaseModel], name: str) -> Any:
    for key, info in model.model_fields.items():
        if (info.alias or key) == name:
            return info.annotation
    return None


def did_you_mean(word: str, choices: set[str]) -> str:
    """` (did you mean `command`?)`, or "" when nothing is close."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f"; did you mean `{close[0]}`?" if close else ""
