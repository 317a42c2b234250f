"""Help as a newcomer reads it: every option says what it does, no placeholder where no value is
taken, and each command that reads manifests says which copy of them it read."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import typer

from reconciler.cli.main import app
from tests import zygote
from tests.conftest import StateRepoFixture
from tests.daemon.test_loop_local import counter, job


def commands() -> dict[str, Any]:
    return dict(typer.main.get_command(app).commands)  # type: ignore[attr-defined]  # a group


def helped(*args: str) -> str:
    return zygote.run([sys.executable, "-m", "reconciler", *args, "--help"], capture_output=True, text=True,
                      env={**os.environ, "COLUMNS": "200"}, check=True).stdout


def test_every_option_of_every_command_says_what_it_does() -> None:
    silent = [f"{name} {param.opts[0]}" for name, cmd in commands().items() for param in cmd.params
              if param.param_type_name == "option" and not (param.help or "").strip()]
    assert silent == []


def test_a_flag_shows_no_value_placeholder() -> None:
    for args in ((), ("status",), ("logs",), ("run",)):
        assert "<bool>" not in helped(*args), args


def test_exec_help_says_the_command_goes_after_a_double_dash() -> None:
    out = helped("exec")
    assert "[-- CMD ARGS]" in out and "after `--`" in out and "<list" not in out


def test_logs_takes_the_source_options_of_the_other_read_verbs() -> None:
    def source(name: str) -> set[str]:
        return {o for p in commands()[name].params for o in p.opts if o in ("--repo-url", "--branch", "--path")}

    assert source("logs") == source("status") == {"--repo-url", "--branch", "--path"}


def test_validate_and_plan_say_which_copy_of_the_manifests_they_read(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/count.yaml", job("count", counter(1.0)))
    head = state_repo.commit("add count")

    def run(*args: str) -> str:
        return zygote.run([sys.executable, "-m", "reconciler", *args, "--repo", str(state_repo.path)],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, check=True).stdout

    assert "in the working tree (uncommitted changes included" in run("validate")
    assert f"plan for commit {head[:12]}, the last commit; uncommitted changes are not read" in run("plan")


def test_the_daemon_says_where_run_data_and_workers_go_in_one_line(state_repo: StateRepoFixture,
                                                                   local_workdir: Path) -> None:
    res = zygote.run([sys.executable, "-m", "reconciler", "run", "--once", "--repo", str(state_repo.path)],
                     capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"}, check=True)
    line = next(x for x in res.stderr.splitlines() if "run data" in x)
    assert f"is stored in {state_repo.storage} on this machine, outside the repository" in line
    assert f"local workers' folders in {local_workdir / 'workers'}" in line


def test_a_command_s_help_flows_as_paragraphs_not_as_its_source_lines() -> None:
    """Typer kept the docstring's line breaks: `plan`'s line ended after "ETA" at every width."""
    for name, cmd in commands().items():
        for paragraph in (cmd.help or "").split("\n\n"):
            assert "\n" not in paragraph.strip() or paragraph.lstrip().startswith("-"), (name, paragraph)
    row = next(line for line in helped().splitlines() if "projected cost" in line)
    assert "projected cost and ETA (or why they are unknown)" in row, row
