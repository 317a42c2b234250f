"""Untrusted text made safe to show: file names and manifests' contents come from whoever can push,
job messages and log tails from the job's own code, error strings from providers. Shown raw, an
escape sequence in any of them can rewrite a terminal (move the cursor, change the title, hide a
line), a carriage return can overwrite the line it is on, a newline can forge a log line or a
commit trailer, and a bidirectional override can show text in another order than it is. So
wherever such text is shown (the CLI, log lines, status files and commits, the status page), its
control characters are written out as escapes, visibly: ESC as \\x1b, CR as \\r.
"""

from __future__ import annotations

import re

# C0 and C1 controls and DEL; the Unicode line and paragraph separators; the bidirectional
# embeddings, overrides and isolates (a "Trojan Source" reordering).
_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_IN_LINES = re.compile(f"[{_CONTROLS}]")  # keeps \t and \n: text of several lines (a log tail)
_IN_A_LINE = re.compile(f"[\t\n{_CONTROLS}]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def one_line(text: str) -> str:
    """`text` on one line with every control character (newlines and tabs too) as a visible escape."""
    return _IN_A_LINE.sub(_escape, text)


def lines(text: str) -> str:
    """`text` keeping its newlines and tabs, every other control character (CR, ESC) as a visible escape."""
    return _IN_LINES.sub(_escape, text)
