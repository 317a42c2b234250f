"""Any nested state of tensors (every common dtype, empty and 0-d shapes, views) and plain values
comes back from a checkpoint bit for bit."""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.storage import RunFolder
from reconciler.worker import snapshot
from tests.worker.harness import assert_same

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


@st.composite
def tensors(draw: Any) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 255, shape, generator=g, dtype=torch.int64)
    t = base.to(dtype) if dtype != torch.complex64 else torch.complex(base.float(), base.float().neg())
    if draw(st.booleans()) and t.dim() == 2:
        t = t.t()  # a non-contiguous view
    return t


leaves = st.one_of(tensors(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5), st.none())
states = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=st.dictionaries(st.text(min_size=1, max_size=4), states, max_size=3), shard=st.integers(1, 300))
def test_any_state_round_trips_bit_for_bit(state: dict[str, Any], shard: int) -> None:
    import os

    os.environ["RECONCILER_SHARD_BYTES"] = str(shard)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = RunFolder(tmp)
            epoch = folder.bump_lease()
            snap = snapshot.capture(3, {"user": state}, {})
            ckpt = snapshot.write(folder, epoch, snap, None, snapshot.io_pool())
            meta = snapshot.read(folder, ckpt, snapshot.io_pool())
            assert meta["step"] == 3
            assert_same(state, meta["objects"]["user"])
    finally:
        del os.environ["RECONCILER_SHARD_BYTES"]


def test_rng_states_saved_inside_an_object_set_the_generators_again(tmp_path: Any) -> None:
    """RNG states saved as part of an object (run.epochs() keeps every rank's, as each epoch
    began) come back as views into one buffer, not at its start; setting them draws the same."""
    folder = RunFolder(str(tmp_path))
    torch.manual_seed(7)
    states = [snapshot.rng_state(), snapshot.rng_state()]
    expected = torch.rand(4)
    snap = snapshot.capture(1, {"loop": {"before": torch.ones(100), "rng": states}}, {})
    ckpt = snapshot.write(folder, folder.bump_lease(), snap, None, snapshot.io_pool())
    saved = snapshot.read(folder, ckpt, snapshot.io_pool())["objects"]["loop"]["rng"]
    assert saved[1]["torch"].storage_offset() > 0, "the case that crashed: a state inside the buffer"
    for state in saved:
        torch.manual_seed(0)
        snapshot.set_rng_state(state)
        assert torch.equal(torch.rand(4), expected)
