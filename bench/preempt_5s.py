"""The 5-second question: can a worker holding ~1 GB of state save it between RunPod's SIGTERM and
its SIGKILL 5 s later?

A real SDK worker (a subprocess, `open_run` with RECONCILER_GRACE=5, as the RunPod adapter sets it)
builds a model + AdamW state of `--mb` MB (torch, CPU), commits one periodic checkpoint, then
trains (a step every 50 ms, calling `exit_if_stopping` after each). The parent sends SIGTERM, and
SIGKILL 5 s later as RunPod does, and measures: time from SIGTERM to the worker's exit, its exit code
(75 = left on the stop notice), and whether a checkpoint newer than the periodic one was committed
(the final save made it). Stores: local disk, and S3 on a moto server on loopback (started here).
Each store is measured `--repeat` times; the table and the median and max as ratios to 5 s go to
stdout. When the save cannot finish in the grace, the SDK leaves with exit 75 before the SIGKILL
and the run resumes from its last periodic checkpoint: the table says which happened.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

GRACE = 5.0
MB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]


def worker(mb: int) -> None:
    """The worker: ~`mb` MB of state, a periodic checkpoint at step 1, then steps until stopped."""
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    from checkpoint import make_state

    from reconciler.worker import open_run

    model, opt = make_state(mb * MB)
    options = json.loads(os.environ.get("BENCH_STORAGE_OPTIONS", "{}"))
    with open_run(storage_options=options, heartbeat_interval=0.0) as run:
        run.save(1, model=model, optimizer=opt)
        run.wait()
        print("READY", flush=True)
        step = 1
        while True:
            step += 1
            with torch.no_grad():
                for p in list(model.parameters())[:1]:
                    p.add_(1e-6)
            time.sleep(0.05)
            run.heartbeat(step)
            run.exit_if_stopping(step, model=model, optimizer=opt)


def one_run(uri: str, options: dict[str, Any], mb: int) -> dict[str, Any]:
    env = {**os.environ, "RECONCILER_RUN_URI": uri, "RECONCILER_GRACE": str(int(GRACE)),
           "BENCH_STORAGE_OPTIONS": json.dumps(options), "PYTHONPATH": str(ROOT)}
    env.pop("RECONCILER_EPOCH", None)
    proc = subprocess.Popen([sys.executable, __file__, "--worker", "--mb", str(mb)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "READY":
        proc.kill()
        raise RuntimeError(f"the worker did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    time.sleep(1.0)  # some steps past the periodic checkpoint
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(GRACE)
    except subprocess.TimeoutExpired:
        proc.kill()  # RunPod's SIGKILL
        code = proc.wait()
    took = time.monotonic() - t0
    from adapters.storage import RunFolder

    steps = [c.step for c in RunFolder(uri, options).committed_checkpoints()]
    return {"seconds": took, "code": code, "final_saved": max(steps, default=0) > 1, "durable": max(steps, default=0)}


def measure(store: str, endpoint: str | None, mb: int, repeat: int, workdir: str) -> list[dict[str, Any]]:
    rows = []
    for _ in range(repeat):
        if store == "disk":
            uri, options = Path(workdir, f"runs-{uuid.uuid4().hex[:6]}", "job", "r1").as_uri(), {}
        else:
            import boto3

            bucket = f"preempt-{uuid.uuid4().hex[:10]}"
            boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                         region_name="us-east-1").create_bucket(Bucket=bucket)
            uri, options = f"s3://{bucket}/runs/job/r1", {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
        rows.append(one_run(uri, options, mb))
        print(f"# {store}: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="state size (model + AdamW), MB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-s3", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.mb)
        return 0
    sys.path.insert(0, str(ROOT / "bench"))
    from checkpoint import _nothing, s3_server

    workdir = tempfile.mkdtemp(prefix="preempt-bench-")
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        with (_nothing() if args.no_s3 else s3_server()) as endpoint:
            for store in ["disk"] + ([] if args.no_s3 else ["s3"]):
                results[store] = measure(store, endpoint, args.mb, args.repeat, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"| store ({args.mb} MB state) | SIGTERM to exit, median | max | median / 5 s | max / 5 s "
          "| exit codes | final checkpoint committed |")
    print("|---|---|---|---|---|---|---|")
    for store, rows in results.items():
        secs = [r["seconds"] for r in rows]
        med, top = statistics.median(secs), max(secs)
        codes = ",".join(str(r["code"]) for r in rows)
        saved = f"{sum(r['final_saved'] for r in rows)} of {len(rows)}"
        print(f"| {store} | {med:.2f} s | {top:.2f} s | {med / GRACE:.2f} | {top / GRACE:.2f} | {codes} | {saved} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
