"""The value `carry=` returns: saved in the shape the epoch's preamble built it, restored in place.

A resume runs the epoch's preamble again, which builds the value anew; the checkpoint's state is
then put into that value in place: tensors are copied, tuples, lists and dicts are walked, and
objects with `load_state_dict` (a `Carry`, a module) load the `state_dict()` saved for them.
So a save walks the current value in the shape the preamble built (`Shape`, taken when the
epoch's batches begin) and refuses, with one sentence, what a resume could not put back.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from reconciler.worker.lazy_torch import is_tensor, require

IMMUTABLE = (type(None), bool, int, float, complex, str, bytes)
HOLD_IT = "hold such values in a reconciler.worker.Carry (e.g. s = Carry(count=0), carry=lambda: s)"


@dataclass(frozen=True)
class _Tensor:
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Object:
    cls: type


@dataclass(frozen=True)
class _Value:
    value: Any


@dataclass(frozen=True)
class _Other:
    cls: type


def _stateful(value: Any) -> bool:
    return not is_tensor(value) and callable(getattr(value, "load_state_dict", None))


def shape(value: Any) -> Any:
    """What the preamble built: the structure a resume rebuilds and loads the saved state into."""
    if is_tensor(value):
        return _Tensor(tuple(value.shape))
    if _stateful(value):
        return _Object(type(value))
    if isinstance(value, tuple | list):
        return [shape(v) for v in value] if isinstance(value, list) else tuple(shape(v) for v in value)
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, IMMUTABLE):
        return _Value(value)
    return _Other(type(value))


def _name(value: Any) -> str:
    return type(value).__name__


def _where(path: str) -> str:
    return f"item {path} of the value carry= returns" if path else "the value carry= returns"


def _describe(value: Any) -> str:
    if is_tensor(value):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple | list):
        return f"a {_name(value)} of {len(value)}"
    if isinstance(value, dict):
        return f"a dict with the keys {sorted(map(str, value))}"
    return repr(value) if isinstance(value, IMMUTABLE) else f"a {_name(value)}"


def _refused(path: str, was: str, value: Any, advice: str) -> TypeError:
    return TypeError(f"{_where(path)} was {was} when the epoch's batches began and is {_describe(value)} now: "
                     "a resume rebuilds the first in the epoch's preamble and cannot put this into it in place; "
                     f"{advice}")


def state(value: Any, built: Any, path: str = "") -> Any:
    """The state to save for `value`, walked in the shape `built` (of `shape`); a TypeError when
    a resume could not restore it in place."""
    if isinstance(built, _Other):
        raise TypeError(f"{_where(path)} is a {built.cls.__name__}, which carry= cannot restore in place: it "
                        "takes tensors, objects with state_dict and load_state_dict, and tuples, lists and dicts "
                        f"of them; {HOLD_IT}")
    if isinstance(built, _Tensor):
        if not is_tensor(value) or tuple(value.shape) != built.shape:
            raise _refused(path, f"a tensor of shape {built.shape}", value, f"keep its shape, or {HOLD_IT}")
        return value
    if isinstance(built, _Object):
        save = getattr(value, "state_dict", None)
        if type(value) is not built.cls or not callable(save):
            raise _refused(path, f"a {built.cls.__name__}", value, "keep that object and change what it holds")
        return save()
    if isinstance(built, tuple | list):
        if not isinstance(value, tuple | list) or len(value) != len(built):
            raise _refused(path, f"a {_name(built)} of {len(built)}", value, "keep its length")
        return type(built)(state(v, b, f"{path}[{n}]") for n, (v, b) in enumerate(zip(value, built, strict=True)))
    if isinstance(built, dict):
        if not isinstance(value, dict) or value.keys() != built.keys():
            raise _refused(path, f"a dict with the keys {sorted(map(str, built))}", value, "keep its keys")
        return {k: state(value[k], built[k], f"{path}[{k!r}]") for k in built}
    if value is built.value or (type(value) is type(built.value) and value == built.value):
        return value
    raise _refused(path, repr(built.value), value,
                   f"build it in the preamble as the batches need it (a tensor, not None), or {HOLD_IT}")


def load_into(current: Any, saved: Any, what: str) -> None:
    """Put `saved` into `current` in place: tensors are copied, tuples, lists and dicts are walked,
    objects with `load_state_dict` load it."""
    if _stateful(current):
        current.load_state_dict(saved)
    elif is_tensor(current) and is_tensor(saved):
        if current.shape != saved.shape:
            raise ValueError(f"{what} has shape {tuple(current.shape)} but the checkpoint's has "
                             f"{tuple(saved.shape)}: the epoch's preamble must build it as the saved run did")
        with require().no_grad():
            current.copy_(saved)
    elif isinstance(current, tuple | list) and isinstance(saved, tuple | list) and len(current) == len(saved):
        for n, (c, s) in enumerate(zip(current, saved, strict=True)):
            load_into(c, s, f"{what}[{n}]")
    elif isinstance(current, dict) and isinstance(saved, dict) and current.keys() == saved.keys():
        for key in current:
            load_into(current[key], saved[key], f"{what}[{key!r}]")
    elif current is saved or (type(current) is type(saved) and current == saved):
        return  # the same immutable value (None, a number): nothing to put back
    else:
        raise TypeError(f"{what} is a {_name(current)} that cannot take the checkpoint's "
                        f"{_name(saved)} in place: carry= restores tensors (also in tuples, lists, "
                        "dicts) and objects with load_state_dict; pass other values through run.carry() at "
                        "the top of the epoch, or hold them in a reconciler.worker.Carry")


__all__ = ["load_into", "shape", "state"]


class Carry(SimpleNamespace):
    """Values a loop carries from step to step (a running mean, a counter, an RNN's hidden state):
    `s = Carry(total=0.0, hidden=None)`, then `s.total`, `s.hidden = ...`; inside `run.epochs()`
    hand it over as `run.batches(loader, carry=lambda: s)`. Saved as a dict, so tensors in it
    (also in tuples, lists, dicts) are saved as tensors, detached from their graph, and restored
    in place."""

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        vars(self).clear()
        vars(self).update(state)
