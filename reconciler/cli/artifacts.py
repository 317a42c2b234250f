"""`reconciler artifacts ls|pull JOB`: the files a completed run left in RECONCILER_OUTPUT_DIR, listed
or downloaded (verified) from run storage; a sweep's name stands for all its members."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from reconciler.cli.common import RepoOption, _fail, _reconciler, app, console, err
from reconciler.daemon.source import BranchOption, PathOption, UrlOption
from reconciler.trust.shown import escape
from status.models import size_text

artifacts = typer.Typer(no_args_is_help=True, help="List or download what completed runs left in "
                                                   "$RECONCILER_OUTPUT_DIR (run.output_dir).")
app.add_typer(artifacts, name="artifacts")

NameArgument = Annotated[str, typer.Argument(help="a job, or a sweep (then every member)", show_default=False)]


def _located(name: str, repo: Path, repo_url: str | None, branch: str | None, path: str):  # noqa: ANN202
    from adapters.artifacts import ArtifactError
    from reconciler.daemon.artifacts import locate

    rec = _reconciler(repo, repo_url, branch, path)
    try:
        recorded = rec.read_recorded(rec.fresh_status(repo_url is not None))
        return locate(name, rec.read_desired(rec.repo.head()), recorded)
    except ArtifactError as exc:
        raise _fail(str(exc)) from exc


def _say_not_done(not_done: list[str]) -> None:
    if not_done:
        err.print(f"not completed yet, so without outputs: {escape(', '.join(not_done))}")


@artifacts.command("ls")
def list_outputs(name: NameArgument, repo: RepoOption = Path("."), repo_url: UrlOption = None,
                 branch: BranchOption = None, path: PathOption = "") -> None:
    """List each output of the job's completed run (a sweep: of each completed member), with its size."""
    located = _located(name, repo, repo_url, branch, path)
    table = Table(box=None, pad_edge=False)
    for column in ("job", "run", "file", "size"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for run in located.found:
        for item in run.items:
            table.add_row(escape(run.job), run.run_id, escape(item.path), size_text(item.size))
    if table.row_count:
        console.print(table)
    elif located.found:
        err.print(f"{escape(name)} completed without outputs (nothing was written to $RECONCILER_OUTPUT_DIR)")
    _say_not_done(located.not_done)
    if not located.found:
        raise typer.Exit(1)


@artifacts.command("pull")
def pull(name: NameArgument,
         dest: Annotated[Path, typer.Argument(help="the folder to write them into (made if need be)")],
         repo: RepoOption = Path("."), repo_url: UrlOption = None, branch: BranchOption = None,
         path: PathOption = "") -> None:
    """Download the job's outputs into DEST, each verified against the digest its run recorded; a
    file already there with that digest is kept. A sweep's members go to DEST/<member>/."""
    from adapters.artifacts import download
    from adapters.storage import StorageError

    located = _located(name, repo, repo_url, branch, path)
    several = len(located.found) > 1 or name not in [r.job for r in located.found]
    total = sum(item.size for run in located.found for item in run.items)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(f"pulling {escape(name)}", total=total)
        for run in located.found:
            target = dest / run.job if several else dest
            try:
                written = download(run.folder, run.items, target, lambda n: bar.advance(task, n))
            except (StorageError, OSError) as exc:
                raise _fail(f"{run.job}: {exc}") from exc
            for file in written:
                err.print(f"{escape(str(file))}")
    count = sum(len(run.items) for run in located.found)
    err.print(f"{count} file{'' if count == 1 else 's'} ({size_text(total)}) verified in {escape(str(dest))}")
    _say_not_done(located.not_done)
    if not located.found:
        raise typer.Exit(1)
