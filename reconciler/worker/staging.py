"""Copies of accelerator tensors into host memory that do not stall the training loop.

A save copies every CUDA tensor into pinned host buffers (allocated once, reused by every later
save of the same shapes) on a side stream:

1. the side stream waits for the work already queued on the training stream (the values to save);
2. the copies are queued on the side stream with ``non_blocking=True`` (pinned memory makes them
   real asynchronous DMA transfers);
3. an event is recorded after them, and the training stream waits for that event: its next
   kernels (which may change the tensors being copied) start once the copy is done, on the GPU,
   while the host goes on at once;
4. the background writer waits for the event before it hashes or writes the host bytes.

So the training loop's host thread is not blocked at all, and the training stream only for the
copy itself. Every call goes through the `cuda` object given (``torch.cuda`` unless a test gives
another with the same methods), one `Stager` per device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a stager exists only for a tensor, so torch is imported by then
    import torch


class Stager:
    """Stages the tensors of one device for one save after another (its side stream is kept)."""

    def __init__(self, device: torch.device, cuda: Any = None) -> None:
        import torch

        self.device = device
        self.cuda = torch.cuda if cuda is None else cuda
        self._stream: Any = None
        self._training: Any = None

    def alloc(self, nbytes: int) -> torch.Tensor:
        """A pinned host buffer (page-locked, so that copies into it are asynchronous)."""
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def usable(self, buf: torch.Tensor) -> bool:
        return bool(buf.is_pinned())

    def begin(self) -> None:
        with self.cuda.device(self.device):
            if self._stream is None:
                self._stream = self.cuda.Stream()
            self._training = self.cuda.current_stream()
            self._stream.wait_stream(self._training)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with self.cuda.stream(self._stream):
            dst.copy_(src, non_blocking=True)
        if src.is_cuda:  # the caching allocator must not reuse `src`'s memory before the copy read it
            src.record_stream(self._stream)

    def finish(self) -> Any:
        """Close this save's copies; returns the event the writer waits for."""
        done = self.cuda.Event()
        done.record(self._stream)
        self._training.wait_event(done)
        return done


class Stagers:
    """The stagers of one run, one per accelerator device, kept between saves."""

    def __init__(self, cuda: Any = None, devices: tuple[str, ...] = ("cuda",)) -> None:
        self.cuda = cuda
        self.devices = devices  # device types staged through a side stream
        self._by_device: dict[torch.device, Stager] = {}

    def for_tensor(self, t: torch.Tensor) -> Stager | None:
        if t.device.type not in self.devices:
            return None
        stager = self._by_device.get(t.device)
        if stager is None:
            stager = self._by_device[t.device] = Stager(t.device, self.cuda)
        return stager


def wait_all(events: list[Any]) -> None:
    """Block until every staged copy has landed in host memory (called by the writer)."""
    for event in events:
        event.synchronize()
