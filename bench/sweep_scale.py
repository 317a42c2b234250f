"""Sweep scale: `plan`, the loop's ticks and `status` against the number of members of one sweep
(10, 100, 1,000), in a real git state repository.

Each size runs in its own process, in a fresh temporary folder: a git repository (`git init`,
manifests committed as a person would, and a bare `origin` it pushes status to, as a daemon's clone
does), run storage on local disk (`file://`), and one manifest whose `spec.matrix` (lr x seed)
makes the members. Providers are simulated (`adapters/sim.py`, one `SimCloud` shared by every
tick, launch delay 0), so a "running" worker costs nothing but its heartbeats, written through the
same `RunFolder` calls as the worker SDK; everything else is the product's own code.

What is timed, in that order, each as CPU seconds (this process and the git commands it ran and
waited for) and as wall-clock seconds, the best of `--repeat` runs where a measure can be repeated
without changing the state. The exponents are taken from the CPU time: on a shared machine the
wall clock mostly measures the neighbours (and, in the first tick, the disk's fsync), while CPU
time is the work the product does.

- plan: the CLI's `plan` command, called in-process (`reconciler.cli.main.plan(repo=...)`, its
  output captured), on the new sweep before any tick: what its author runs before pushing, every
  member to start. In-process, so Python's start-up and imports (about a second, the same at
  every size) are not in the figure.
- first tick: `Reconciler(path).tick()` launching every member and committing every status file.
- steady tick: a tick with every member running and nothing to change (its status already
  recorded), after the workers have been seen twice.
- status, status --json: the CLI's `status` command, in-process, as a table and as JSON.

Reported per member and as ratios against the smallest size of the same invocation, with a growth
exponent per measure (the slope of log(CPU seconds) against log(members) between the two largest
sizes: 1 is linear).

    python bench/sweep_scale.py --quick        # 10, 100, 300
    python bench/sweep_scale.py                # 10, 100, 1,000 (a few minutes: the simulated
                                               # workers' heartbeats are fsynced files)

Prints the tables, then one line:
sweep_scale plan_exponent=X tick_exponent=Y status_exponent=Z
(status_exponent is the larger of the table's and the JSON's.)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

START = 1_800_000_000.0
TICK_SECONDS = 60.0
MEASURES = (("plan", "plan"), ("launch", "first tick"), ("tick", "steady tick"), ("status", "status"),
            ("status_json", "status --json"))


def shape(n: int) -> tuple[int, int]:
    """lr values x seeds making n members: ten seeds where n allows it."""
    seeds = next(s for s in (10, 5, 2, 1) if n % s == 0 and n >= s)
    return n // seeds, seeds


def git(path: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "alice", "GIT_AUTHOR_EMAIL": "alice@example.com",
           "GIT_COMMITTER_NAME": "alice", "GIT_COMMITTER_EMAIL": "alice@example.com"}
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True, env=env).stdout


def make_repo(root: Path, n: int) -> Path:
    """A user's state repository with one sweep of n members, pushed to a bare origin."""
    lrs, seeds = shape(n)
    origin, state = root / "origin.git", root / "state"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    state.mkdir()
    git(state, "init", "-q", "-b", "main")
    git(state, "remote", "add", "origin", str(origin))
    (state / "desired").mkdir()
    (state / "reconciler.yaml").write_text(f"storage: file://{root / 'runs'}\ntick_seconds: {TICK_SECONDS}\n"
                                           "remote: origin\n")
    (state / "desired" / "providers.yaml").write_text(
        "apiVersion: reconciler.dev/v1\nkind: Provider\nmetadata:\n  name: sim\nspec:\n"
        "  settings: {type: sim, launch_delay_seconds: 0}\n"
        f"  concurrency: {n}\n  price_per_hour: 0.5\n")
    lr_values = ", ".join(f"{round(0.001 * (i + 1), 6)}" for i in range(lrs))
    seed_values = ", ".join(str(s + 1) for s in range(seeds))
    (state / "desired" / "sweep.yaml").write_text(
        "apiVersion: reconciler.dev/v1\nkind: Job\nmetadata:\n  name: sweep\nspec:\n"
        '  command: [python, train.py, --lr, "${{ matrix.lr }}", --seed, "${{ matrix.seed }}"]\n'
        "  target_steps: 10000000\n  checkpoint_every: 600\n"
        f"  matrix:\n    lr: [{lr_values}]\n    seed: [{seed_values}]\n")
    git(state, "add", "-A")
    git(state, "commit", "-q", "-m", f"a sweep of {n} members")
    git(state, "push", "-q", "origin", "main")
    return state


def cpu_seconds() -> float:
    """CPU time of this process and of the children it has waited for (the git commands the
    product runs; GitPython's long-lived `git cat-file` readers are not among them)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def best(fn: Any, repeat: int) -> tuple[float, float, Any]:
    """The shortest wall time of `repeat` calls, the CPU time of that call (cpu_seconds), and the
    last call's result."""
    runs, out = [], None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), cpu_seconds()
        out = fn()
        runs.append((time.perf_counter() - wall, cpu_seconds() - cpu))
    return *min(runs), out


def cli(command: Any, **kwargs: Any) -> str:
    """A CLI command's function, called in-process as typer would call it; its stdout, captured."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        command(**kwargs)
    return buf.getvalue()


def measure(n: int, steady: int, repeat: int, profile: str | None) -> dict[str, Any]:
    from adapters.sim import SimAdapter, SimCloud
    from reconciler.cli.main import StatusOutput, plan, status
    from reconciler.clock import ManualClock
    from reconciler.daemon.asking import ProviderCalls
    from reconciler.daemon.loop import Reconciler

    logging.getLogger("reconciler").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="sweep-scale-") as tmp:
        state = make_repo(Path(tmp), n)
        clock = ManualClock(START)
        cloud = SimCloud(clock, heartbeat_seconds=TICK_SECONDS)

        def adapter(provider: Any, owner: str) -> Any:
            return SimAdapter(provider.name, provider.spec.settings, world=cloud, owner=owner)

        rec = Reconciler(state, clock=clock, adapter_factory=adapter, environ={},
                         provider_calls=ProviderCalls(threads=False))
        out: dict[str, Any] = {"n": n}
        out["plan"], out["plan_cpu"], text = best(lambda: cli(plan, repo=state), repeat)
        out["planned_launches"] = sum(1 for line in text.splitlines() if line.startswith("- launch "))

        def world() -> None:  # simulated time passes: workers start, compute, heartbeat (not timed)
            clock.advance(TICK_SECONDS)
            cloud.advance(clock.now())

        world()
        if profile == "launch":  # the profile is of this first tick itself (it cannot be repeated)
            _profile(rec.tick, out)
        out["launch"], out["launch_cpu"], first = best(rec.tick, 1)
        world()
        rec.tick()  # the attempts become Running
        world()
        rec.tick()  # and their heartbeats are seen once: from here on nothing changes
        if profile == "tick":
            world()
            _profile(rec.tick, out)
        ticks, commits, errors = [], 0, list(first.errors)
        for _ in range(steady):
            world()
            wall, cpu, report = best(rec.tick, 1)
            ticks.append((wall, cpu))
            commits += report.status_commit is not None
            errors += report.errors
        out["tick"], out["tick_cpu"] = min(ticks)
        out["steady_commits"] = commits
        out["running"] = sum(1 for w in cloud.live.values() if w.phase == "computing")
        out["errors"] = errors
        if profile in ("plan", "status"):
            _profile(lambda: cli(plan if profile == "plan" else status, repo=state), out)
        out["status"], out["status_cpu"], table = best(lambda: cli(status, repo=state), repeat)
        out["status_json"], out["status_json_cpu"], js = best(
            lambda: cli(status, repo=state, output=StatusOutput.JSON), repeat)
        rows = json.loads(js)
        out["status_rows"] = len(rows)
        out["status_running"] = sum(1 for r in rows if r["phase"] == "Running")
        out["table_lines"] = len(table.splitlines())
    return out


def _profile(fn: Any, out: dict[str, Any]) -> None:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
    out["profile"] = buf.getvalue()


def exponent(rows: list[dict[str, Any]], key: str) -> float:
    """Slope of log(seconds) against log(members) between the two largest sizes."""
    if len(rows) < 2:
        return float("nan")
    a, b = rows[-2], rows[-1]
    if a[key] <= 0 or b[key] <= 0 or a["n"] == b["n"]:
        return float("nan")
    return math.log(b[key] / a[key]) / math.log(b["n"] / a["n"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10, 100 and 300 members")
    ap.add_argument("--sizes", help="comma-separated member counts (overrides --quick); at most 1,000 each")
    ap.add_argument("--steady", type=int, default=3, help="steady ticks timed at each size (the best is shown)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of plan and status at each size (the best is shown)")
    ap.add_argument("--profile", choices=("plan", "launch", "tick", "status"),
                    help="print a cProfile of one such call at the largest size (launch: the first tick, whose "
                         "figures then are of a second tick launching nothing)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(measure(a.child, a.steady, a.repeat, a.profile)))
        return
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else ([10, 100, 300] if a.quick else [10, 100, 1000])
    if max(sizes) > 1000 or min(sizes) < 1:
        ap.error("a matrix makes 1 to 1,000 members")
    rows = []
    for n in sizes:
        cmd = [sys.executable, __file__, "--child", str(n), "--steady", str(a.steady), "--repeat", str(a.repeat)]
        if a.profile and n == sizes[-1]:
            cmd += ["--profile", a.profile]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"the run of {n} members failed:\n{done.stderr[-4000:]}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(f"# {n} members: plan {r['plan']:.2f} s, first tick {r['launch']:.2f} s, steady tick {r['tick']:.2f} s, "
              f"status {r['status']:.2f} s, --json {r['status_json']:.2f} s; {r['planned_launches']} launches planned, "
              f"{r['running']} running, {r['status_rows']} status rows ({r['status_running']} Running), "
              f"{r['steady_commits']} steady status commits, "
              f"{len(r['errors'])} tick errors", file=sys.stderr, flush=True)
        for e in r["errors"][:5]:
            print(f"#   tick error: {e}", file=sys.stderr)
    base = rows[0]
    for title, suffix in (("CPU seconds (the process and the git commands it ran)", "_cpu"),
                          ("Wall-clock seconds", "")):
        print(f"{title}; each cell: seconds, ms per member, ratio to {base['n']:,} members")
        print()
        print("| members | " + " | ".join(label for _, label in MEASURES) + " |")
        print("|---" * (len(MEASURES) + 1) + "|")
        for r in rows:
            cells = [f"{r[k + suffix]:.2f} · {1000 * r[k + suffix] / r['n']:.1f} · "
                     f"{r[k + suffix] / max(1e-9, base[k + suffix]):.1f}x" for k, _ in MEASURES]
            print(f"| {r['n']:,} ({r['n'] / base['n']:g}x) | " + " | ".join(cells) + " |")
        print()
    exps = {k: exponent(rows, k + "_cpu") for k, _ in MEASURES}
    wall_exps = {k: exponent(rows, k) for k, _ in MEASURES}
    print(f"growth exponents between {rows[-2]['n']:,} and {rows[-1]['n']:,} members (log-log slope; 1 is "
          "linear), CPU (wall): " + ", ".join(f"{label} {exps[k]:.2f} ({wall_exps[k]:.2f})" for k, label in MEASURES))
    prof = next((r["profile"] for r in rows if "profile" in r), None)
    if prof:
        print()
        print(prof)
    status_exp = max(exps["status"], exps["status_json"])
    print()
    print(f"sweep_scale plan_exponent={exps['plan']:.2f} tick_exponent={exps['tick']:.2f} "
          f"status_exponent={status_exp:.2f}")


if __name__ == "__main__":
    main()
