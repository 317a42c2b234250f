"""Checkpoint benchmark: the worker SDK against plain `torch.save` + fsync and `torch.load`.

For a model + AdamW state of about 100 MB and 1 GB (``--quick``: 20 MB and 100 MB) it measures,
on local disk and on an S3 server on loopback (moto, started here):

- plain save: `torch.save` of the state dicts (+ fsync on disk; + a boto3 multipart upload on S3);
  everything blocks the training loop;
- SDK blocked: how long `run.save()` blocks the loop (the copy to host memory; warm buffers);
- SDK durable: from `run.save()` until the checkpoint is committed (background upload + commit);
- plain load: `torch.load` + `load_state_dict` (page cache warm, as for the SDK);
- SDK restore: `run.restore()`, which verifies every file's sha256 before loading.

Each figure is the median of `--repeat` runs. The table goes to stdout, and the last line is
``blocked_ratio=X restore_ratio=Y`` for 100 MB on local disk (both modes measure 100 MB).
Ratios are against the baseline measured in the same run; targets: blocked <= 0.1, restore <= 1.5.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

MB = 1 << 20


def make_state(nbytes: int, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Parameters + AdamW moments totalling about `nbytes` (float32: 3 copies of the parameters)."""
    torch.manual_seed(seed)
    floats = nbytes // 12
    chunk = 4 * MB  # floats per parameter tensor (16 MB)
    sizes = [chunk] * (floats // chunk) + ([floats % chunk] if floats % chunk else [])
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n)) for n in sizes])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return model, opt  # type: ignore[return-value]


def fresh_like(nbytes: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    return make_state(nbytes, seed=1)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@contextmanager
def s3_server() -> Iterator[str]:
    """moto's S3 server in a subprocess on a free loopback port (so it does not share our GIL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def bench_target(kind: str, nbytes: int, repeat: int, workdir: str, endpoint: str | None) -> dict[str, float]:
    from reconciler.worker import open_run

    model, opt = make_state(nbytes)
    state = lambda: {"model": model.state_dict(), "optimizer": opt.state_dict()}  # noqa: E731
    options: dict[str, Any] = {}
    if kind == "disk":
        base = os.path.join(workdir, f"runs-{uuid.uuid4().hex[:6]}")
        plain_path = os.path.join(workdir, "plain.pt")
    else:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        creds = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench", "region_name": "us-east-1"}
        client = boto3.client("s3", endpoint_url=endpoint, config=Config(read_timeout=900), **creds)
        client.create_bucket(Bucket=bucket)
        # the plain baseline uploads with boto3's own concurrent multipart transfer
        transfer = TransferConfig(multipart_threshold=16 * MB, multipart_chunksize=16 * MB, max_concurrency=8)
        options = {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
        base = f"s3://{bucket}/runs"
        plain_path = "plain.pt"

    def plain_save() -> None:
        if kind == "disk":
            with open(plain_path, "wb") as fh:
                torch.save(state(), fh)
                fh.flush()
                os.fsync(fh.fileno())
        else:
            buf = io.BytesIO()
            torch.save(state(), buf)
            buf.seek(0)
            client.upload_fileobj(buf, bucket, plain_path, Config=transfer)

    def plain_load() -> None:
        m, o = fresh_like(nbytes) if not loaded else loaded
        if kind == "disk":
            sd = torch.load(plain_path)
        else:
            sd = torch.load(io.BytesIO(client.get_object(Bucket=bucket, Key=plain_path)["Body"].read()))
        m.load_state_dict(sd["model"])
        o.load_state_dict(sd["optimizer"])

    loaded: tuple[torch.nn.Module, torch.optim.Optimizer] | None = None
    out: dict[str, list[float]] = {k: [] for k in ("plain_save", "blocked", "durable", "plain_load", "restore")}
    run = open_run(uri=f"{base}/job/r1", storage_options=options, install_signal_handlers=False)
    run.save(1, model=model, optimizer=opt)  # first save allocates the host buffers
    run.wait()
    for i in range(repeat):
        out["plain_save"].append(timed(plain_save))
        t0 = time.perf_counter()
        run.save(2 + i, model=model, optimizer=opt)
        out["blocked"].append(time.perf_counter() - t0)
        run.wait()
        out["durable"].append(time.perf_counter() - t0)
    run.close()
    loaded = fresh_like(nbytes)
    for _ in range(repeat):
        out["plain_load"].append(timed(plain_load))
        m, o = loaded
        reader = open_run(uri=f"{base}/job/r1", storage_options=options, install_signal_handlers=False)
        out["restore"].append(timed(lambda: reader.restore(model=m, optimizer=o)))  # noqa: B023
        reader.close()
    # the restored state is the saved one, bit for bit
    for a, b in zip(model.parameters(), loaded[0].parameters(), strict=True):
        assert torch.equal(a, b)
    if kind == "disk":
        shutil.rmtree(base, ignore_errors=True)
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 MB and 100 MB, one repeat (under a minute)")
    parser.add_argument("--repeat", type=int, default=None, help="runs per figure (median); default 3, quick 1")
    parser.add_argument("--no-s3", action="store_true", help="local disk only")
    parser.add_argument("--dir", default=None, help="local directory to write to (default: a temp dir)")
    args = parser.parse_args(argv)
    sizes = [20 * MB, 100 * MB] if args.quick else [100 * MB, 1024 * MB]
    repeat = args.repeat or (1 if args.quick else 3)
    workdir = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
    rows: list[tuple[str, str, dict[str, float]]] = []
    try:
        targets = ["disk"] if args.no_s3 else ["disk", "s3"]
        with s3_server() if not args.no_s3 else _nothing() as endpoint:
            for size in sizes:
                for kind in targets:
                    res = bench_target(kind, size, repeat, workdir, endpoint)
                    rows.append((f"{size // MB} MB", kind, res))
                    print(f"# {size // MB} MB {kind}: done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    header = (
        "| state | store | plain save | SDK blocked | blocked ratio | SDK durable | plain load | SDK restore "
        "| restore ratio |"
    )
    print(header)
    print("|" + "---|" * 9)
    for size_s, kind, r in rows:
        print(
            f"| {size_s} | {kind} | {r['plain_save']:.3f} s | {r['blocked']:.3f} s | "
            f"{r['blocked'] / r['plain_save']:.3f} | {r['durable']:.3f} s | {r['plain_load']:.3f} s | "
            f"{r['restore']:.3f} s | {r['restore'] / r['plain_load']:.2f} |"
        )
    disk = [(size_s, r) for size_s, kind, r in rows if kind == "disk"]
    first = next((r for size_s, r in disk if size_s == "100 MB"), disk[0][1])
    print(
        f"blocked_ratio={first['blocked'] / first['plain_save']:.3f} "
        f"restore_ratio={first['restore'] / first['plain_load']:.3f}"
    )
    return 0


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    sys.exit(main())
