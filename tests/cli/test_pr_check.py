"""The pull-request check `reconciler init --github-actions` writes: linted by real workflow linters,
and its own `run:` steps executed in order with bash on a real clone holding a base branch and a
pull-request branch, the way the Actions runner would run them. Only the GitHub comment API is a
stand-in (`gh` below, on PATH); git, pip, the reconciler and jq are the real programs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from reconciler.cli.pr_check import WORKFLOW_PATH, WorkflowError, render_workflow
from tests.cli.test_cli import cli

IN_CI = os.environ.get("CI", "").lower() == "true"
ROOT = Path(__file__).parents[2]
MARKER = "<!-- reconciler-plan -->"
REPOSITORY = "octo/state"
PR_NUMBER = "7"


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        if IN_CI:
            pytest.fail(f"CI=true but `{tool}` is not installed (pip install -e '.[dev]')", pytrace=False)
        pytest.skip(f"`{tool}` is not installed (pip install -e '.[dev]')")
    return path


# ---- the stand-in for the GitHub comment API ------------------------------------------------------

GH_STUB = textwrap.dedent('''\
    #!{python}
    """Stands in for `gh api` on the issue-comment endpoints; --jq runs through the real jq."""
    import json, os, re, subprocess, sys
    args = sys.argv[1:]
    assert args[0] == "api", args
    if not os.environ.get("GH_TOKEN"):
        sys.exit("gh: GH_TOKEN is not set")
    method, path, jq, fields, i = "GET", None, None, {{}}, 1
    while i < len(args):
        a = args[i]
        if a == "--method":
            method, i = args[i + 1], i + 2
        elif a == "--jq":
            jq, i = args[i + 1], i + 2
        elif a == "-F":
            key, _, value = args[i + 1].partition("=")
            fields[key] = open(value[1:]).read() if value.startswith("@") else value
            i += 2
        elif a in ("--paginate", "--silent"):
            i += 1
        else:
            path, i = a, i + 1
    state_file = os.environ["GH_STUB_STATE"]
    state = json.load(open(state_file))
    state["calls"].append([method, path])
    repo = os.environ["GH_STUB_REPOSITORY"]
    listing = re.fullmatch(r"repos/" + repo + r"/issues/(\\d+)/comments", path)
    one = re.fullmatch(r"repos/" + repo + r"/issues/comments/(\\d+)", path)
    if listing and method == "GET":
        out = [c for c in state["comments"] if c["issue"] == int(listing.group(1))]
    elif listing and method == "POST":
        out = {{"id": 1000 + len(state["comments"]), "issue": int(listing.group(1)), "body": fields["body"],
               "user": {{"login": "github-actions[bot]", "type": "Bot"}}}}
        state["comments"].append(out)
    elif one and method == "PATCH":
        out = next(c for c in state["comments"] if c["id"] == int(one.group(1)))
        out["body"] = fields["body"]
    else:
        sys.exit(f"gh stub: no {{method}} {{path}}")
    json.dump(state, open(state_file, "w"))
    text = json.dumps(out)
    if jq:
        text = subprocess.run(["jq", "-r", jq], input=text, capture_output=True, text=True, check=True).stdout
    if "--silent" not in args:
        sys.stdout.write(text)
    ''')


@dataclass
class Runner:
    """What the Actions runner provides: a workspace (the clone), a temp folder, PATH with Python
    (a venv, where the install step puts the reconciler) and `gh`."""

    workspace: Path
    temp: Path
    bin: Path
    venv: Path
    gh_state: Path
    base_sha: str
    head_sha: str
    package: Path
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    logs: list[str] = field(default_factory=list)

    def comments(self) -> list[dict]:
        return list(json.loads(self.gh_state.read_text())["comments"])

    def context(self) -> dict[str, str]:
        ctx = {
            "github.event.pull_request.base.sha": self.base_sha,
            "github.event.pull_request.head.sha": self.head_sha,
            "github.event.pull_request.number": PR_NUMBER,
            "github.event.pull_request.head.repo.full_name": REPOSITORY,
            "github.repository": REPOSITORY,
            "github.token": "ghs_stand-in-token",
        }
        for step, outputs in self.outputs.items():
            ctx.update({f"steps.{step}.outputs.{k}": v for k, v in outputs.items()})
        ctx.update({f"steps.{step}.outcome": v for step, v in self.outcomes.items()})
        return ctx


EXPRESSION = re.compile(r"\$\{\{\s*(.+?)\s*\}\}")


def expand(value: object, ctx: dict[str, str]) -> str:
    """A `${{ name }}` in an `env:` value, as Actions substitutes it; an unknown name fails the test."""
    return EXPRESSION.sub(lambda m: ctx[m.group(1)], str(value))


def condition(text: str, ctx: dict[str, str], failed: bool) -> bool:
    """The `if:` forms the workflow uses: `!cancelled()`, `a == b` joined by `&&`; none means success()."""
    if not text:
        return not failed
    inner = EXPRESSION.fullmatch(text.strip())
    assert inner, f"an `if:` outside ${{{{ }}}}: {text}"
    result = True
    for term in (t.strip() for t in inner.group(1).split("&&")):
        if term == "!cancelled()":
            continue
        left, _, right = (s.strip() for s in term.partition("=="))
        value = [s[1:-1] if s.startswith("'") else ctx[s] for s in (left, right)]
        result = result and value[0] == value[1]
    return result


def run_workflow(runner: Runner, workflow_text: str) -> bool:
    """Runs the workflow's steps in order; returns whether the job succeeded."""
    workflow = yaml.safe_load(workflow_text)
    job = workflow["jobs"]["plan"]
    assert workflow[True]["pull_request"]["paths"] == ["desired/**", "reconciler.yaml"]  # `on:` reads as True
    failed = False
    runner.outputs.clear()
    runner.outcomes.clear()
    summary = runner.temp / "summary.md"
    for number, step in enumerate(job["steps"]):
        ctx = runner.context()
        if "uses" in step:
            if step["uses"].startswith("actions/checkout@"):
                assert step["with"]["fetch-depth"] == 0 and step["with"]["persist-credentials"] is False
            continue  # the clone is the checkout; the venv on PATH is setup-python
        if not condition(str(step.get("if", "")), ctx, failed):
            continue
        assert "${{" not in step["run"], f"an expression inside a run: script ({step['name']}); pass it by env:"
        output = runner.temp / f"output-{number}"
        output.write_text("")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GITHUB_OUTPUT")}
        env.update({k: expand(v, ctx) for k, v in {**job.get("env", {}), **step.get("env", {})}.items()})
        path = os.pathsep.join((str(runner.bin), str(runner.venv / "bin"), os.environ["PATH"]))
        env.update(CI="true", GITHUB_ACTIONS="true", RUNNER_TEMP=str(runner.temp), GITHUB_OUTPUT=str(output),
                   GITHUB_STEP_SUMMARY=str(summary), PATH=path,
                   GH_STUB_STATE=str(runner.gh_state), GH_STUB_REPOSITORY=REPOSITORY)
        if step["name"] == "Install the reconciler":  # this checkout instead of the published version
            env.update(RECONCILER_PACKAGE=str(runner.package), PIP_NO_DEPS="1", PIP_NO_INDEX="1",
                       PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
        script = runner.temp / f"step-{number}.sh"
        script.write_text(step["run"])
        res = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                             cwd=runner.workspace, env=env, capture_output=True, text=True, timeout=300)
        runner.logs.append(f"== {step['name']} (exit {res.returncode})\n{res.stdout}{res.stderr}")
        outcome = "success" if res.returncode == 0 else "failure"
        if "id" in step:
            runner.outcomes[step["id"]] = outcome
            runner.outputs[step["id"]] = dict(line.split("=", 1) for line in output.read_text().splitlines())
        failed = failed or res.returncode != 0
    return not failed


def job(name: str, script: str, **spec: object) -> str:
    return yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
                           "spec": {"command": ["python", script], "target_steps": 1000, **spec}})


def commit(repo: Path, message: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "alice", "GIT_AUTHOR_EMAIL": "alice@example.com",
           "GIT_COMMITTER_NAME": "alice", "GIT_COMMITTER_EMAIL": "alice@example.com"}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", message], check=True, env=env)
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    """`reconciler init --github-actions` on main, two jobs; a pull-request branch that changes one
    job's command (a restart) and deletes the other (a cancel); a full clone as the checkout."""
    need("jq")
    tmp = tmp_path_factory.mktemp("pr")
    origin = tmp / "origin"
    cli("init", str(origin), "--github-actions")
    subprocess.run(["git", "-C", str(origin), "branch", "-M", "main"], check=True)
    (origin / "desired" / "train.yaml").write_text(job("train", "train.py"))
    (origin / "desired" / "sweep.yaml").write_text(job("sweep", "sweep.py"))
    base = commit(origin, "train and sweep")
    subprocess.run(["git", "-C", str(origin), "checkout", "-q", "-b", "lower-lr"], check=True)
    (origin / "desired" / "train.yaml").write_text(job("train", "train.py", env={"LR": "0.0001"}))
    (origin / "desired" / "sweep.yaml").unlink()
    head = commit(origin, "lower the learning rate, drop the sweep")
    workspace = tmp / "workspace"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(origin), str(workspace)], check=True)
    subprocess.run(["git", "-C", str(workspace), "checkout", "-q", "--detach", head], check=True)

    package = tmp / "package"  # pip builds in the source folder: a copy keeps this checkout clean
    for part in ("reconciler", "desired", "status", "adapters"):
        shutil.copytree(ROOT / part, package / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, package / part)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(GH_STUB.format(python=sys.executable))
    (bin_dir / "gh").chmod(0o755)
    temp = tmp / "runner-temp"
    temp.mkdir()
    gh_state = tmp / "github.json"
    human = {"id": 1, "issue": int(PR_NUMBER), "body": f"{MARKER} quoted by a person",
             "user": {"login": "alice", "type": "User"}}
    gh_state.write_text(json.dumps({"comments": [human], "calls": []}))
    return Runner(workspace, temp, bin_dir, venv, gh_state, base, head, package)


def test_the_generated_workflow_passes_actionlint_and_zizmor(tmp_path: Path) -> None:
    actionlint, zizmor = need("actionlint"), need("zizmor")
    need("shellcheck")  # actionlint checks the run: scripts with it when it is on PATH
    cli("init", str(tmp_path), "--github-actions", "--fail-on", "restart,cancel")
    target = tmp_path / WORKFLOW_PATH
    assert 'RECONCILER_FAIL_ON: "cancel,restart"' in target.read_text()
    lint = subprocess.run([actionlint, "-no-color", str(target)], capture_output=True, text=True, cwd=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    audit = subprocess.run([zizmor, "--offline", "--no-progress", str(target)], capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_init_never_overwrites_a_workflow_and_refuses_bad_values(tmp_path: Path) -> None:
    (tmp_path / WORKFLOW_PATH).parent.mkdir(parents=True)
    (tmp_path / WORKFLOW_PATH).write_text("# edited by hand\n")
    out = cli("init", str(tmp_path), "--github-actions").stdout
    assert WORKFLOW_PATH not in out and (tmp_path / WORKFLOW_PATH).read_text() == "# edited by hand\n"
    bad = cli("init", str(tmp_path / "x"), "--github-actions", "--fail-on", "restart,merge", check=False)
    assert bad.returncode == 2 and "not merge" in bad.stderr
    alone = cli("init", str(tmp_path / "y"), "--fail-on", "restart", check=False)
    assert alone.returncode == 2 and "--github-actions" in alone.stderr
    with pytest.raises(WorkflowError, match="not a pip requirement"):
        render_workflow('reconciler"\n  evil: 1')


def test_the_workflow_steps_comment_the_plan_and_update_the_same_comment(runner: Runner) -> None:
    text = (runner.workspace / WORKFLOW_PATH).read_text()
    ok = run_workflow(runner, text)
    assert ok, "\n".join(runner.logs)
    where = subprocess.run([str(runner.venv / "bin" / "python"), "-c", "import reconciler; print(reconciler.__file__)"],
                           capture_output=True, text=True, cwd=runner.temp,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert str(runner.venv) in where.stdout and (runner.venv / "bin" / "reconciler").exists(), "the install step ran"
    ours = [c for c in runner.comments() if c["user"]["type"] == "Bot"]
    assert len(ours) == 1, runner.comments()
    body = ours[0]["body"]
    assert body.startswith(MARKER) and "### reconciler plan" in body
    assert "1 restart from zero, 1 cancel" in body, body
    assert "`train`" in body and "`sweep`" in body
    assert (runner.temp / "summary.md").read_text().strip() in body

    # A second push: the same comment is updated, none is added, the person's is left alone.
    (runner.workspace / "desired" / "train.yaml").write_text(job("train", "train.py", env={"LR": "0.0002"}))
    runner.head_sha = commit(runner.workspace, "a different learning rate")
    assert run_workflow(runner, text), "\n".join(runner.logs)
    comments = runner.comments()
    assert [c["id"] for c in comments] == [1, ours[0]["id"]], comments
    assert comments[0]["body"] == f"{MARKER} quoted by a person"
    assert "0.0002" in comments[1]["body"]
    calls = json.loads(runner.gh_state.read_text())["calls"]
    assert [m for m, _ in calls] == ["GET", "POST", "GET", "PATCH"], calls


def ours(runner: Runner) -> list[dict]:
    """The workflow's own comments (the module's runner also holds a person's, from another test)."""
    return [c for c in runner.comments() if c["user"]["type"] == "Bot"]


def test_fail_on_restart_fails_the_check_after_commenting(runner: Runner) -> None:
    before = len(ours(runner))
    text = render_workflow(fail_on="restart")
    assert not run_workflow(runner, text), "\n".join(runner.logs)
    assert runner.outputs["plan"]["exit_code"] == "2"
    assert "exit 2" in runner.logs[-1] and "Fail on" in runner.logs[-1]
    assert len(ours(runner)) == max(before, 1), "one comment, posted or updated before the check fails"
    assert "restart" in runner.comments()[-1]["body"]


def test_a_broken_manifest_fails_the_check_and_the_comment_names_the_file(runner: Runner) -> None:
    (runner.workspace / "desired" / "broken.yaml").write_text(job("broken", "b.py").replace("target_steps", "tagret"))
    runner.head_sha = commit(runner.workspace, "a typo")
    assert not run_workflow(runner, (runner.workspace / WORKFLOW_PATH).read_text())
    assert runner.outcomes["plan"] == "success" and runner.outputs["plan"]["exit_code"] == "1"
    assert "Validate the manifests (exit 1)" in "\n".join(runner.logs)
    body = runner.comments()[-1]["body"]
    assert "desired/broken.yaml" in body and "tagret" in body, body
