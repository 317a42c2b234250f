"""How long a `git push` of a job takes to become a launch, with a push webhook and with polling,
and how many of the users' pushes the reconciler's own status commits get rejected.

Everything is real and on this machine: a bare repository as origin, `reconciler run` (a
subprocess) on a clone of its own with `remote: origin`, and a user's clone that commits one job
manifest at a time and pushes it without pulling first, as people do. A rejected push is counted,
then pulled with rebase and pushed again; the clock starts when a push is accepted.

Two daemons, one after the other, each on a fresh origin:
  webhook  `run --listen 127.0.0.1:PORT`; after each push the bench sends the GitHub-style push
           webhook itself, signed with the shared secret, as a forge would
  poll     no webhook; the daemon learns of the push at its next tick (`tick_seconds`, default 30)

Measured per push: push -> launch request (the local worker's folder appears) and push -> the
job's status file is on origin. Then, on the webhook daemon, SIGKILL of running workers -> the
relaunch request (the next attempt's folder appears). Jobs are `sleep` on the local provider.

    python bench/latency.py            # 20 pushes per mode, 10 kills, the default 30 s tick
    python bench/latency.py --quick    # 3 pushes, 2 kills, a 2 s tick: a smoke run (tests/)

The last line: webhook_p50_s=X webhook_p99_s=Y poll_p50_s=Z relaunch_p99_s=W user_push_rejections=N
(launch latencies; rejections over both modes; a wait that timed out counts as inf).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECRET = "bench-latency-" + uuid.uuid4().hex  # a webhook secret for this run only
DEFAULT_TICK = 30.0  # reconciler.yaml's default tick_seconds


@dataclass
class World:
    """One origin, the daemon's clone of it and a user's clone, in `base`."""

    base: Path
    origin: Path = field(init=False)
    daemon_clone: Path = field(init=False)
    user: Path = field(init=False)
    workdir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.origin = self.base / "origin.git"
        self.daemon_clone = self.base / "daemon"
        self.user = self.base / "user"
        self.workdir = self.base / "local"


@dataclass
class Samples:
    launch: list[float] = field(default_factory=list)
    status: list[float] = field(default_factory=list)
    rejections: int = 0


def git(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_AUTHOR_NAME": "user", "GIT_AUTHOR_EMAIL": "user@example.com",
           "GIT_COMMITTER_NAME": "user", "GIT_COMMITTER_EMAIL": "user@example.com"}
    return subprocess.run(["git", "-C", str(cwd), *args], check=check, capture_output=True, text=True, env=env)


def job_manifest(name: str) -> str:
    return json.dumps({"apiVersion": "reconciler.dev/v1", "kind": "Job", "metadata": {"name": name},
                       "spec": {"command": ["sleep", "3600"],
                                "retry": {"max_retries": 5, "backoff_seconds": 0, "backoff_max_seconds": 0}}})


def make_world(base: Path, tick: float | None) -> World:
    """The origin holds reconciler.yaml (storage, `remote: origin`) and a local provider."""
    world = World(base)
    base.mkdir(parents=True)
    git(base, "init", "-q", "--bare", "-b", "main", str(world.origin))
    git(base, "clone", "-q", str(world.origin), str(world.user))
    settings = f"storage: file://{base / 'runs'}\nremote: origin\n" + (f"tick_seconds: {tick}\n" if tick else "")
    (world.user / "reconciler.yaml").write_text(settings)
    (world.user / "desired").mkdir()
    (world.user / "desired" / "local.yaml").write_text(json.dumps({
        "apiVersion": "reconciler.dev/v1", "kind": "Provider", "metadata": {"name": "local"},
        "spec": {"settings": {"type": "local", "workdir": str(world.workdir)}, "concurrency": 100}}))
    git(world.user, "add", "-A")
    git(world.user, "commit", "-q", "-m", "settings and a local provider")
    git(world.user, "push", "-q", "origin", "main")
    git(base, "clone", "-q", str(world.origin), str(world.daemon_clone))
    return world


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_daemon(world: World, port: int | None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "reconciler", "run", "--repo", str(world.daemon_clone)]
    if port is not None:
        cmd += ["--listen", f"127.0.0.1:{port}"]
    env = {**os.environ, "RECONCILER_WEBHOOK_SECRET": SECRET,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    log = open(world.base / "daemon.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    if port is not None and wait(lambda: _accepts(port), 30.0) is None:
        stop(proc)
        raise SystemExit(f"the daemon did not listen on 127.0.0.1:{port}; see {world.base / 'daemon.log'}")
    time.sleep(1.0)  # its first tick (nothing to do yet)
    return proc


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def push_job(world: World, name: str) -> tuple[float, int, str]:
    """Commits desired/NAME.yaml and pushes it as a user who did not pull; (accepted at, rejections, sha)."""
    (world.user / "desired" / f"{name}.yaml").write_text(job_manifest(name))
    git(world.user, "add", "-A")
    git(world.user, "commit", "-q", "-m", f"add {name}")
    rejected = 0
    for _ in range(20):
        if git(world.user, "push", "-q", "origin", "main", check=False).returncode == 0:
            return time.monotonic(), rejected, git(world.user, "rev-parse", "HEAD").stdout.strip()
        rejected += 1
        git(world.user, "pull", "-q", "--rebase", "origin", "main")
    raise SystemExit(f"{name}: the user's push was rejected 20 times in a row")


def send_webhook(port: int, sha: str) -> int:
    """A GitHub push delivery for main, signed with the shared secret."""
    body = json.dumps({"ref": "refs/heads/main", "before": "0" * 40, "after": sha, "commits": []}).encode()
    digest = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/webhook", data=body, method="POST", headers={
        "Content-Type": "application/json", "X-GitHub-Event": "push", "X-GitHub-Delivery": str(uuid.uuid4()),
        "X-Hub-Signature-256": f"sha256={digest}"})
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - our own loopback server
        status: int = answer.status
        return status


def wait(predicate: Callable[[], bool], timeout: float, every: float = 0.02) -> float | None:
    """The moment (time.monotonic) `predicate` was first seen to hold, or None after `timeout`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic()
        time.sleep(every)
    return None


def worker_folder(world: World, job: str, epoch: int) -> Path | None:
    found = sorted(world.workdir.glob(f"*.{job}.r-*.e{epoch}"))
    return found[0] if found else None


def launched(world: World, job: str, epoch: int) -> bool:
    return worker_folder(world, job, epoch) is not None


def status_on_origin(world: World, job: str) -> bool:
    """On the status branch (the default with a remote), or on main where status is kept there."""
    return any(git(world.origin, "cat-file", "-e", f"{branch}:status/{job}.yaml", check=False).returncode == 0
               for branch in ("reconciler/status", "main"))


def measure_pushes(world: World, mode: str, pushes: int, port: int | None, timeout: float) -> Samples:
    out = Samples()
    for i in range(pushes):
        name = f"{mode}-{i:02d}"
        accepted, rejected, sha = push_job(world, name)
        out.rejections += rejected
        if port is not None:
            send_webhook(port, sha)
        launch = wait(partial(launched, world, name, 1), timeout)
        left = max(0.0, timeout - (time.monotonic() - accepted))
        seen = wait(partial(status_on_origin, world, name), left, every=0.05)
        out.launch.append(math.inf if launch is None else launch - accepted)
        out.status.append(math.inf if seen is None else seen - accepted)
        print(f"{mode} push {i + 1}/{pushes}: launch {_fmt(out.launch[-1])} s, status on origin "
              f"{_fmt(out.status[-1])} s, rejected pushes {rejected}", flush=True)
        time.sleep(0.3)  # a person's next push comes a little later
    return out


def measure_relaunches(world: World, jobs: list[str], timeout: float) -> list[float]:
    """SIGKILL of each job's running worker command -> the next attempt's folder."""
    out = []
    for job in jobs:
        folder = worker_folder(world, job, 1)
        pid_file = folder / "child.pid" if folder else None
        if pid_file is None or wait(pid_file.exists, 10.0) is None:
            out.append(math.inf)
            continue
        os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        killed = time.monotonic()
        seen = wait(partial(launched, world, job, 2), timeout)
        out.append(math.inf if seen is None else seen - killed)
        print(f"SIGKILL {job}: relaunch requested after {_fmt(out[-1])} s", flush=True)
        time.sleep(0.5)
    return out


def kill_workers(world: World) -> None:
    """Ends every local worker of this run (their supervisors' process groups)."""
    for pid_file in world.workdir.glob("*/supervisor.pid"):
        try:
            os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)
        except (ProcessLookupError, ValueError, PermissionError):
            pass


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of the samples at or below it."""
    if not values:
        return math.inf
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.2f}"


def run_mode(base: Path, mode: str, pushes: int, tick: float | None, kills: int) -> tuple[Samples, list[float]]:
    world = make_world(base / mode, tick)
    port = free_port() if mode == "webhook" else None
    timeout = 30.0 if port is not None else 2 * (tick or DEFAULT_TICK) + 30.0
    proc = start_daemon(world, port)
    try:
        samples = measure_pushes(world, mode, pushes, port, timeout)
        relaunches = measure_relaunches(world, [f"{mode}-{i:02d}" for i in range(min(kills, pushes))], 30.0)
    finally:
        stop(proc)
        kill_workers(world)
    return samples, relaunches


def table(rows: dict[str, list[float]]) -> str:
    lines = ["| measure | n | p50 s | p90 s | p99 s | max s |", "|---|---|---|---|---|---|"]
    for name, values in rows.items():
        if values:
            lines.append(f"| {name} | {len(values)} | {_fmt(percentile(values, 0.5))} | "
                         f"{_fmt(percentile(values, 0.9))} | {_fmt(percentile(values, 0.99))} | {_fmt(max(values))} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=None, help="pushes per mode (default 20; 3 with --quick)")
    parser.add_argument("--kills", type=int, default=None, help="workers SIGKILLed (default 10; 2 with --quick)")
    parser.add_argument("--poll-tick", type=float, default=None,
                        help="tick_seconds of the polling daemon (default: reconciler.yaml's default, 30 s)")
    parser.add_argument("--quick", action="store_true", help="3 pushes, 2 kills, a 2 s tick: a smoke run")
    args = parser.parse_args()
    quick = {"pushes": 3, "kills": 2, "poll_tick": 2.0} if args.quick else {"pushes": 20, "kills": 10}
    for name, value in quick.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        webhook, relaunch = run_mode(Path(tmp), "webhook", args.pushes, None, args.kills)
        poll, _ = run_mode(Path(tmp), "poll", args.pushes, args.poll_tick, 0)
    tick = args.poll_tick or DEFAULT_TICK
    print()
    print(f"{args.pushes} pushes per mode; polling at a {tick:g} s tick; {os.cpu_count()} CPUs")
    print(table({"webhook: push -> launch": webhook.launch, "webhook: push -> status on origin": webhook.status,
                 f"poll ({tick:g} s): push -> launch": poll.launch,
                 f"poll ({tick:g} s): push -> status on origin": poll.status,
                 "SIGKILL -> relaunch": relaunch}))
    print(f"user push attempts rejected: webhook {webhook.rejections} (in {args.pushes} pushes), "
          f"poll {poll.rejections} (in {args.pushes} pushes)")
    figures = {"webhook_p50_s": percentile(webhook.launch, 0.5), "webhook_p99_s": percentile(webhook.launch, 0.99),
               "poll_p50_s": percentile(poll.launch, 0.5), "relaunch_p99_s": percentile(relaunch, 0.99)}
    print(" ".join(f"{k}={_fmt(v)}" for k, v in figures.items()) +
          f" user_push_rejections={webhook.rejections + poll.rejections}")


if __name__ == "__main__":
    main()
