"""How `reconciler status` shows its rows: a table that fits the terminal (80 columns or a pipe),
`wide` (every column, no line ever cut), `plain` (tab-separated, for scripts) or `json`; and the
provider ledger of the last status commit, in the same compact table.

The default table keeps one line a row: it holds the short cells (job, phase, progress, attempts)
and, while they fit, the forecast's; each job's message, and any cell that did not fit, follow
the table on lines of their own, which wrap rather than being cut with an ellipsis."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from reconciler.trust.shown import escape
from status.text import one_line


class StatusOutput(StrEnum):
    TABLE = "table"
    WIDE = "wide"
    PLAIN = "plain"
    JSON = "json"


# The default table's forecast cells, most wanted first: dropped from the end while the table is
# wider than the terminal (and then told on the job's own line).
# (header, row key, how the job's own line names it)
OPTIONAL = (("ETA (UTC)", "eta_cell", "ETA (UTC)"), ("spent / projected", "cost_cell", "spent / projected"),
            ("risk", "risk_cell", ""))  # "on track (14 h slack)", "due ...": says what it is
WIDE = ("job", "phase", "progress", "attempts", "interruptions", "failures", "ETA (UTC)",
        "spent / projected", "risk", "message")


def progress_text(r: dict[str, Any]) -> str:
    """`120/400 30%` (the heartbeat step of the target), or the step alone without a target."""
    step, target = int(r["step"]), r["target"]
    if not target:
        return str(step)
    return f"{step}/{target} {100.0 * min(step, target) / target:.0f}%"


def show(console: Console, rows: list[dict[str, Any]], output: StatusOutput, wide_progress: Any) -> None:
    """Prints `rows` (status's dicts, with eta_cell, cost_cell and risk_cell added) as `output` asks
    (json is status's own: its rows as they are)."""
    if output is StatusOutput.PLAIN:
        _plain(rows)
    elif output is StatusOutput.WIDE:
        _wide(rows, wide_progress)
    else:
        _fitted(console, rows)


def _cells(r: dict[str, Any]) -> dict[str, str]:
    return {"job": str(r["job"]), "phase": str(r["phase"]), "progress": progress_text(r),
            "attempts": str(r["attempts"]), "interruptions": str(r["interruptions"]),
            "failures": str(r["failures"]), "ETA (UTC)": r["eta_cell"], "spent / projected": r["cost_cell"],
            "risk": r["risk_cell"], "message": one_line(str(r["message"]))}


def _plain(rows: list[dict[str, Any]]) -> None:
    """One tab-separated line a job under a header line: for cut, awk and grep (no markup, no width)."""
    print("\t".join(WIDE))
    for r in rows:
        cells = _cells(r)
        print("\t".join(cells[c].replace("\t", " ") for c in WIDE))


def _wide(rows: list[dict[str, Any]], wide_progress: Any) -> None:
    """Every column, the progress bar and the whole message, each row on one line however long."""
    table = Table(*WIDE)
    for col in table.columns:
        col.no_wrap = True
    for r in rows:
        cells = _cells(r)
        table.add_row(*(escape(cells[c]) if c != "progress" else wide_progress(r) for c in WIDE))
    Console(width=100_000, soft_wrap=True).print(table)  # as wide as it needs: `| less -S` scrolls it


def compact(*headers: str, title: str | None = None) -> Table:
    """A table for a terminal of any width: a rule under the header, one space between columns, no
    borders, and a cell too long for the terminal wraps (never an ellipsis)."""
    table = Table(*headers, title=title, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                  padding=(0, 1, 0, 0))
    for col in table.columns:
        col.overflow = "fold"
    return table


def _table(rows: list[dict[str, Any]], optional: tuple[tuple[str, str, str], ...]) -> Table:
    table = compact("job", "phase", "progress", "attempts", *(h for h, _, _ in optional))
    for r in rows:
        cells = _cells(r)
        table.add_row(*(escape(cells[c]) for c in ("job", "phase", "progress", "attempts")),
                      *(escape(str(r[key])) for _, key, _ in optional))
    return table


def natural_width(console: Console, table: Table) -> int:
    """The width the table needs to keep every cell on one line (not clamped to the terminal's)."""
    return Measurement.get(console, console.options.update_width(1_000_000), table).maximum


def _fitted(console: Console, rows: list[dict[str, Any]]) -> None:
    """The short table with as many forecast columns as fit, then a line a job for the rest."""
    optional = tuple(o for o in OPTIONAL if any(r[o[1]] for r in rows))  # an empty column is left out
    while True:
        table = _table(rows, optional)
        if not optional or natural_width(console, table) <= console.width:
            break
        optional = optional[:-1]
    console.print(table)
    for r in rows:
        extra = [f"{o[2]} {r[o[1]]}".strip() for o in OPTIONAL if o not in optional and r[o[1]]]
        counts = (f"interruptions {r['interruptions']}, failures {r['failures']}"
                  if r["interruptions"] or r["failures"] else "")
        said = "; ".join(x for x in (one_line(str(r["message"])), counts, *extra) if x)
        if said:
            console.print(f"[bold]{escape(str(r['job']))}[/bold]: {escape(said)}", overflow="fold")


def ledger_rows(text: bytes | None) -> list[dict]:
    """The provider ledger as the last status commit wrote it (status/providers.yaml)."""
    import yaml

    try:
        data = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return []
    rows = data.get("providers") if isinstance(data, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def room_lines(text: bytes | None) -> list[str]:
    """What the daemon has seen of each provider's room (status/room.yaml), a line a provider in
    words, markup escaped."""
    from status.room import room_words_of

    return [f"[bold]{escape(name)}[/bold]: {escape(words)}" for name, words in sorted(room_words_of(text).items())]


def ledger_table(ledger: list[dict]) -> Table:
    from status.models import from_iso, when

    slow = any(x.get("answers") for x in ledger)  # a column only while some provider is slow to answer
    table = compact("provider", "left (provider's word)", "refills (UTC)", "used this period", "cost",
                    *(["answers"] if slow else []), title="providers")
    for x in ledger:
        left = "" if x.get("remaining") is None else (
            f"${x['remaining']:.2f} credits" if x.get("unit") == "credits" else f"{x['remaining']} {x.get('unit')}")
        used = f"{x.get('worker_hours', 0)} h" + (f" ({x['gpu_hours']} GPU h)" if x.get("gpu_hours") else "")
        try:
            refills = from_iso(x.get("resets_at"))
            refill = "" if refills is None else when(refills)
        except ValueError:  # a file edited by hand: shown as written
            refill = str(x.get("resets_at"))
        table.add_row(escape(str(x.get("provider"))), escape(left), escape(refill), escape(used),
                      f"${x.get('cost_usd', 0):.2f}", *([escape(str(x.get("answers") or ""))] if slow else []))
    return table
