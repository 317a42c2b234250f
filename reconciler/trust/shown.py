"""Untrusted text for the terminal: rich markup escaped (a message's `[red]` is text) and control
characters written as visible escapes (status.text), so that neither can restyle or rewrite the
screen. Every CLI command shows names, messages and errors through `escape`."""

from __future__ import annotations

import logging

from rich.markup import escape as escape_markup
from rich.text import Text

from status.text import lines, one_line


def escape(text: str) -> str:
    """One line of untrusted text inside rich markup."""
    return escape_markup(one_line(text))


def block(text: str) -> Text:
    """Several lines of untrusted text (a log tail), printed as they are but for control characters."""
    return Text(lines(text.replace("\r\n", "\n")))


class VisibleFilter(logging.Filter):
    """Log lines carry names, messages and provider errors: their control characters are escaped
    (after the secrets are masked), so a log line cannot forge another or restyle the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        shown = one_line(message)
        if shown != message:
            record.msg, record.args = shown, None
        return True
