"""`reconciler plan --base REF`: what merging a change would do, judged from git alone, as a
pull-request check sees it (a real repository, the CLI as a subprocess)."""

from __future__ import annotations

import json
import time

import yaml

from desired.models import Job
from desired.parse import DesiredState, parse_desired
from reconciler.cli.review import Review, render_markdown, review
from status.models import Attempt, Forecast, JobStatus, Phase, Progress, render_status
from tests.cli.test_cli import cli
from tests.conftest import StateRepoFixture

# Settings and a provider nobody can reach: a plan that asked storage or a provider would fail or hang.
UNREACHABLE_SETTINGS = ("storage: s3://no-such-bucket/runs\n"
                        "storage_options: {endpoint_url: 'http://127.0.0.1:9'}\n")
UNREACHABLE_PROVIDER = """\
apiVersion: reconciler.dev/v1
kind: Provider
metadata: {name: far}
spec:
  settings:
    type: ssh
    hosts: [{name: gone, address: 192.0.2.1}]
    connect_timeout_seconds: 600
"""


def manifest(name: str, command: str = "train.py", **spec: object) -> str:
    return yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
                           "spec": {"command": ["python", command], "target_steps": 100000, **spec}})


def run_id(text: str) -> str:
    return Job.model_validate(yaml.safe_load(text)).run_id()


def record(repo: StateRepoFixture, name: str, phase: Phase, step: int, **extra: object) -> None:
    """A status file as the reconciler would have committed it for the job's current manifest."""
    text = (repo.path / "desired" / f"{name}.yaml").read_text()
    st = JobStatus(job=name, phase=phase, run_id=run_id(text), manifest=f"desired/{name}.yaml",
                   progress=Progress(step=step, target=100000), **extra)  # type: ignore[arg-type]
    repo.write(f"status/{name}.yaml", render_status(st))


def live(provider: str) -> list[Attempt]:
    return [Attempt(epoch=1, provider=provider, worker="w1", started=time.time() - 3600)]


def base_repo(repo: StateRepoFixture, jobs: int = 4) -> str:
    """`jobs` running jobs, one succeeded, a train job at step 41000 on vast; returns the base commit."""
    repo.write("reconciler.yaml", UNREACHABLE_SETTINGS)
    repo.write("desired/far.yaml", UNREACHABLE_PROVIDER)
    for i in range(jobs):
        repo.write(f"desired/job{i}.yaml", manifest(f"job{i}"))
    repo.write("desired/train.yaml", manifest("train", budget_usd=20))
    repo.write("desired/done.yaml", manifest("done"))
    repo.commit("jobs")
    forecast = Forecast(spent_usd=3.2, projected_cost_usd=12, eta=1798761600.0, risk="on track")
    record(repo, "train", Phase.RUNNING, 41000, attempts=live("vast"), forecast=forecast, cost_usd=3.2)
    record(repo, "done", Phase.SUCCEEDED, 100000, cost_usd=7.5)
    for i in range(jobs):
        record(repo, f"job{i}", Phase.RUNNING, 500)
    return repo.commit("reconciler: status")


def plan(repo: StateRepoFixture, base: str, *args: str, code: int = 0) -> str:
    res = cli("plan", "--repo", str(repo.path), "--base", base, *args, check=False)
    assert res.returncode == code, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    return res.stdout + res.stderr


def test_a_one_job_change_lists_only_that_job_and_asks_no_provider(state_repo: StateRepoFixture) -> None:
    base = base_repo(state_repo, jobs=6)
    state_repo.write("desired/job3.yaml", manifest("job3", budget_usd=40))
    state_repo.commit("job3 gets a budget")
    started = time.monotonic()
    out = plan(state_repo, base)
    # Trying the SSH host would take its 600 s connect timeout: far more than a loaded machine's plan.
    assert time.monotonic() - started < 300
    assert "- job3: in place: applied in place (budget_usd)" in out
    assert "step 500 of 100000" in out and "spec.budget_usd: (unset) -> 40" in out
    assert "7 jobs unchanged" in out and "no actions" not in out
    assert "providers and run storage were not asked" in out
    for other in ("job0", "job5", "train", "done"):
        assert f"- {other}:" not in out


def test_a_command_change_is_a_restart_that_names_the_lost_progress(state_repo: StateRepoFixture) -> None:
    base = base_repo(state_repo)
    state_repo.write("desired/train.yaml", manifest("train", "train2.py", budget_usd=20))
    state_repo.commit("new training script")
    out = plan(state_repo, base)
    assert "- train: restart from zero" in out
    assert "step 41000 of 100000 (41%) is thrown away" in out
    assert "the live worker on vast is stopped" in out
    assert "projected: unknown until measured" in out
    assert plan(state_repo, base, "--fail-on", "restart", code=2).count("failing on --fail-on restart: train") == 1
    plan(state_repo, base, "--fail-on", "cancel")  # no cancel: the check passes


def test_the_in_place_change_keeps_the_recorded_forecast(state_repo: StateRepoFixture) -> None:
    base = base_repo(state_repo)
    state_repo.write("desired/train.yaml", manifest("train", budget_usd=40))
    state_repo.commit("more budget")
    out = plan(state_repo, base)
    assert "- train: in place: applied in place (budget_usd): the run keeps step 41000 of 100000 (41%)" in out
    assert "projected: $12 ($3.20 spent), ETA 2027-01-01 00:00 UTC, on track before this change" in out


def test_a_deleted_manifest_is_a_cancel_that_keeps_the_progress(state_repo: StateRepoFixture) -> None:
    base = base_repo(state_repo)
    state_repo.remove("desired/train.yaml")
    state_repo.commit("drop train")
    out = plan(state_repo, base, "--fail-on", "restart,cancel", code=2)
    assert "- train: cancel: cancelled; the live worker on vast is stopped" in out
    assert "step 41000 of 100000 (41%) stays in storage, and restoring the manifest resumes it" in out


def test_a_succeeded_job_is_never_proposed_again(state_repo: StateRepoFixture) -> None:
    base = base_repo(state_repo)
    state_repo.write("desired/job1.yaml", manifest("job1", suspend=True))
    state_repo.commit("suspend job1")
    out = plan(state_repo, base)
    assert "- job1: suspend: suspended" in out and "done" not in out.split("\n", 3)[3]
    state_repo.write("desired/done.yaml", manifest("done", budget_usd=1))
    state_repo.remove("desired/job0.yaml")
    state_repo.commit("touch the finished job")
    out = plan(state_repo, base)
    assert "- done: in place: budget_usd: the run already succeeded: nothing to apply, nothing re-runs" in out
    assert "restart" not in out and "new run" not in out


def test_a_broken_manifest_exits_1_naming_the_file(state_repo: StateRepoFixture) -> None:
    base = base_repo(state_repo)
    state_repo.write("desired/job2.yaml", manifest("job2", colour="blue"))
    state_repo.write("desired/extra.yaml", manifest("extra"))
    state_repo.commit("a typo")
    out = plan(state_repo, base, code=1)
    assert "desired/job2.yaml" in out and "colour" in out
    assert "- job2: held (manifest error)" in out and "never cancelled" in out
    assert "- extra: new run: a new run from zero" in out


def test_a_bad_ref_is_one_sentence(state_repo: StateRepoFixture) -> None:
    base_repo(state_repo)
    out = plan(state_repo, "origin/nope", code=1)
    assert "'origin/nope' is not a commit" in out


def test_markdown_folds_each_job_into_details(state_repo: StateRepoFixture) -> None:
    base = base_repo(state_repo)
    state_repo.write("desired/train.yaml", manifest("train", "train2.py", budget_usd=20))
    state_repo.write("desired/job0.yaml", manifest("job0", deadline="2027-02-01T00:00:00Z"))
    state_repo.commit("two changes")
    out = plan(state_repo, base, "--format", "markdown")
    assert "| job | change | what it means | projected cost / ETA |" in out
    assert "| `train` | **restart from zero** |" in out
    assert out.count("<details>") == 2 and out.count("</details>") == 2
    assert '- spec.command: ["python", "train.py"]' in out and '+ spec.command: ["python", "train2.py"]' in out
    assert "+ spec.deadline:" in out


def test_json_has_the_documented_keys(state_repo: StateRepoFixture) -> None:
    base = base_repo(state_repo)
    state_repo.write("desired/train.yaml", manifest("train", "train2.py", budget_usd=20))
    state_repo.remove("desired/job0.yaml")
    state_repo.commit("restart and cancel")
    doc = json.loads(plan(state_repo, base, "--format", "json", "--fail-on", "cancel", code=2).split("\nfailing")[0])
    assert {"base", "head", "judged_from", "not_checked", "jobs", "unchanged", "errors", "notes", "fail_on",
            "failed_on", "exit_code"} <= set(doc)
    assert doc["failed_on"] == ["job0"] and doc["exit_code"] == 2 and doc["unchanged"] == 4
    train = next(j for j in doc["jobs"] if j["job"] == "train")
    assert train["change"] == "restart" and train["step"] == 41000 and train["phase_at_base"] == "Running"
    assert {"field": "spec.command", "base": ["python", "train.py"], "head": ["python", "train2.py"]} \
        in train["fields"]
    assert {j["change"] for j in doc["jobs"]} == {"restart", "cancel"}


def test_options_of_a_review_need_base(state_repo: StateRepoFixture) -> None:
    res = cli("plan", "--repo", str(state_repo.path), "--format", "json", check=False)
    assert res.returncode == 2 and "pass --base REF" in res.stderr


# ---- the classifier alone (reconciler.cli.review is pure: desired states and statuses in) -----------

def judge(base: dict[str, str], head: dict[str, str], statuses: list[JobStatus], settings: str = "") -> Review:
    def state(files: dict[str, str]) -> DesiredState:
        return parse_desired({f"desired/{n}.yaml": t for n, t in files.items()}, settings or None)
    return review(state(base), state(head), {s.job: s for s in statuses}, base_commit="b" * 40,
                  head_commit="h" * 40)


def status_of(name: str, text: str, phase: Phase, step: int = 0) -> JobStatus:
    return JobStatus(job=name, phase=phase, run_id=run_id(text), manifest=f"desired/{name}.yaml",
                     progress=Progress(step=step, target=100000))


def test_a_restored_manifest_resumes_its_cancelled_run() -> None:
    text = manifest("a")
    r = judge({}, {"a": text}, [status_of("a", text, Phase.CANCELLED, 30000)])
    assert [(c.job, c.change) for c in r.changes] == [("a", "restore")]
    assert "resumes from step 30000 of 100000 (30%)" in r.changes[0].meaning
    other = judge({}, {"a": manifest("a", "other.py")}, [status_of("a", text, Phase.CANCELLED, 30000)])
    assert other.changes[0].change == "new" and "is not resumed" in other.changes[0].meaning


def test_resume_and_a_suspended_job_s_other_changes() -> None:
    text = manifest("a", suspend=True)
    r = judge({"a": text}, {"a": manifest("a", budget_usd=5)}, [status_of("a", text, Phase.SUSPENDED, 100)])
    assert r.changes[0].change == "resume"
    assert r.changes[0].meaning == "resumes from step 100 of 100000 (<1%); also applied in place: budget_usd"


def test_a_drill_request_is_reviewed_as_a_drill_that_is_charged_to_nothing() -> None:
    text = manifest("a")
    asked = manifest("a", drill_request={"id": "d1", "lookahead": 7, "to": "box"}, budget_usd=5)
    r = judge({"a": text}, {"a": asked}, [status_of("a", text, Phase.RUNNING, 3000)])
    assert [(c.job, c.change) for c in r.changes] == [("a", "drill")]
    assert r.changes[0].meaning == (
        "drill d1: the worker is killed with no notice 7 steps after its next checkpoint, then resumed there on "
        "box, and the steps are compared; charged to nothing, step 3000 of 100000 (3%) is kept; also applied "
        "in place: budget_usd")


def test_cancelling_most_active_jobs_is_said_to_be_held() -> None:
    texts = {n: manifest(n) for n in ("a", "b", "c")}
    statuses = [status_of(n, t, Phase.RUNNING, 10) for n, t in texts.items()]
    r = judge(texts, {"a": texts["a"]}, statuses)
    assert [c.change for c in r.changes] == ["cancel", "cancel"]
    assert any("held by the reconciler" in n and "Reconciler-Confirm: cancel" in n for n in r.notes)
    assert not any("held" in n for n in judge(texts, {"a": texts["a"], "b": texts["b"]}, statuses).notes)


def test_provider_and_settings_changes_are_notes() -> None:
    r = judge({"far": UNREACHABLE_PROVIDER}, {}, [], settings="tick_seconds: -1\n")
    assert "provider far is removed (workers still on it are stopped through its last definition)" in r.notes
    assert "provider local (the default when no provider is declared) is added" in r.notes
    assert any("reconciler.yaml has errors at the head" in n for n in r.notes)
    assert r.exit_code(set()) == 1


def test_a_removed_finished_job_is_not_a_cancel() -> None:
    text = manifest("a")
    r = judge({"a": text}, {}, [status_of("a", text, Phase.SUCCEEDED, 100000)])
    assert r.changes[0].change == "removed" and r.exit_code({"cancel", "restart"}) == 0


def test_a_value_with_backticks_does_not_break_the_comment() -> None:
    r = judge({"a": manifest("a")}, {"a": manifest("a", env={"NOTE": "```x````"})}, [])
    md = render_markdown(r)
    assert "`````diff\n" in md and "\n`````\n" in md


def test_a_base_that_moved_on_is_not_read_as_the_head_undoing_it(state_repo: StateRepoFixture) -> None:
    """A branch made before a job was added on main does not cancel that job when it merges."""
    base_repo(state_repo)
    state_repo.git("checkout", "-q", "-b", "feature")
    state_repo.write("desired/job1.yaml", manifest("job1", budget_usd=9))
    state_repo.commit("job1 budget")
    state_repo.git("checkout", "-q", "main")
    state_repo.write("desired/later.yaml", manifest("later"))
    state_repo.write("desired/job2.yaml", manifest("job2", budget_usd=3))
    state_repo.commit("a job added on main after the branch")
    out = plan(state_repo, "main", "--head", "feature", "--fail-on", "cancel")
    assert "- job1: in place" in out and "later" not in out.split("- job1")[1] and "job2:" not in out
    assert "main has moved on since feature branched off" in out and "6 jobs unchanged" in out


def test_going_back_to_the_recorded_run_is_no_restart() -> None:
    """The base changed the command but the reconciler had not acted on it: the head's revert loses nothing."""
    acted = manifest("a")
    r = judge({"a": manifest("a", "typo.py")}, {"a": acted}, [status_of("a", acted, Phase.RUNNING, 5000)])
    assert r.changes[0].change == "restore" and "goes on from step 5000 of 100000 (5%)" in r.changes[0].meaning


def test_a_storage_change_never_shows_credentials_written_in_its_url(state_repo: StateRepoFixture) -> None:
    """A pull-request comment is read by everyone who can see the PR."""
    base = base_repo(state_repo, jobs=1)
    state_repo.write("reconciler.yaml", UNREACHABLE_SETTINGS.replace(
        "s3://no-such-bucket/runs", "s3://AKIAEXAMPLEKEY:wJalrSECRETexample@other-bucket/runs"))
    state_repo.commit("move storage")
    for fmt in ("text", "markdown", "json"):
        out = plan(state_repo, base, "--format", fmt)
        assert "storage changes from s3://no-such-bucket/runs to s3://***@other-bucket/runs" in out, out
        assert "wJalrSECRETexample" not in out and "AKIAEXAMPLEKEY" not in out


def test_the_review_shows_control_characters_of_the_change_as_escapes() -> None:
    """A pull request is written by whoever opens it: its file names and values reach the check's
    log and the comment with their escape sequences visible, not acted on."""
    from reconciler.cli.review import render_text

    hostile = "\x1b]0;owned\x07\r\u202e"
    base = {"a": manifest("a")}
    head = {"a": manifest("a", "train.py" + hostile), f"bad{hostile}": "kind: Job\n"}
    r = judge(base, head, [status_of("a", base["a"], Phase.RUNNING, 10)])
    for shown in (render_text(r), render_markdown(r)):
        assert not any(c in shown for c in "\x1b\x07\r\u202e"), shown
        assert "\\x1b]0;owned\\x07\\r\\u202e" in shown


def test_the_pull_request_plan_says_which_members_of_a_sweep_start_stop_keep_going_and_are_finished() -> None:
    def sweep(*lrs: float) -> str:
        return manifest("sweep", matrix={"lr": list(lrs)})

    base = parse_desired({"desired/sweep.yaml": sweep(0.1, 0.01, 0.5)})
    head = parse_desired({"desired/sweep.yaml": sweep(0.1, 0.01, 0.003)})
    statuses = {m: JobStatus(job=m, sweep="sweep", phase=phase, run_id=base.jobs[m].run_id())
                for m, phase in (("sweep-lr-0-1", Phase.RUNNING), ("sweep-lr-0-01", Phase.SUCCEEDED),
                                 ("sweep-lr-0-5", Phase.RUNNING))}
    r = review(base, head, statuses, base_commit="b" * 40, head_commit="h" * 40)
    assert r.sweeps == ["sweep sweep: 3 members; 1 start (sweep-lr-0-003); 1 stop (sweep-lr-0-5); "
                        "1 keep going; 1 finished; projected $0.00 (2 members not measured yet)"], r.sweeps
    assert f"- {r.sweeps[0]}" in render_markdown(r)


def test_a_measured_run_gets_p50_and_p90_from_its_futures_in_text_markdown_and_json(
        state_repo: StateRepoFixture) -> None:
    base = base_repo(state_repo, jobs=1)
    now = time.time()
    attempts = [Attempt(epoch=1, provider="far", worker="w1", started=now - 3 * 3600, first_beat=now - 3 * 3600 + 60,
                        first_beat_step=0, step_start=0)]
    record(state_repo, "job0", Phase.RUNNING, 30000, attempts=attempts, cost_usd=0.0)
    base = state_repo.commit("reconciler: status with a measured rate")
    state_repo.write("desired/job0.yaml", manifest("job0", deadline="2099-01-01T00:00:00Z"))
    state_repo.commit("a deadline")
    text = plan(state_repo, base)
    assert "futures: finish P50 " in text and ", P90 " in text and "deadline met in 100% of futures" in text
    assert "inputs: " in text and "declared: far price (price_per_hour of the provider)" in text
    md = plan(state_repo, base, "--format", "markdown")
    assert "P50 / P90 (simulated futures)" in md and "| far | price | $0/h | declared |" in md
    got = json.loads(plan(state_repo, base, "--format", "json"))
    spread = next(j for j in got["jobs"] if j["job"] == "job0")["spread"]
    assert spread["futures"] == 400 and spread["p50_seconds"] <= spread["p90_seconds"]
    assert spread["p_deadline"] == 1.0
    source = {i["input"]: i["source"] for i in spread["inputs"]}
    assert source["rate"] == source["mtbf"] == source["changeover"] == "measured" and source["price"] == "declared"


def test_a_new_job_that_states_its_step_time_gets_futures_before_it_has_run(state_repo: StateRepoFixture) -> None:
    base = base_repo(state_repo, jobs=1)
    state_repo.write("desired/fresh.yaml", manifest("fresh", step_seconds=0.5, deadline="2099-01-01T00:00:00Z"))
    state_repo.write("desired/guess.yaml", manifest("guess"))
    state_repo.commit("two new jobs, one with a step time")
    got = json.loads(plan(state_repo, base, "--format", "json"))
    by_job = {j["job"]: j["spread"] for j in got["jobs"]}
    fresh = by_job["fresh"]
    assert fresh["futures"] == 400 and fresh["p50_seconds"] <= fresh["p90_seconds"]
    assert fresh["p50_seconds"] >= 100000 * 0.5, "at least the stated 0.5 s for each of the 100000 steps"
    rate = next(i for i in fresh["inputs"] if i["input"] == "rate")
    assert (rate["value"], rate["source"]) == (7200.0, "declared") and "step_seconds" in rate["from"]
    assert by_job["guess"]["note"] == "a new run: unknown until measured" and "futures" not in by_job["guess"]
