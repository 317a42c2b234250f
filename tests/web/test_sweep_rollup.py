"""The status page rolls a sweep's members up, as `status` does: how many, by phase, what they spent."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from reconciler.web.app import create_app
from status.models import Phase
from tests.cli.test_cli_sweeps import record, sweep
from tests.conftest import StateRepoFixture


def test_the_overview_has_a_row_a_sweep_with_its_members_counted_by_phase(state_repo: StateRepoFixture) -> None:
    state_repo.write("desired/sweep.yaml", sweep([1, 2, 3]))
    record(state_repo, [1, 2, 3], [Phase.RUNNING, Phase.RUNNING, Phase.SUCCEEDED])
    state_repo.commit("a sweep, as recorded")
    page = TestClient(create_app(state_repo.path)).get("/").text
    row = re.search(r'<tr data-sweep="sweep">(.*?)</tr>', page)
    assert row, page
    text = re.sub(r"<[^>]+>", " ", row.group(1))
    assert text.split() == ["sweep", "3", "Running", "2", "Succeeded", "1", "$1.50"], text
    for member in ("sweep-seed-1", "sweep-seed-2", "sweep-seed-3"):  # each still a row of its own
        assert f'<tr data-job="{member}">' in page
