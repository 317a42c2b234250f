"""The status page in headless Chromium: the overview table, the attempt timeline against the status
history, checkpoints on the progress chart, commit links, self-refresh, escaping, and no secret."""

from __future__ import annotations

import re
from typing import Any

import pytest

from reconciler.web.views import OUTCOME_CLASS
from status.models import MAX_ATTEMPTS_KEPT, JobStatus, Phase
from tests.web.conftest import Server, start_server, stop_server
from tests.web.scenario import (
    CANARY_FORMS,
    HTML_JOB,
    HTML_MESSAGE,
    REFUSED_WHY,
    TARGET,
    TRAIN_ATTEMPTS,
    Scenario,
    build,
)

# The page's colours (style.css), as the browser computes them, per outcome class.
FILL = {"running": "rgb(47, 129, 247)", "succeeded": "rgb(26, 127, 55)", "interrupted": "rgb(212, 167, 44)",
        "stalled": "rgb(130, 80, 223)", "failed": "rgb(207, 34, 46)", "cancelled": "rgb(140, 149, 159)"}


def job_url(server: Server, name: str) -> str:
    from urllib.parse import quote
    return f"{server.url}/job/{quote(name, safe='')}"


def test_overview_shows_every_job_with_phase_progress_eta_and_cost(server: Server, page: Any) -> None:
    page.goto(server.url + "/")
    rows = page.locator("#jobs tbody tr")
    got = {rows.nth(i).get_attribute("data-job"): rows.nth(i).locator("td").all_inner_texts()
           for i in range(rows.count())}
    phases = {name: cells[1] for name, cells in got.items()}
    assert phases == {"backoff-job": "Backoff", "cancelled-job": "Cancelled", "failed-job": "Failed",
                      "launching-job": "Launching", "new-job": "New", "pending-job": "Pending",
                      "succeeded-job": "Succeeded", "suspended-job": "Suspended", "train": "Running",
                      HTML_JOB: "Pending"}
    train = got["train"]
    durable = sum(g for _, o, g, _ in TRAIN_ATTEMPTS if o is not None)
    assert train[2] == f"{durable + 95}/{TARGET} (saved {durable})"  # the live heartbeat from storage
    assert train[3] == str(len(TRAIN_ATTEMPTS))
    assert train[6].startswith("2026-") or re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d", train[6])
    assert train[7] == "$3.20 / $7.90"
    assert train[8].startswith("on track")
    bar = page.locator('#jobs tr[data-job="train"] progress')
    assert float(bar.get_attribute("value")) == pytest.approx(100 * (durable + 95) / TARGET, abs=0.1)
    assert "desired/broken.yaml" in page.locator(".errors").inner_text()  # manifest errors under the table
    assert got["succeeded-job"][2] == "100/100"
    assert page.locator('#jobs tr[data-job="succeeded-job"] progress').get_attribute("value") == "100.0"


def test_overview_shows_each_providers_health(server: Server, page: Any) -> None:
    page.goto(server.url + "/")
    rows = page.locator("#providers tbody tr")
    got = {rows.nth(i).get_attribute("data-provider"): rows.nth(i).locator("td").all_inner_texts()
           for i in range(rows.count())}
    name, state, until, refusals, losses, *_, why = got["slurm"]
    assert (name, state, refusals, losses) == ("slurm", "cooling down", "4", "0")
    assert re.fullmatch(r"\d\d:\d\d UTC", until)
    assert why == f"refused: {REFUSED_WHY}"  # the provider's words, shown as text
    assert all(cells[1] in ("healthy", "tried last") for p, cells in got.items() if p != "slurm")


def test_timeline_has_one_bar_per_attempt_of_the_history_in_its_provider_lane(
        server: Server, scenario: Scenario, page: Any) -> None:
    assert len(TRAIN_ATTEMPTS) > MAX_ATTEMPTS_KEPT  # the newest status alone does not hold them all
    page.goto(job_url(server, "train"))
    lanes = page.locator("#timeline g.lane")
    assert [lanes.nth(i).get_attribute("data-provider") for i in range(lanes.count())] == ["local", "vast", "runpod"]
    lane_y = {lanes.nth(i).get_attribute("data-provider"): lanes.nth(i).locator("line").bounding_box()["y"]
              for i in range(lanes.count())}
    ys = list(lane_y.values())  # each lane ends with its line, the next one starts there
    lane_top = {p: ys[i - 1] if i else ys[0] - (ys[1] - ys[0]) for i, p in enumerate(lane_y)}
    bars = page.locator("#timeline g.bar")
    assert bars.count() == len(TRAIN_ATTEMPTS)
    for i, (provider, outcome, gained, lost) in enumerate(TRAIN_ATTEMPTS):
        bar = page.locator(f'#timeline g.bar[data-epoch="{i + 1}"]')
        assert bar.get_attribute("data-provider") == provider
        assert bar.get_attribute("data-outcome") == (outcome.value if outcome else "")
        box = bar.locator("rect").bounding_box()
        assert lane_top[provider] < box["y"] < lane_y[provider], f"e{i + 1} is not in the {provider} lane"
        cls = OUTCOME_CLASS[outcome] if outcome else "running"
        assert bar.locator("rect").evaluate("r => getComputedStyle(r).fill") == FILL[cls]
        title = bar.locator("title").text_content()
        assert f"(+{gained}, lost {lost})" in title
    starts = [page.locator(f'#timeline g.bar[data-epoch="{i + 1}"] rect').bounding_box()["x"]
              for i in range(len(TRAIN_ATTEMPTS))]
    assert starts == sorted(starts)  # time runs left to right


def test_progress_chart_marks_checkpoints_and_the_live_heartbeat(server: Server, page: Any) -> None:
    page.goto(job_url(server, "train"))
    marks = page.locator("#progress rect.checkpoint title").all_text_contents()
    steps = {int(re.search(r"step (\d+)", m)[1]) for m in marks}
    rises, step = set(), 0
    for _, outcome, gained, _ in TRAIN_ATTEMPTS:
        if outcome is not None and gained:
            step += gained
            rises.add(step)
    durable = max(rises)
    assert steps == rises | {durable + 40, durable + 80}  # status history + the checkpoints in storage
    assert "step " + str(durable + 95) in page.locator("#progress circle.live title").text_content()


def test_status_commits_are_listed_newest_first_with_links_to_the_forge(
        server: Server, scenario: Scenario, page: Any) -> None:
    page.goto(job_url(server, "train"))
    links = page.locator("#commits tbody a")
    newest = list(reversed(scenario.commits["train"]))[:30]
    assert [links.nth(i).inner_text() for i in range(links.count())] == [s[:10] for s in newest]
    assert links.first.get_attribute("href") == f"https://github.com/example/state/commit/{newest[0]}"


def test_html_in_a_job_name_or_message_is_shown_as_text(server: Server, page: Any) -> None:
    page.goto(server.url + "/")
    row = page.locator("#jobs tbody tr").filter(has_text="onerror")
    assert row.locator("td.job").inner_text() == HTML_JOB
    assert row.locator("td.msg").inner_text() == HTML_MESSAGE
    assert page.locator("#jobs img, #jobs script, #jobs b").count() == 0
    row.locator("td.job a").click()
    page.wait_for_load_state()
    assert page.locator("#job-message").inner_text() == HTML_MESSAGE
    assert HTML_JOB in page.locator("#job-name").inner_text()
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_no_page_shows_a_secret_in_any_form(server: Server, page: Any) -> None:
    names = ["train", "failed-job", "launching-job", "pending-job", HTML_JOB]
    for url in [server.url + "/", *(job_url(server, n) for n in names)]:
        page.goto(url)
        html = page.content()
        for form in CANARY_FORMS:
            assert form not in html, url
    page.goto(job_url(server, "failed-job"))  # the log tail in git, re-redacted by the page
    assert "key=***" in page.locator("#log-tail").inner_text()
    page.goto(job_url(server, "launching-job"))  # the attempt's log copy in run storage
    assert "password ***" in page.locator("#log-tail").inner_text()


def test_a_status_change_appears_without_reloading_by_hand(tmp_path: Any, page: Any) -> None:
    sc = build(tmp_path)
    server = start_server(sc.path, "--refresh", "1")
    try:
        page.goto(job_url(server, "pending-job"))
        assert page.locator("#job-phase").inner_text() == "Pending"
        sc.put(JobStatus(job="pending-job", phase=Phase.RUNNING, run_id="r9", message="picked up by local"),
               "pending-job: Running")
        page.locator("#job-phase", has_text="Running").wait_for(timeout=15_000)
        assert page.locator("#job-message").inner_text() == "picked up by local"
        page.goto(server.url + "/")
        sc.put(JobStatus(job="pending-job", phase=Phase.SUCCEEDED, run_id="r9", message="done"), "pending-job: done")
        page.locator('#jobs tr[data-job="pending-job"] .phase', has_text="Succeeded").wait_for(timeout=15_000)
    finally:
        stop_server(server)
