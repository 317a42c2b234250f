"""Which secret values the reconciler must never write: to git, status, its logs or `plan`.

The values are taken from the daemon's environment, by name: every job's and provider's
`secrets:`, the variables holding notification URLs (`url_env`), well-known credential variables,
and any variable whose name says it holds a credential (..._TOKEN, ..._SECRET, ..._PASSWORD,
..._API_KEY). The masking itself is status.redact (pure); this module does the looking up, and
filters the daemon's log records.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from desired.parse import DesiredState
from status.redact import Redactor

WELL_KNOWN = frozenset({
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "KAGGLE_KEY", "VAST_API_KEY",
    "RUNPOD_API_KEY", "LIGHTNING_API_KEY", "GITHUB_TOKEN", "GH_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
    "WANDB_API_KEY", "AZURE_STORAGE_KEY", "AZURE_CLIENT_SECRET", "OPENAI_API_KEY", "ANTHROPIC_API_KEY",
})
_CREDENTIAL_NAME = re.compile(r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|PRIVATE_KEY)(?:_|$)")


def secret_values(desired: DesiredState | None, environ: Mapping[str, str]) -> frozenset[str]:
    """The values, in `environ`, of every variable that holds a secret."""
    names = set(WELL_KNOWN) | {n for n in environ if _CREDENTIAL_NAME.search(n.upper())}
    if desired is not None:
        names.update(s for job in desired.jobs.values() for s in job.spec.secrets)
        names.update(s for provider in desired.providers.values() for s in provider.spec.secrets)
        names.update(t.url_env for t in desired.settings.notifications.targets)  # URLs carry tokens
    return frozenset(environ[n] for n in names if environ.get(n))


SCAN_CHUNK_BYTES = 4 << 20


def file_holds_secret(redactor: Redactor, path: Path) -> bool:
    """Whether the file at `path` holds any form of a secret value, at any offset: read as UTF-8
    (other bytes kept as they are) in chunks that overlap by the most bytes one match can span,
    so that a value split across two chunks is still found."""
    if not redactor:
        return False
    overlap = 4 * redactor.longest  # a character of a form is at most 4 bytes of UTF-8
    tail = b""
    with path.open("rb") as fh:
        while chunk := fh.read(SCAN_CHUNK_BYTES):
            data = tail + chunk
            if redactor.finds(data.decode("utf-8", "surrogateescape")):
                return True
            tail = data[-overlap:]
    return False


class RedactingFilter(logging.Filter):
    """Masks secret values in every record a handler emits (message, arguments, traceback).
    `source` gives the current Redactor: the daemon learns job secrets as it reads manifests."""

    def __init__(self, source: Callable[[], Redactor]) -> None:
        super().__init__()
        self.source = source

    def filter(self, record: logging.LogRecord) -> bool:
        redactor = self.source()
        if not redactor:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a malformed record must not leak its arguments unformatted
            message = f"{record.msg!s} (unformattable arguments)"
        record.msg, record.args = redactor.redact(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redactor.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redactor.redact(record.stack_info)
        return True
