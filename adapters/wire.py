"""Strict readers for what arrives from outside: JSON, decimal integers, provider numbers.

Why one place: every reader of a wire format had its own leniency. Python's `int()` takes
`1_0`, ` 10 `, `+10` and non-ASCII digits; `json.loads` takes `NaN`, `Infinity`, `1e999` (as
inf), duplicate keys (the last wins, so two readers may disagree on one document) and nests
until the interpreter's stack gives out (a RecursionError nobody catches); `float()` takes
"nan". An answer that is not what the documented format allows is refused here, with one
sentence, before anything acts on it.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from typing import Any

log = logging.getLogger("reconciler")

MAX_DEPTH = 64  # no provider answer or webhook payload we read nests deeper than a dozen levels
MAX_JSON_BYTES = 16 * 1024 * 1024
PRICE_MAX = 10_000.0  # USD per hour: no machine a provider rents costs more; above it is a broken answer
MONEY_MAX = 1e9  # USD or credits in an account
YEAR_SECONDS = 366 * 24 * 3600.0  # a quota or uptime longer than this is not a real one
DATE_MAX = 4102444800.0  # 2100-01-01 as Unix time: a later timestamp is not a real one
_DIGITS = re.compile(r"[0-9]{1,18}")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


class WireError(ValueError):
    """Input that is not the format it claims to be; the message says what is wrong in one sentence."""


def decimal_int(text: str) -> int:
    """A non-negative decimal integer written only with ASCII digits (an HTTP Content-Length, a
    port): no sign, space, underscore or other script's digits, which `int()` would all accept."""
    if not is_decimal(text):
        raise WireError(f"{text!r} is not a decimal number")
    return int(text)


def is_decimal(text: str) -> bool:
    """Whether `text` is what `decimal_int` reads (str.isdigit() also says yes to "²", which int()
    then refuses, and to other scripts' digits, which int() reads)."""
    return isinstance(text, str) and _DIGITS.fullmatch(text) is not None


def depth(data: bytes) -> int:
    """How deeply a JSON text nests arrays and objects (brackets inside strings do not count)."""
    deepest = level = 0
    for match in _BRACKETS.finditer(_STRINGS.sub(b'""', data)):
        level += 1 if match.group() in (b"[", b"{") else -1
        deepest = max(deepest, level)
    return deepest


def _no_constant(name: str) -> Any:
    raise WireError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise WireError(f"{text[:20]} is too large for a number")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise WireError(f"key {key[:40]!r} appears twice in one object")
        out[key] = value
    return out


def load_json(data: bytes | str, *, limit: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """JSON as RFC 8259 defines it, within `limit` bytes and `max_depth` levels: no NaN or
    Infinity, no number that overflows to infinity, no key twice in one object. Raises WireError."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > limit:
        raise WireError(f"a JSON text of {len(raw)} bytes is over the {limit}-byte limit")
    if depth(raw) > max_depth:
        raise WireError(f"a JSON text nested deeper than {max_depth} levels")
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite_float,
                          object_pairs_hook=_unique_keys)
    except WireError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"not JSON ({str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__})") from None


class Numbers:
    """Checks the numbers one provider answers before anything acts on them: finite and within
    the field's range. A bad one is said once per provider and field (not every tick), and the
    caller refuses the offer or answer that carried it."""

    def __init__(self, who: str) -> None:
        self.who = who
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def number(self, value: Any, field: str, *, low: float = 0.0, high: float = math.inf) -> float | None:
        """`value` as a float, or None when it is absent (None or "") or not a finite number within
        [low, high]; a present but bad value is warned about once."""
        if value is None or value == "":
            return None
        number = _as_float(value)
        if number is not None and math.isfinite(number) and low <= number <= high:
            return number
        self.warn(field, f"{_shown(value)} is not a number from {_bound(low)} to {_bound(high)}")
        return None

    def count(self, value: Any, field: str, *, high: int = 10**9) -> int | None:
        """A whole count (restarts, GPUs) within [0, high], as `number` does for any number."""
        number = self.number(value, field, high=high)
        if number is None:
            return None
        if number != int(number):
            self.warn(field, f"{_shown(value)} is not a whole number")
            return None
        return int(number)

    def warn(self, field: str, why: str) -> None:
        with self._lock:
            if field in self._said:
                return
            self._said.add(field)
        log.warning("%s answered a bad %s: %s; what carried it is refused", self.who, field, why)


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        return float(value.strip())
    return None


def _bound(x: float) -> str:
    return str(int(x)) if math.isfinite(x) and x == int(x) else f"{x:g}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
