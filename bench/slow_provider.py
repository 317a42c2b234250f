"""Tick time when one provider answers in 30 s, against the tick time when it answers at once.

The real loop, in this process: a git state repository, S3 on moto (loopback), a local provider
running one job, and a Vast provider served by the fake Vast server (tests/fakes/vast.py) on
loopback, whose instance list answers after `--slow` seconds. Three runs of `--ticks` ticks each:

  normal   the fake answers at once
  slow     it answers in `--slow` s; `provider_deadline_seconds` at its default (20 s)
  patient  the same, with `provider_deadline_seconds` above `--slow`: every tick waits for the
           answer, as every tick did when providers were asked one after another

    python bench/slow_provider.py              # 30 s, 4 ticks per run (about 3 minutes)
    python bench/slow_provider.py --slow 3 --ticks 2

Prints each tick's seconds, then one line: normal_s=… slow_first_s=… slow_max_s=… patient_max_s=…
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from desired.models import VastSettings  # noqa: E402
from reconciler.daemon.loop import Reconciler  # noqa: E402
from tests.fakes.vast import FakeVast  # noqa: E402
from tests.worker.harness import S3_CREDENTIALS  # noqa: E402


def manifest(kind: str, name: str, spec: dict[str, object]) -> str:
    return yaml.safe_dump({"apiVersion": "reconciler.dev/v1", "kind": kind, "metadata": {"name": name}, "spec": spec})


def state_repo(root: Path, endpoint: str, bucket: str, vast_url: str, deadline: float | None) -> Path:
    repo = root / "state"
    (repo / "desired").mkdir(parents=True)
    settings = {"storage": f"s3://{bucket}/runs", "storage_options": {"endpoint_url": endpoint}, "tick_seconds": 1}
    if deadline is not None:
        settings["provider_deadline_seconds"] = deadline
    (repo / "reconciler.yaml").write_text(yaml.safe_dump(settings))
    vast = VastSettings(api_url=vast_url, request_timeout_seconds=120).model_dump(mode="json")
    (repo / "desired" / "spot.yaml").write_text(manifest("Provider", "spot", {"settings": vast, "concurrency": 1}))
    (repo / "desired" / "box.yaml").write_text(manifest("Provider", "box", {"settings": {"type": "local"},
                                                                            "concurrency": 1}))
    (repo / "desired" / "sleep.yaml").write_text(manifest("Job", "sleep", {
        "command": ["sleep", "3600"], "placement": {"providers": ["box"]},
        "secrets": ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"], "env": {"AWS_DEFAULT_REGION": "us-east-1"}}))
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["-c", "user.name=bench", "-c", "user.email=b@x",
                                                               "commit", "-q", "-m", "bench"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    return repo


def run(name: str, endpoint: str, bucket: str, slow: float, deadline: float | None, ticks: int) -> list[float]:
    """Seconds of each tick; the job on the local provider is stopped at the end."""
    with tempfile.TemporaryDirectory() as tmp:
        fake = FakeVast(Path(tmp) / "vast")
        fake.serve()
        os.environ["VAST_API_KEY"] = fake.key
        if slow:
            fake.fail("list", kind="hang", seconds=slow, times=10_000)
        rec = Reconciler(state_repo(Path(tmp), endpoint, bucket, fake.url, deadline))
        took = []
        for _ in range(ticks):
            began = time.monotonic()
            report = rec.tick()
            took.append(time.monotonic() - began)
            call = report.provider_calls.get("spot")
            print(f"{name:8} tick {len(took)}: {took[-1]:6.2f} s  spot "
                  f"{'answered' if call and call.answered else 'no answer'}"
                  f"{f' in {call.seconds:.1f} s' if call and call.answered else ''}", flush=True)
        box = rec.adapters_for(rec.read_desired(rec.repo.head()), [])["box"]
        for worker in box.observe():
            box.terminate(worker)
        fake.released.set()
        fake.close()
        return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slow", type=float, default=30.0, help="seconds the slow provider takes to answer")
    parser.add_argument("--ticks", type=int, default=4, help="ticks per run")
    args = parser.parse_args(argv)
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").disabled = True  # moto's access log
    os.environ.update(S3_CREDENTIALS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        results = {}
        for name, slow, deadline in (("normal", 0.0, None), ("slow", args.slow, None),
                                     ("patient", args.slow, args.slow * 2)):
            bucket = f"bench-{name}"
            s3.create_bucket(Bucket=bucket)
            results[name] = run(name, endpoint, bucket, slow, deadline, args.ticks)
    finally:
        server.stop()
    normal, slow, patient = results["normal"], results["slow"], results["patient"]
    print(f"normal_s={max(normal):.2f} slow_first_s={slow[0]:.2f} slow_max_s={max(slow):.2f} "
          f"patient_max_s={max(patient):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
