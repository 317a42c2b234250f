"""Checkpoint benchmark: the worker SDK against what a user would otherwise write, in one run.

For a model + AdamW state of about 100 MB and 1 GB (``--quick``: 100 MB only) on local disk it
measures four ways to checkpoint, interleaved (each repeat runs every method once, in a new
random order, so load from other processes falls on all of them alike):

- plain: `torch.save` + fsync, and `torch.load` + `load_state_dict` (the baseline);
- thread: the state cloned to host memory, then `torch.save` + fsync in a background thread;
- dcp: `torch.distributed.checkpoint.async_save` (single process, no process group) and
  `dcp.load` + `set_state_dict`;
- sdk: `run.save()` (blocks for the copy to host memory; warm buffers) and `run.restore()`, which
  verifies every file's digest while reading.

"blocked" is how long the training loop waits in the save call, "durable" until the checkpoint
is on disk (fsynced; for the SDK: committed), "restore" until the state is back in the model and
optimizer. Each figure is the median of `--repeat` runs with the range (min-max) beside it. With
``--s3`` the plain and SDK methods also run against an S3 server on loopback (moto, started
here). ``--device cuda`` keeps the state on the GPU (the SDK then copies through pinned host
buffers on a side stream). The last line is ``blocked_ratio=X restore_ratio=Y``: the SDK's median
blocked time over the plain save's and its median restore over the plain load's, 100 MB on local
disk. Targets: blocked <= 0.1, restore <= 1.5.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._pytree import tree_map

MB = 1 << 20


def make_state(nbytes: int, seed: int = 0, device: str = "cpu") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Parameters + AdamW moments totalling about `nbytes` (float32: 3 copies of the parameters)."""
    torch.manual_seed(seed)
    floats = nbytes // 12
    chunk = 4 * MB  # floats per parameter tensor (16 MB)
    sizes = [chunk] * (floats // chunk) + ([floats % chunk] if floats % chunk else [])
    model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n, device=device)) for n in sizes])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return model, opt  # type: ignore[return-value]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


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


Times = dict[str, list[float]]  # "blocked" / "durable" / "restore" -> one figure per repeat


class Method:
    """One way to checkpoint: `save` returns (blocked, durable) seconds, `restore` seconds."""

    name = ""

    def save(self, step: int) -> tuple[float, float]:
        raise NotImplementedError

    def restore(self) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Setup:
    """The state to save (model + optimizer) and a second one that every method restores into."""

    def __init__(self, nbytes: int, device: str, workdir: str) -> None:
        self.device = device
        self.workdir = workdir
        self.model, self.opt = make_state(nbytes, seed=0, device=device)
        self.into_model, self.into_opt = make_state(nbytes, seed=1, device=device)

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.opt.state_dict()}

    def load_plain(self, sd: dict[str, Any]) -> None:
        self.into_model.load_state_dict(sd["model"])
        self.into_opt.load_state_dict(sd["optimizer"])
        sync(self.device)

    def check_restored(self, what: str) -> None:
        for a, b in zip(self.model.parameters(), self.into_model.parameters(), strict=True):
            assert torch.equal(a, b), f"{what} did not restore the saved state"
        with torch.no_grad():  # so that the next method has to restore it again
            for p in self.into_model.parameters():
                p.zero_()


def _fsync_save(obj: Any, path: str) -> None:
    with open(path, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


class Plain(Method):
    name = "plain torch.save + fsync / torch.load"

    def __init__(self, setup: Setup) -> None:
        self.s = setup
        self.path = os.path.join(setup.workdir, "plain.pt")

    def save(self, step: int) -> tuple[float, float]:
        t = timed(lambda: _fsync_save(self.s.state(), self.path))
        return t, t

    def restore(self) -> float:
        return timed(lambda: self.s.load_plain(torch.load(self.path, map_location=self.s.device)))


class Thread(Method):
    name = "torch.save in a thread"

    def __init__(self, setup: Setup) -> None:
        self.s = setup
        self.path = os.path.join(setup.workdir, "thread.pt")

    def save(self, step: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        # the loop goes on changing the state, so the thread must save a copy of it
        copy = tree_map(lambda v: v.to("cpu", copy=True) if isinstance(v, torch.Tensor) else v, self.s.state())
        worker = threading.Thread(target=_fsync_save, args=(copy, self.path))
        worker.start()
        blocked = time.perf_counter() - t0
        worker.join()
        return blocked, time.perf_counter() - t0

    def restore(self) -> float:
        return timed(lambda: self.s.load_plain(torch.load(self.path, map_location=self.s.device)))


class DCP(Method):
    name = "torch.distributed.checkpoint.async_save"

    def __init__(self, setup: Setup) -> None:
        self.s = setup
        self.path = ""

    def save(self, step: int) -> tuple[float, float]:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.path = os.path.join(self.s.workdir, f"dcp-{step}")
        t0 = time.perf_counter()
        msd, osd = get_state_dict(self.s.model, self.s.opt)
        future = dcp.async_save({"model": msd, "optimizer": osd}, checkpoint_id=self.path)
        blocked = time.perf_counter() - t0
        # newer torch returns an AsyncSaveResponse (staging and upload futures) instead of one future
        done: Any = getattr(future, "upload_completion", future)
        done.result()
        durable = time.perf_counter() - t0
        shutil.rmtree(os.path.join(self.s.workdir, f"dcp-{step - 1}"), ignore_errors=True)
        return blocked, durable

    def restore(self) -> float:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        def load() -> None:
            msd, osd = get_state_dict(self.s.into_model, self.s.into_opt)
            sd = {"model": msd, "optimizer": osd}
            dcp.load(sd, checkpoint_id=self.path)
            set_state_dict(self.s.into_model, self.s.into_opt, model_state_dict=msd, optim_state_dict=osd)
            sync(self.s.device)

        return timed(load)


class SDK(Method):
    name = "reconciler SDK"

    def __init__(self, setup: Setup, uri: str, options: dict[str, Any]) -> None:
        from reconciler.worker import open_run

        self.s, self.uri, self.options = setup, uri, options
        self.run = open_run(uri=uri, storage_options=options, install_signal_handlers=False)
        self.run.save(1, model=setup.model, optimizer=setup.opt)  # the first save allocates the host buffers
        self.run.wait()

    def save(self, step: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        self.run.save(step, model=self.s.model, optimizer=self.s.opt)
        blocked = time.perf_counter() - t0
        self.run.wait()
        return blocked, time.perf_counter() - t0

    def restore(self) -> float:
        def load() -> None:
            self.run.restore(model=self.s.into_model, optimizer=self.s.into_opt)
            sync(self.s.device)

        return timed(load)

    def close(self) -> None:
        self.run.close()


class PlainS3(Method):
    name = "plain torch.save + boto3 upload / download + torch.load"

    def __init__(self, setup: Setup, endpoint: str, bucket: str) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        creds = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench", "region_name": "us-east-1"}
        self.client = boto3.client("s3", endpoint_url=endpoint, config=Config(read_timeout=900), **creds)
        self.client.create_bucket(Bucket=bucket)
        # boto3's own concurrent multipart transfer
        self.transfer = TransferConfig(multipart_threshold=16 * MB, multipart_chunksize=16 * MB, max_concurrency=8)
        self.s, self.bucket = setup, bucket

    def save(self, step: int) -> tuple[float, float]:
        def upload() -> None:
            buf = io.BytesIO()
            torch.save(self.s.state(), buf)
            buf.seek(0)
            self.client.upload_fileobj(buf, self.bucket, "plain.pt", Config=self.transfer)

        t = timed(upload)
        return t, t

    def restore(self) -> float:
        def load() -> None:
            body = self.client.get_object(Bucket=self.bucket, Key="plain.pt")["Body"].read()
            self.s.load_plain(torch.load(io.BytesIO(body), map_location=self.s.device))

        return timed(load)


def bench_target(kind: str, nbytes: int, repeat: int, workdir: str, endpoint: str | None, device: str,
                 seed: int) -> dict[str, Times]:
    """Every method `repeat` times, interleaved in a new random order each time."""
    setup = Setup(nbytes, device, workdir)
    methods: list[Method]
    if kind == "disk":
        uri = os.path.join(workdir, f"runs-{uuid.uuid4().hex[:6]}", "job", "r1")
        methods = [Plain(setup), Thread(setup), DCP(setup), SDK(setup, uri, {})]
    else:
        assert endpoint is not None
        bucket = f"bench-{uuid.uuid4().hex[:10]}"
        plain = PlainS3(setup, endpoint, bucket)
        options = {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
        methods = [plain, SDK(setup, f"s3://{bucket}/runs/job/r1", options)]
    order = random.Random(seed)
    out: dict[str, Times] = {m.name: {"blocked": [], "durable": [], "restore": []} for m in methods}
    try:
        for i in range(repeat):
            for m in order.sample(methods, len(methods)):
                blocked, durable = m.save(2 + i)
                out[m.name]["blocked"].append(blocked)
                out[m.name]["durable"].append(durable)
            for m in order.sample(methods, len(methods)):
                out[m.name]["restore"].append(m.restore())
                setup.check_restored(m.name)
    finally:
        for m in methods:
            m.close()
    return out


def digest_speeds() -> str:
    """GB/s of each checkpoint digest on one core (64 MiB, best of 3)."""
    from adapters import digest

    data = memoryview(os.urandom(64 * MB))
    out = []
    for algorithm in digest.ALGORITHMS:
        best = min(timed(lambda a=algorithm: digest.new(a).update(data)) for _ in range(3))  # type: ignore[misc]
        out.append(f"{algorithm}={64 * MB / best / 1e9:.1f}GB/s")
    return " ".join(out)


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


def table(rows: list[tuple[str, str, dict[str, Times]]]) -> list[str]:
    lines = [
        "| state | store | method | blocked | durable | restore | blocked ratio | restore ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size_s, kind, res in rows:
        base = next(iter(res.values()))  # the plain method comes first
        save0, load0 = statistics.median(base["blocked"]), statistics.median(base["restore"])
        for name, t in res.items():
            lines.append(
                f"| {size_s} | {kind} | {name} | {fmt(t['blocked'])} | {fmt(t['durable'])} | {fmt(t['restore'])} "
                f"| {statistics.median(t['blocked']) / save0:.3f} | {statistics.median(t['restore']) / load0:.2f} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 MB on local disk only")
    parser.add_argument("--repeat", type=int, default=5, help="runs of every method (median and range; default 5)")
    parser.add_argument("--s3", action="store_true", help="also an S3 server on loopback (moto)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the state lives")
    parser.add_argument("--dir", default=None, help="local directory to write to (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the interleaving order")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", module=r"torch\.distributed\.checkpoint")  # its deprecation notices
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU and a CUDA build of torch; none is available here")
    sizes = [100 * MB] if args.quick else [100 * MB, 1024 * MB]
    workdir = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
    rows: list[tuple[str, str, dict[str, Times]]] = []
    try:
        targets = ["disk", "s3"] if args.s3 else ["disk"]
        with s3_server() if args.s3 else _nothing() as endpoint:
            for size in sizes:
                for kind in targets:
                    res = bench_target(kind, size, args.repeat, workdir, endpoint, args.device, args.seed)
                    rows.append((f"{size // MB} MB", kind, res))
                    print(f"# {size // MB} MB {kind}: done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"device={args.device} repeats={args.repeat} load_average={os.getloadavg()[0]:.2f} "
          f"digests(one core): {digest_speeds()}")
    print("\n".join(table(rows)))
    first = next(res for size_s, kind, res in rows if kind == "disk" and size_s == "100 MB")
    plain, sdk = first[Plain.name], first[SDK.name]
    blocked = statistics.median(sdk["blocked"]) / statistics.median(plain["blocked"])
    restore = statistics.median(sdk["restore"]) / statistics.median(plain["restore"])
    print(f"blocked_ratio={blocked:.3f} restore_ratio={restore:.3f}")
    return 0


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    sys.exit(main())
