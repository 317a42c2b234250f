"""Redaction of secret values from text the reconciler writes (status files, commit messages,
its own logs, `plan` output).

A failing worker's log tail is committed to git, and whatever a job prints goes with it: a
secret it printed as-is, base64-encoded (as in an HTTP Basic header or a Kubernetes secret) or
URL-encoded (as in a connection string) must not reach the repository. Each form of each value
is replaced with `***`.

Values shorter than MIN_LENGTH characters are ignored: a short value ("1", "true", "admin")
also occurs in ordinary text, so redacting it would garble every status while hiding little.
Pure: no I/O; it takes the values, not the environment.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "***"
MIN_LENGTH = 6


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


def forms_of(value: str) -> set[str]:
    """Every form of one secret value that is redacted: as-is, each of its lines (a key file
    printed line by line), escaped as in JSON or a quoted YAML string, URL-encoded, base64."""
    forms = {value, *value.splitlines(), json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
             value.replace("'", "''"), quote(value), quote(value, safe=""), quote_plus(value)}
    forms |= _b64_forms(value.encode())
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
    """Replaces every known form of the given secret values with `***`."""

    def __init__(self, values: Iterable[str]) -> None:
        self.values = frozenset(v for v in values if len(v) >= MIN_LENGTH)
        forms: set[str] = set()
        for value in self.values:
            forms |= forms_of(value)
        # Longest first, so a whole encoding is masked before a part of it could be.
        ordered = sorted(forms, key=lambda f: (-len(f), f))
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def redact(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(MASK, text)
