"""Python source without its comments and docstrings, line for line: what the hosted launch carries.

The whole launch of a Vast.ai, RunPod or Lightning AI worker must fit in one 128 KiB argument
(adapters.hosted.packed), and the worker SDK is most of it. Its comments and docstrings are for
people reading the repository, not for the rented machine: dropping them makes the packed SDK
about 40 % smaller. Every line stays where it was (a docstring leaves as many blank lines as it
had), so a traceback from a worker names the same line numbers as the repository's file.
"""

from __future__ import annotations

import io
import tokenize

# Tokens after which a string that ends its statement is a docstring or a bare string statement
# (either does nothing when run).
_STATEMENT_START = frozenset({tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE})


def slim(source: str) -> str:
    """`source` with comments and statement-strings removed; same line count, same behaviour."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    cuts: list[tuple[tuple[int, int], tuple[int, int], str]] = []
    previous = tokenize.NEWLINE  # the file's first statement starts a statement too
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            cuts.append((tok.start, tok.end, ""))
        elif (tok.type == tokenize.STRING and previous in _STATEMENT_START
              and i + 1 < len(tokens) and tokens[i + 1].type == tokenize.NEWLINE):
            cuts.append((tok.start, tok.end, '""' + "\n" * (tok.end[0] - tok.start[0])))
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tok.type
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    out = source
    for (row, col), (end_row, end_col), replacement in reversed(cuts):
        out = out[:starts[row - 1] + col] + replacement + out[starts[end_row - 1] + end_col:]
    return out
