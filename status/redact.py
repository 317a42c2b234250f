"""Redaction of secret values from text the reconciler writes (status files, commit messages,
its own logs, `plan` output) and from the output a worker's capturing process stores.

A failing worker's log tail is committed to git, and whatever a job prints goes with it: a
secret it printed as-is or in any common encoding must not reach the repository or a stored log.
Each form of each value is replaced with `***`:

- URL-encoding (upper- or lowercase hex, `+` for a space), HTML character references (named,
  decimal, hex), JSON and Python string escapes (`\\"`, `\\/`, `\\u00e9`, surrogate pairs, `\\xc3`),
  a YAML single-quoted `''`, in any mix: each character that an encoding changes may appear in
  any of its forms, so a value is matched by one pattern rather than a list of whole encodings;
- base64, standard and URL-safe, padded or not, alone or inside longer data at any alignment (as
  in an HTTP Basic header or a Kubernetes secret);
- each line of a value of several lines (a key file printed line by line).

Values shorter than MIN_LENGTH characters are ignored: a short value ("1", "true", "admin")
also occurs in ordinary text, so redacting it would garble every status while hiding little.
Pure: no I/O; it takes the values, not the environment. Standard library only: the hosted
bootstrap imports this module from the worker SDK bundle.
"""

from __future__ import annotations

import base64
import html.entities
import json
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

MASK = "***"
MIN_LENGTH = 6
PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~")  # no encoding changes these


def _b64_forms(raw: bytes) -> set[str]:
    """Base64 of `raw` on its own (standard and URL-safe, with and without padding), and the part
    of its encoding that is the same wherever `raw` sits in longer data (one per alignment)."""
    forms: set[str] = set()
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + raw + b"\0\0").decode()
        start, end = -(-8 * k // 6), 8 * (k + len(raw)) // 6  # characters made of `raw`'s bits only
        forms.add(encoded[start:end])
    whole = base64.b64encode(raw).decode()
    forms |= {whole, whole.rstrip("=")}
    return forms | {f.replace("+", "-").replace("/", "_") for f in forms}


def without_credentials(url: str) -> str:
    """A URL with any user:password@ part masked (s3://KEY:SECRET@bucket/runs -> s3://***@bucket/runs),
    for text that may be read by others, such as a pull-request comment."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    return f"{scheme}://{MASK}@{authority.rsplit('@', 1)[1]}{slash}{path}"


@lru_cache(maxsize=1)
def _entity_names() -> dict[str, tuple[str, ...]]:
    """Each character's named HTML references (`&amp;`, `&sol;`, `&eacute;`...), with the semicolon."""
    names: dict[str, list[str]] = {}
    for name, text in html.entities.html5.items():
        if name.endswith(";") and len(text) == 1:
            names.setdefault(text, []).append(f"&{name}")
    return {c: tuple(n) for c, n in names.items()}


@lru_cache(maxsize=4096)
def char_forms(c: str) -> tuple[str, ...]:
    """The ways the encodings of a log line may write one character of a secret, longest first."""
    if c in PLAIN:
        return (c,)
    raw, code = c.encode("utf-8", "surrogatepass"), ord(c)
    units = [code] if code < 0x10000 else [0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)]
    forms = {c, json.dumps(c)[1:-1], f"&#{code};", *_entity_names().get(c, ())}
    for x in ("x", "X"):  # hex digits in either case
        forms.add("".join(f"%{b:02{x}}" for b in raw))  # URL-encoding
        forms.update({f"&#x{code:{x}};", f"&#X{code:{x}};"})  # HTML
        forms.add("".join(f"\\u{u:04{x}}" for u in units))  # JSON, JavaScript
        if not c.isascii():
            forms.add("".join(f"\\x{b:02{x}}" for b in raw))  # Python's bytes
    if c.isascii() and c.isprintable() and c != "\\":
        forms.add("\\" + c)  # a quote or slash escaped in a string literal
    if c == " ":
        forms.add("+")  # form encoding
    if c == "'":
        forms.add("''")  # YAML, SQL
    return tuple(sorted(forms, key=lambda f: (-len(f), f)))


def value_pattern(value: str) -> tuple[str, int]:
    """A regular expression matching `value` with each of its characters in any encoded form, and
    the length of its longest match."""
    parts, longest = [], 0
    for c in value:
        forms = char_forms(c)
        parts.append(re.escape(c) if len(forms) == 1 else "(?:" + "|".join(map(re.escape, forms)) + ")")
        longest += len(forms[0])
    return "".join(parts), longest


def forms_of(value: str) -> set[str]:
    """The literal forms of one value that a pattern of characters cannot describe: its base64
    encodings (and those of each of its lines); each at least MIN_LENGTH long."""
    forms: set[str] = set()
    for text in {value, *value.splitlines()}:
        forms |= _b64_forms(text.encode())
    return {f for f in forms if len(f) >= MIN_LENGTH}


def redact_data(redactor: Redactor, data: Any) -> Any:
    """`data` (dicts, lists, strings) with every string redacted: done before rendering, so that
    no escaping or line folding of the renderer can split a value the text pass would miss."""
    if isinstance(data, str):
        return redactor.redact(data)
    if isinstance(data, dict):
        return {k: redact_data(redactor, v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact_data(redactor, v) for v in data]
    return data


class Redactor:
    """Replaces every known form of the given secret values with `***`. `pattern` and `longest`
    (the longest text one match can span) are what a process that captures a worker's output is
    given, to mask it as it streams by."""

    def __init__(self, values: Iterable[str]) -> None:
        self.values = frozenset(v for v in values if len(v) >= MIN_LENGTH)
        texts = {t for v in self.values for t in (v, *v.splitlines()) if len(t) >= MIN_LENGTH}
        alternatives = [value_pattern(t) for t in texts]
        alternatives += [(re.escape(f), len(f)) for v in self.values for f in forms_of(v)]
        # Longest first, so a whole value is masked before a part of it (or a shorter value) could be.
        alternatives.sort(key=lambda a: (-a[1], a[0]))
        self.pattern = "|".join(a[0] for a in alternatives)
        self.longest = max((a[1] for a in alternatives), default=0)
        self._regex = re.compile(self.pattern) if alternatives else None

    def __bool__(self) -> bool:
        return self._regex is not None

    def redact(self, text: str) -> str:
        if self._regex is None or not text:
            return text
        return self._regex.sub(MASK, text)

    def finds(self, text: str) -> bool:
        """Whether `text` holds any form of any value (what `redact` would mask)."""
        return self._regex is not None and self._regex.search(text) is not None
