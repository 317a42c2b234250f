"""Checkpoint payload: capture state into host memory fast, write it verified, read it back verified.

A checkpoint folder holds ``meta.pkl`` (the structure of every saved object with tensors replaced
by references, plus the RNG states) and, per saved object, its tensor bytes packed into one flat
buffer written as shards ``<object>.<k>.bin``. Packing lets the training loop's only blocking work
be one memcpy per tensor into reused host buffers (pinned, on a side stream, for CUDA tensors:
see staging.py); shards let digests and transfers run in parallel. Restoring reads each shard
straight into a buffer per large tensor (small ones share one) while another thread hashes what
has arrived, and hands out tensors as views of those buffers: nothing is copied twice.
The digest algorithm is adapters/digest.py's.

torch is used only when the script has imported it (lazy_torch.py): the meta file is torch's
serialization then (``torch.save``, a zip archive) and a plain pickle otherwise, and a reader
tells them apart by the zip archive's first bytes.
"""

from __future__ import annotations

import bisect
import copy
import io
import os
import pickle
import random
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from adapters import digest
from adapters.storage import CheckpointName, CorruptCheckpoint, RunFolder, StorageError
from reconciler.worker import lazy_torch, staging

if TYPE_CHECKING:
    import torch

FORMAT = 1
ALIGN = 64
META = "meta.pkl"
DEFAULT_SHARD_BYTES = 16 << 20  # small enough to verify in parallel on few cores
RNG_KEY = "__rng__"
RNG_RANKS_KEY = "__rng_ranks__"  # under torchrun: every rank's RNG states, in rank order
ZIP_MAGIC = b"PK\x03\x04"  # how torch.save's archive begins (a plain pickle begins with b"\x80")


def shard_bytes() -> int:
    return int(os.environ.get("RECONCILER_SHARD_BYTES", DEFAULT_SHARD_BYTES))


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lives inside its object's flat buffer."""

    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


def _packable(t: torch.Tensor) -> bool:
    return t.layout == lazy_torch.require().strided and not t.is_quantized and not t.is_nested


def _strip(value: Any, tensors: list[torch.Tensor]) -> Any:
    """Copy the structure of `value`, replacing packable tensors by their index in `tensors`."""
    if lazy_torch.is_tensor(value):
        if _packable(value):
            tensors.append(value.detach())
            return _Slot(len(tensors) - 1)
        return value.detach().clone()
    if isinstance(value, OrderedDict):
        return OrderedDict((k, _strip(v, tensors)) for k, v in value.items())
    if type(value) is dict:
        return {k: _strip(v, tensors) for k, v in value.items()}
    if type(value) is list:
        return [_strip(v, tensors) for v in value]
    if type(value) is tuple:
        return tuple(_strip(v, tensors) for v in value)
    if isinstance(value, int | float | str | bytes | bool | type(None)):
        return value
    return copy.deepcopy(value)


@dataclass(frozen=True)
class _Slot:
    index: int


def _resolve(value: Any, refs: list[TensorRef]) -> Any:
    if isinstance(value, _Slot):
        return refs[value.index]
    if isinstance(value, OrderedDict):
        return OrderedDict((k, _resolve(v, refs)) for k, v in value.items())
    if type(value) is dict:
        return {k: _resolve(v, refs) for k, v in value.items()}
    if type(value) is list:
        return [_resolve(v, refs) for v in value]
    if type(value) is tuple:
        return tuple(_resolve(v, refs) for v in value)
    return value


def state_of(obj: Any) -> Any:
    """What gets saved for one object: its state_dict() when it has one, else the object itself."""
    sd = getattr(obj, "state_dict", None)
    if callable(sd) and not lazy_torch.is_tensor(obj):
        return sd()
    return obj


def rng_state() -> dict[str, Any]:
    """The generators' states: Python's always; NumPy's and torch's (CUDA's too) when the script
    has imported them (one imported later starts from the same state in a resumed run as in an
    uninterrupted one, so there is nothing to carry for it)."""
    state: dict[str, Any] = {"python": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    torch = lazy_torch.loaded()
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Set the states `rng_state` gave. Its tensors are copied first: read back from a checkpoint
    they may be views into a shared buffer, and torch.set_rng_state reads a tensor that does not
    begin its storage wrongly ("Invalid mt19937 state", or a SIGSEGV; torch 2.13)."""
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "torch" in state:
        torch = lazy_torch.require()
        torch.set_rng_state(state["torch"].clone())
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([s.clone() for s in state["cuda"]])


HostBuffer = Any  # a flat uint8 torch.Tensor, or a bytearray where there is no tensor and no torch


def host_buffer(nbytes: int) -> HostBuffer:
    torch = lazy_torch.loaded()
    return bytearray(nbytes) if torch is None else torch.empty(nbytes, dtype=torch.uint8)


def _size(buf: HostBuffer) -> int:
    return len(buf) if isinstance(buf, bytearray) else int(buf.numel())


def _bytes(buf: HostBuffer) -> memoryview:
    return memoryview(buf) if isinstance(buf, bytearray) else memoryview(buf.numpy()).cast("B")


@dataclass
class Snapshot:
    """A checkpoint held in host memory, ready to be written in the background."""

    step: int
    meta: dict[str, Any]
    sections: dict[str, HostBuffer]  # object name -> its flat bytes
    ready: list[Any] = field(default_factory=list)  # events of copies still in flight (CUDA)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def io_pool() -> ThreadPoolExecutor:
    """One warm thread pool per process for copies, digests and transfers (threads start once)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = max(8, min(16, 4 * (os.cpu_count() or 2)))
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconciler-io")
            barrier = threading.Barrier(workers + 1)
            for _ in range(workers):
                _pool.submit(barrier.wait)
            barrier.wait()
        return _pool


_uploader: ThreadPoolExecutor | None = None


class Background:
    """One call run on the process's upload thread, with `join` and `is_alive` as a Thread has.

    The thread is started once: `threading.Thread.start()` waits until the new thread runs, which
    took milliseconds of the training loop's time per save on a busy machine."""

    def __init__(self, fn: Any, *args: Any) -> None:
        global _uploader
        self._done = threading.Event()
        with _pool_lock:
            if _uploader is None:
                _uploader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reconciler-upload")
        _uploader.submit(self._run, fn, args)

    def _run(self, fn: Any, args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        finally:
            self._done.set()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


COPY_CHUNK = 8 << 20


_stagers = staging.Stagers()


def capture(
    step: int, objects: dict[str, Any], reuse: dict[str, HostBuffer], stagers: staging.Stagers | None = None
) -> Snapshot:
    """Copy every object's state into host buffers (reusing `reuse` where the sizes match).

    This is the only part of a save that blocks the training loop; large CPU tensors are copied
    in chunks on a few threads, since one thread rarely saturates memory bandwidth. CUDA tensors
    go into pinned buffers on a side stream (see staging.py) and the host does not wait for them:
    the snapshot's `ready` events say when they have landed.
    """
    stagers = _stagers if stagers is None else stagers
    skeleton: dict[str, Any] = {}
    sections: dict[str, HostBuffer] = {}
    begun: dict[int, staging.Stager] = {}
    jobs: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name, obj in objects.items():
        tensors: list[torch.Tensor] = []
        tree = _strip(state_of(obj), tensors)
        refs: list[TensorRef] = []
        offset = 0
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            refs.append(TensorRef(offset, nbytes, str(t.dtype), tuple(t.shape)))
            offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
        staged = [stagers.for_tensor(t) for t in tensors]
        pinner = next((s for s in staged if s is not None), None)
        buf = reuse.get(name)
        if buf is None or _size(buf) != offset or (
                pinner is not None and (isinstance(buf, bytearray) or not pinner.usable(buf))):
            buf = pinner.alloc(offset) if pinner is not None else host_buffer(offset)
            _zero_padding(buf, refs)
        for t, ref, stager in zip(tensors, refs, staged, strict=True):
            if not ref.nbytes:
                continue
            dst = buf[ref.offset : ref.offset + ref.nbytes].view(t.dtype).view(t.shape)
            if stager is not None:
                if id(stager) not in begun:
                    stager.begin()
                    begun[id(stager)] = stager
                stager.copy(dst, t)
            elif t.is_contiguous() and ref.nbytes > COPY_CHUNK:
                flat_src, flat_dst = t.reshape(-1), dst.reshape(-1)
                step_n = max(1, COPY_CHUNK // t.element_size())
                jobs.extend((flat_dst[i : i + step_n], flat_src[i : i + step_n]) for i in range(0, t.numel(), step_n))
            else:
                dst.copy_(t)
        skeleton[name] = _resolve(tree, refs)
        sections[name] = buf
    if jobs:
        with lazy_torch.require().no_grad():
            list(io_pool().map(lambda job: job[0].copy_(job[1]), jobs))
    ready = [stager.finish() for stager in begun.values()]
    # No clock in the payload: the same state saved twice gives the same bytes (the commit record
    # says when it was written).
    meta = {"format": FORMAT, "step": step, "objects": skeleton, RNG_KEY: rng_state()}
    return Snapshot(step, meta, sections, ready)


def _zero_padding(buf: HostBuffer, refs: list[TensorRef]) -> None:
    """Zero the alignment slack after each tensor of a new buffer: it is written out with the
    tensors, and uninitialised memory there would make files differ for the same state (and
    could carry stale bytes of this process into storage). Reused buffers keep their zeros."""
    for ref in refs:
        end = (ref.offset + ref.nbytes + ALIGN - 1) // ALIGN * ALIGN
        if end > ref.offset + ref.nbytes:
            buf[ref.offset + ref.nbytes : end].zero_()


def _shards(name: str, buf: HostBuffer) -> list[tuple[str, memoryview]]:
    view = _bytes(buf)
    size = shard_bytes()
    if len(view) == 0:
        return [(f"{name}.0000.bin", view)]
    return [(f"{name}.{k:04d}.bin", view[i : i + size]) for k, i in enumerate(range(0, len(view), size))]


def write(
    folder: RunFolder, epoch: int, snap: Snapshot, parent: str | None, pool: ThreadPoolExecutor
) -> CheckpointName:
    """Upload the payload, then commit it (COMMIT.json last, then the fenced lease ack)."""
    staging.wait_all(snap.ready)  # the host bytes are complete only once the staged copies landed
    ckpt = CheckpointName(snap.step, epoch)
    base = f"checkpoints/{ckpt.dirname}"
    files: list[tuple[str, memoryview]] = [(META, memoryview(_dump_meta(snap.meta)))]
    for name, buf in snap.sections.items():
        files.extend(_shards(name, buf))

    algorithms = digest.written()

    def put(item: tuple[str, memoryview]) -> tuple[str, dict[str, Any]]:
        fname, data = item
        hashers = {a: digest.Overlapped(digest.new(a)) for a in algorithms}
        for hasher in hashers.values():
            hasher.update(data)  # hashed on other threads while this one writes the same bytes
        folder.store.write_payload(f"{base}/{fname}", data)
        return fname, digest.record(len(data), {a: h.hexdigest() for a, h in hashers.items()})

    record = {
        "format": FORMAT,
        "step": snap.step,
        "epoch": epoch,
        "parent": parent,
        "time": time.time(),
        "files": dict(pool.map(put, files)),
        "sections": {name: _size(buf) for name, buf in snap.sections.items()},
    }
    folder.commit_checkpoint(epoch, ckpt, record)
    return ckpt


def _dump_meta(meta: dict[str, Any]) -> bytes:
    torch = lazy_torch.loaded()
    if torch is None:
        return pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL)
    blob = io.BytesIO()
    torch.save(meta, blob)
    return blob.getvalue()


LARGE_BYTES = 1 << 20  # restore gives each tensor from this size up a buffer of its own


@dataclass(frozen=True)
class _Span:
    """Bytes [start, end) of a section live in buffer `buffer` from `at` on."""

    start: int
    end: int
    buffer: int
    at: int


def _layout(tree: Any, total: int) -> tuple[list[_Span], list[int]]:
    """Where each byte of a section goes on restore: every large tensor into a buffer of its own
    (as torch.load allocates one storage per tensor, so the allocator reuses freed memory instead
    of faulting in fresh pages), everything else (small tensors, padding) packed into buffer 0.
    Returns the spans in section order and the size of each buffer; no tensor is split."""
    refs: list[TensorRef] = []
    _collect_refs(tree, refs)
    large = sorted((r for r in refs if r.nbytes >= LARGE_BYTES), key=lambda r: r.offset)
    spans: list[_Span] = []
    sizes = [0]
    pos = 0

    def small(upto: int) -> None:
        if upto > pos:
            spans.append(_Span(pos, upto, 0, sizes[0]))
            sizes[0] += upto - pos

    for ref in large:
        small(ref.offset)
        spans.append(_Span(ref.offset, ref.offset + ref.nbytes, len(sizes), 0))
        sizes.append(ref.nbytes)
        pos = ref.offset + ref.nbytes
    small(total)
    return spans, sizes


def _collect_refs(value: Any, out: list[TensorRef]) -> None:
    if isinstance(value, TensorRef):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_refs(v, out)
    elif isinstance(value, list | tuple):
        for v in value:
            _collect_refs(v, out)


class _Section:
    """One object's bytes on restore, held in the buffers of `_layout`; tensors are views of them."""

    def __init__(self, total: int, tree: Any) -> None:
        self.total = total
        self.spans, sizes = _layout(tree, total)
        self.starts = [span.start for span in self.spans]
        refs: list[TensorRef] = []
        _collect_refs(tree, refs)
        if refs:  # tensors are views of these buffers
            torch = lazy_torch.require()
            self.buffers: list[HostBuffer] = [torch.empty(n, dtype=torch.uint8) for n in sizes]
        else:
            self.buffers = [bytearray(n) for n in sizes]
        self._mem = [_bytes(b) for b in self.buffers]

    def _span_at(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self.starts, offset) - 1)

    def views(self, start: int, end: int) -> list[memoryview]:
        """Memory for bytes [start, end) of the section, in order, across buffers."""
        out: list[memoryview] = []
        k = self._span_at(start)
        while start < end and k < len(self.spans):
            span = self.spans[k]
            if span.end > start:
                stop = min(span.end, end)
                out.append(self._mem[span.buffer][span.at + start - span.start : span.at + stop - span.start])
                start = stop
            k += 1
        return out

    def tensor(self, ref: TensorRef, dtype: torch.dtype) -> torch.Tensor:
        span = self.spans[self._span_at(ref.offset)]
        at = span.at + ref.offset - span.start
        return self.buffers[span.buffer][at : at + ref.nbytes].view(dtype).view(ref.shape)


def _materialize(value: Any, section: _Section | None) -> Any:
    if isinstance(value, TensorRef):
        torch = lazy_torch.require()
        dtype = getattr(torch, value.dtype.removeprefix("torch."))
        if value.nbytes == 0:
            return torch.empty(value.shape, dtype=dtype)
        if section is None or value.offset + value.nbytes > section.total:
            raise CorruptCheckpoint("the commit record holds fewer tensor bytes than the checkpoint's meta refers to")
        return section.tensor(value, dtype)
    if isinstance(value, OrderedDict):
        return OrderedDict((k, _materialize(v, section)) for k, v in value.items())
    if type(value) is dict:
        return {k: _materialize(v, section) for k, v in value.items()}
    if type(value) is list:
        return [_materialize(v, section) for v in value]
    if type(value) is tuple:
        return tuple(_materialize(v, section) for v in value)
    return value


def _load_meta(folder: RunFolder, ckpt: CheckpointName, files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if META not in files:
        raise CorruptCheckpoint(f"{folder.url(f'checkpoints/{ckpt.dirname}')} has no {META} in its commit record")
    meta_buf = bytearray(int(files[META]["size"]))
    folder.read_verified(ckpt, META, files[META], memoryview(meta_buf))
    try:  # our own verified file; it may hold any picklable user state, hence weights_only=False
        if not meta_buf.startswith(ZIP_MAGIC):
            return dict(pickle.loads(meta_buf))
        return dict(lazy_torch.require().load(io.BytesIO(bytes(meta_buf)), weights_only=False))
    except Exception as exc:
        raise StorageError(
            f"cannot load {folder.url(f'checkpoints/{ckpt.dirname}/{META}')}: {exc}: it was written by "
            "code that is not importable here (install the same packages as the job that saved it)"
        ) from exc


def read(folder: RunFolder, ckpt: CheckpointName, pool: ThreadPoolExecutor) -> dict[str, Any]:
    """Read and verify every file of a checkpoint; returns meta with tensors bound to their data.

    Raises CorruptCheckpoint (from the storage layer) before anything is handed to the caller.
    The small meta file comes first (it says where the tensors are), then the shards in parallel,
    each read straight into the memory of the tensors it holds and hashed as it arrives.
    """
    record = folder.read_commit(ckpt)
    files: dict[str, dict[str, Any]] = record["files"]
    meta = _load_meta(folder, ckpt, files)
    trees = meta.get("objects") or {}
    sections: dict[str, _Section] = {}
    jobs: list[tuple[str, dict[str, Any], list[memoryview]]] = []
    for sec, total in (record.get("sections") or {}).items():
        section = sections[sec] = _Section(int(total), trees.get(sec))
        shard_names = sorted(f for f in files if f.startswith(f"{sec}.") and f.endswith(".bin"))
        offset = 0
        for fname in shard_names:
            size = int(files[fname]["size"])
            if offset + size > section.total:
                raise CorruptCheckpoint(f"commit record of {ckpt.dirname} lists more bytes than {sec} holds")
            jobs.append((fname, files[fname], section.views(offset, offset + size)))
            offset += size
        if offset != section.total:
            raise CorruptCheckpoint(f"commit record of {ckpt.dirname} lists fewer bytes than {sec} holds")

    def get(job: tuple[str, dict[str, Any], list[memoryview]]) -> None:
        fname, info, parts = job
        folder.read_verified(ckpt, fname, info, parts)

    list(pool.map(get, jobs))
    objects = {name: _materialize(tree, sections.get(name)) for name, tree in trees.items()}
    return {**meta, "objects": objects}


def apply(name: str, obj: Any, state: Any) -> None:
    """Load `state` into `obj` in place."""
    load = getattr(obj, "load_state_dict", None)
    if callable(load):
        load(state)
    elif lazy_torch.is_tensor(obj):
        with lazy_torch.require().no_grad():
            obj.copy_(state)
    elif isinstance(obj, dict):
        obj.clear()
        obj.update(state)
    elif isinstance(obj, list):
        obj[:] = state
    elif isinstance(obj, set):
        obj.clear()
        obj.update(state)
    elif isinstance(obj, bytearray):
        obj[:] = state
    elif hasattr(obj, "__dict__"):
        obj.__dict__.clear()
        obj.__dict__.update(state.__dict__)
    else:
        raise TypeError(f"cannot restore {name!r} in place")


def restorable(name: str, obj: Any) -> None:
    """Refuse up front an object that restore could not update in place (an int, a str...)."""
    ok = (
        callable(getattr(obj, "load_state_dict", None))
        or lazy_torch.is_tensor(obj)
        or isinstance(obj, dict | list | set | bytearray)
        or (hasattr(obj, "__dict__") and not isinstance(obj, type))
    )
    if not ok:
        raise TypeError(
            f"restore cannot update {name}={type(obj).__name__} in place (it is immutable): "
            f"pass it inside a dict, e.g. {name}={{'value': ...}}"
        )
