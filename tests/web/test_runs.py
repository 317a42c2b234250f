"""A job whose command changed: two runs on its page (issue 27 items 1 and 3), in headless Chromium.

Run A made 600 steps over two attempts; the command changed while its second attempt ran, so run B
began at step 0 with run A's attempts kept in its status, written as the loop wrote them before
attempts named their run. Run B's worker reports a loss through the SDK (`run.heartbeat`), so its
section has a loss chart beside its progress.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.storage import RunFolder
from reconciler.worker import open_run
from status.models import Attempt, JobStatus, Outcome, Phase, Progress, parse_status, render_status
from tests.web.conftest import Server, start_server, stop_server
from tests.web.scenario import HOUR, Scenario, manifest

OLD, NEW = "r-0a1d", "r-0b2e"
LOSSES = [2.5 - 0.1 * i for i in range(15)]  # run B's loss at steps 10, 20, ... 150


def _legacy(st: JobStatus) -> JobStatus:
    """As the loop wrote statuses before attempts named their run."""
    return st.model_copy(update={"attempts": [a.model_copy(update={"run_id": ""}) for a in st.attempts]})


def two_runs(root: Path) -> Scenario:
    path, storage = root / "state", root / "runs"
    path.mkdir(parents=True)
    t = float(int(time.time() - 6 * HOUR))
    sc = Scenario(path, storage, t)
    sc.git("init", "-q", "-b", "main")
    (path / "reconciler.yaml").write_text(f"storage: file://{storage}\ntick_seconds: 5\n")
    (path / "desired").mkdir()
    (path / "desired" / "retrain.yaml").write_text(manifest("retrain", 1000))
    sc.git("add", "-A", when=t - 60)
    sc.git("commit", "-q", "-m", "jobs", when=t - 60)
    a = JobStatus(job="retrain", phase=Phase.RUNNING, run_id=OLD, progress=Progress(step=0, target=1000),
                  total_attempts=1, attempts=[Attempt(epoch=1, provider="local", worker="w1", started=t)])
    sc.put(_legacy(a), "retrain: Running", when=t + 60)
    a.attempts[0] = a.attempts[0].model_copy(update={"ended": t + HOUR, "outcome": Outcome.INTERRUPTION,
                                                       "step_end": 300})
    a.progress = Progress(step=300, target=1000)
    a.attempts.append(Attempt(epoch=2, provider="vast", worker="w2", started=t + HOUR + 60, step_start=300))
    a.total_attempts = 2
    sc.put(_legacy(a), "retrain: Running on vast", when=t + HOUR + 120)
    a.progress = Progress(step=600, target=1000)
    sc.put(_legacy(a), "retrain: checkpointed step 600", when=t + 2 * HOUR)
    replaced = a.attempts[1].model_copy(update={"ended": t + 3 * HOUR, "outcome": Outcome.CANCELLED,
                                                "step_end": 600, "detail": "replaced by a new run"})
    b = JobStatus(job="retrain", phase=Phase.LAUNCHING, run_id=NEW, progress=Progress(step=0, target=1000),
                  message=f"run {NEW} replaces {OLD}", attempts=[a.attempts[0], replaced])
    sc.put(_legacy(b), f"retrain: run {NEW} replaces {OLD}", when=t + 3 * HOUR)
    b.attempts.append(Attempt(epoch=1, provider="local", worker="w3", started=t + 3 * HOUR + 30))
    b.total_attempts, b.phase = 1, Phase.RUNNING
    sc.put(_legacy(b), "retrain: Running", when=t + 3 * HOUR + 60)
    b.progress = Progress(step=100, target=1000)
    sc.put(_legacy(b), "retrain: checkpointed step 100", when=t + 4 * HOUR)
    run = open_run(uri=RunFolder.for_run(f"file://{storage}", "retrain", NEW).uri, run_id=NEW, target=1000,
                   heartbeat_interval=0, install_signal_handlers=False)
    for i, loss in enumerate(LOSSES):
        run.heartbeat(10 * (i + 1), loss=loss)
    run.close()
    return sc


@pytest.fixture(scope="module")
def runs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    sc = two_runs(tmp_path_factory.mktemp("runs"))
    srv = start_server(sc.path, "--refresh", "300")
    yield srv
    stop_server(srv)


def test_each_run_has_its_own_attempts_and_progress_this_run_first(runs_server: Server, page: Any) -> None:
    page.goto(runs_server.url + "/job/retrain")
    sections = page.locator("section.run, details.run")
    assert [sections.nth(i).get_attribute("data-run") for i in range(sections.count())] == [NEW, OLD]
    this, earlier = page.locator(f'section.run[data-run="{NEW}"]'), page.locator(f'details.run[data-run="{OLD}"]')
    assert earlier.get_attribute("open") is None  # folded
    assert "2 attempts kept, reached step 600" in earlier.locator("summary").inner_text()
    rows = this.locator("table.attempts tbody tr")
    assert rows.count() == 1 and rows.first.locator("td").nth(2).inner_text() == "w3"
    assert this.locator("#timeline g.bar").count() == 1
    earlier.locator("summary").click()
    old_rows = earlier.locator("table.attempts tbody tr")
    assert [old_rows.nth(i).locator("td").nth(2).inner_text() for i in range(old_rows.count())] == ["w2", "w1"]
    assert earlier.locator("table.attempts tbody tr").filter(has_text="cancelled").count() == 1
    assert page.locator("table.attempts tbody tr").count() == 3  # three attempts, each once
    # Each run's durable progress on its own chart: run B's never shows run A's 600.
    marks = {int(re.search(r"step (\d+)", m)[1]) for m in this.locator("rect.checkpoint title").all_text_contents()}
    assert marks == {100}
    old_marks = earlier.locator("rect.checkpoint title").all_text_contents()
    assert {int(re.search(r"step (\d+)", m)[1]) for m in old_marks} == {300, 600}
    assert "step 150" in this.locator("#progress circle.live title").text_content()


def test_the_loss_a_worker_reports_is_plotted_over_steps_beside_progress(runs_server: Server, page: Any) -> None:
    page.goto(runs_server.url + "/job/retrain")
    this = page.locator(f'section.run[data-run="{NEW}"]')
    box = this.locator('.chart-box.metric[data-metric="loss"]')
    assert box.locator("h3").inner_text() == "loss"
    line = box.locator(f'g.series[data-label="{NEW}"] polyline')
    points = [tuple(map(float, p.split(","))) for p in line.get_attribute("points").split()]
    assert len(points) == len(LOSSES)
    xs, ys = [x for x, _ in points], [y for _, y in points]
    assert xs == sorted(xs) and ys == sorted(ys)  # steps left to right; the loss falls, so y grows downwards
    assert "loss 1.1 at step 150" in box.locator("circle title").text_content()
    progress = this.locator("#progress").bounding_box()
    chart = box.locator("svg").bounding_box()
    assert chart["x"] > progress["x"] + progress["width"] - 1 and abs(chart["y"] - progress["y"]) < 40  # beside it
    assert page.locator(f'details.run[data-run="{OLD}"] .chart-box.metric').count() == 0


def test_several_runs_or_sweep_members_share_one_chart_per_metric() -> None:
    from reconciler.web.views import metric_charts

    charts = metric_charts({"lr-1e-3": {"loss": [(10, 2.0), (20, 1.0)], "accuracy": [(20, 0.5)]},
                            "lr-1e-4": {"loss": [(10, 2.2), (20, 1.8), (30, 1.6)]}})
    assert [c.name for c in charts] == ["accuracy", "loss"]
    loss = charts[1]
    assert [(line.label, len(line.points.split())) for line in loss.lines] == [("lr-1e-3", 2), ("lr-1e-4", 3)]
    assert len({line.index for line in loss.lines}) == 2  # told apart by colour


def test_an_attempt_kept_by_a_new_runs_status_is_merged_once_under_its_own_run() -> None:
    from reconciler.web.views import merge_attempts, run_order

    first = Attempt(epoch=1, provider="local", worker="w1", started=1000.0, ended=2000.0,
                    outcome=Outcome.INTERRUPTION)
    old = JobStatus(job="j", run_id=OLD, total_attempts=1, attempts=[first])
    new = JobStatus(job="j", run_id=NEW, total_attempts=1,
                    attempts=[first, Attempt(epoch=1, provider="local", worker="w2", started=3000.0)])
    as_read = [parse_status(render_status(_legacy(st))) for st in (old, new)]  # as the page reads git
    merged = merge_attempts([st for st in as_read if st is not None])
    assert [(a.worker, a.run_id) for a in merged] == [("w1", OLD), ("w2", NEW)]
    assert run_order(NEW, merged, [(1500.0, old), (3500.0, new)]) == [NEW, OLD]
