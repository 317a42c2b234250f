"""The nested epoch/batch loops of `run.epochs()`: a resumed attempt goes on where the last
checkpoint was, with the epoch's preamble run again (and undone where it must be), the values
carried between epochs, and the end-of-epoch code run once per epoch.

`train` is shaped like a language model's loop: an annealed learning rate and the best loss carried
from epoch to epoch, a hidden state built by the epoch's preamble (with a draw from the RNG) and
rebound at every batch, noise drawn at every step. Anything not put back exactly changes the
weights. An attempt "dies" by returning from inside the loops (no final checkpoint), or stops on
a real SIGTERM; the next attempt is a new `open_run` on the same folder.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from reconciler.worker import Carry, open_run
from reconciler.worker.carried import load_into

PER_EPOCH = 5
EPOCHS = 3


def train(run: Any, log: list[tuple[Any, ...]], *, die_at: int | None = None, notice_at: int | None = None,
          notice_after_epoch: int | None = None) -> None:
    torch.manual_seed(0)  # as a script starts; a resume sets the checkpoint's RNG states
    w = torch.zeros(3)
    lr, best = 1.0, None
    for epoch in run.epochs(EPOCHS, w=w):
        lr, best = run.carry(lr=lr, best=best)
        hidden = (torch.zeros(3), torch.rand(3))  # the preamble draws from the RNG too
        log.append(("start", epoch))
        for index, x in run.enumerate(range(PER_EPOCH), carry=lambda: hidden):  # noqa: B023 - the current value
            hidden = (hidden[0] * 0.5 + x + torch.rand(3), hidden[1] * 0.9)
            w += lr * (hidden[0] - hidden[1])
            log.append(("batch", run.step, epoch, index, w.tolist(), lr))
            if run.step == die_at:
                return
            if run.step == notice_at:
                os.kill(os.getpid(), signal.SIGTERM)
        loss = float(w.sum())
        log.append(("end", epoch, loss, lr))
        if best is None or loss < best:
            best = loss
        else:
            lr /= 2.0
        if epoch == notice_after_epoch:
            os.kill(os.getpid(), signal.SIGTERM)  # a notice while the end-of-epoch code runs
    run.complete()


def attempt(uri: str, every: int, **kw: Any) -> tuple[list[tuple[Any, ...]], int | None]:
    """One attempt: its log, and its exit code when it stopped (None when it died or finished)."""
    log: list[tuple[Any, ...]] = []
    try:
        with open_run(uri=uri, checkpoint_every=every) as run:
            train(run, log, **kw)
    except SystemExit as stop:
        return log, int(stop.code or 0)
    return log, None


def kinds(log: list[tuple[Any, ...]], kind: str) -> list[tuple[Any, ...]]:
    return [e for e in log if e[0] == kind]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Any, ...]]:
    log, code = attempt(str(tmp_path_factory.mktemp("ref") / "run"), every=100)
    assert code is None and len(kinds(log, "batch")) == EPOCHS * PER_EPOCH and len(kinds(log, "end")) == EPOCHS
    assert len({e[3] for e in kinds(log, "end")}) > 1, "the learning rate is annealed: carrying it matters"
    return log


@pytest.mark.parametrize(("every", "die_at"), [(2, 3), (2, 7), (2, 12), (3, 5), (3, 8), (5, 7), (5, 12), (5, 14)])
def test_a_resume_mid_epoch_reruns_the_preamble_and_goes_on_bit_for_bit(
        tmp_path: Path, reference: list[tuple[Any, ...]], every: int, die_at: int) -> None:
    uri = str(tmp_path / "run")
    killed, _ = attempt(uri, every, die_at=die_at)
    durable = (die_at - 1) // every * every  # the last checkpoint before the death
    resumed, code = attempt(uri, every)
    assert code is None
    assert kinds(killed, "batch")[:durable] + kinds(resumed, "batch") == kinds(reference, "batch")
    first = durable // PER_EPOCH  # the epoch the resume starts in: the preamble ran again
    assert resumed[0] == ("start", first)
    # The end of an epoch whose checkpoint fell on its last batch (every=5) is not run again.
    assert kinds(resumed, "end") == kinds(reference, "end")[first:]
    with open_run(uri=uri, install_signal_handlers=False) as run:
        assert run.folder.done()["step"] == EPOCHS * PER_EPOCH


def test_a_checkpoint_due_on_the_last_batch_is_taken_after_the_end_of_epoch_code(tmp_path: Path) -> None:
    uri = str(tmp_path / "run")
    attempt(uri, 5, die_at=7)
    with open_run(uri=uri, install_signal_handlers=False) as run:
        assert run.folder.durable_step() == 5
        w = torch.zeros(3)
        epochs = iter(run.epochs(EPOCHS, w=w))
        assert next(epochs) == 1  # the checkpoint of step 5 is in epoch 1, after epoch 0's end
        lr, best = run.carry(lr=1.0, best=None)
        assert best is not None and lr == 1.0  # what epoch 0's end-of-epoch code set


def test_a_stop_notice_on_the_last_batch_exits_before_the_end_of_epoch_code(
        tmp_path: Path, reference: list[tuple[Any, ...]]) -> None:
    uri = str(tmp_path / "run")
    stopped, code = attempt(uri, 100, notice_at=PER_EPOCH)
    assert code == 75 and kinds(stopped, "end") == []
    resumed, code = attempt(uri, 100)
    assert code is None
    assert resumed[:2] == [("start", 0), reference[PER_EPOCH + 1]], "the resume runs epoch 0's end, no batch"
    assert kinds(stopped, "batch") + kinds(resumed, "batch") == kinds(reference, "batch")
    assert kinds(resumed, "end") == kinds(reference, "end")


@pytest.mark.parametrize("epoch", [0, EPOCHS - 1])
def test_a_stop_notice_during_the_end_of_epoch_code_is_acted_on_after_it(
        tmp_path: Path, reference: list[tuple[Any, ...]], epoch: int) -> None:
    uri = str(tmp_path / "run")
    stopped, code = attempt(uri, 100, notice_after_epoch=epoch)
    assert code == 75 and kinds(stopped, "end") == kinds(reference, "end")[: epoch + 1]
    resumed, code = attempt(uri, 100)
    assert code is None
    assert kinds(stopped, "batch") + kinds(resumed, "batch") == kinds(reference, "batch")
    assert kinds(stopped, "end") + kinds(resumed, "end") == kinds(reference, "end")
    if epoch == EPOCHS - 1:
        assert resumed == [], "every epoch was done: the resumed attempt only completes"
    with open_run(uri=uri, install_signal_handlers=False) as run:
        assert run.folder.done()["step"] == EPOCHS * PER_EPOCH


def test_epochs_from_a_range_heartbeat_and_set_the_target(tmp_path: Path) -> None:
    uri = str(tmp_path / "run")
    seen = []
    with open_run(uri=uri, heartbeat_interval=0, install_signal_handlers=False) as run:
        for epoch in run.epochs(range(1, 4)):
            for batch in run.batches([10, 20]):
                seen.append((epoch, batch))
                if run.step == 3:
                    break  # as if killed: the loop's checkpoint is the only one
            else:
                continue
            break
        assert run.target == 6
        assert run.folder.progress().step == 2  # heartbeats come from the loop, after each batch
    assert seen == [(1, 10), (1, 20), (2, 10)]


def test_epochs_of_another_length_warn_and_move_the_target(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with open_run(uri=str(tmp_path / "run"), target=5, install_signal_handlers=False) as run:
        with caplog.at_level(logging.WARNING, logger="reconciler.worker"):
            for epoch in run.epochs(3):
                for _ in run.batches(range(2 + epoch)):
                    pass
            assert "the target was 5 steps" in caplog.text  # RECONCILER_TARGET_STEPS said 5, the loop 3 x 2
            assert "epoch 1 has 3 batches but the one before had 2: the target is now 8 steps" in caplog.text
            assert "epoch 2 has 4 batches but the one before had 3: the target is now 9 steps" in caplog.text
            assert "past the target" not in caplog.text
        assert run.target == run.step == 9
        run.complete()
        assert run.folder.done()["step"] == 9


def test_a_carry_object_and_a_tensor_restore_in_place(tmp_path: Path) -> None:
    uri = str(tmp_path / "run")
    with open_run(uri=uri, checkpoint_every=2, install_signal_handlers=False) as run:
        for _ in run.epochs(1):
            s = Carry(total=0.0, recent=[])
            for x in run.batches(range(5), carry=lambda: s):  # noqa: B023 - read at each save
                s.total += x
                s.recent = [*s.recent, x][-2:]
                if run.step == 3:
                    break
        run.wait()
    with open_run(uri=uri, checkpoint_every=2, install_signal_handlers=False) as run:
        for _ in run.epochs(1):
            s = Carry(total=0.0, recent=[])
            batches = run.batches(range(5), carry=lambda: s)  # noqa: B023
            assert (s.total, s.recent) == (1.0, [0, 1])  # step 2's, put back before the first batch
            assert list(batches) == [2, 3, 4]


def test_load_into_refuses_what_it_cannot_update_in_place() -> None:
    hidden = (torch.zeros(2), torch.zeros(2))
    load_into(hidden, (torch.ones(2), torch.full((2,), 2.0)), "hidden")
    assert hidden[1].tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="shape"):
        load_into(torch.zeros(3), torch.zeros(4), "hidden")
    with pytest.raises(TypeError, match=r"run\.carry\(\)"):
        load_into(0.5, 0.25, "the value carry= returns")
    load_into(None, None, "nothing")


def test_the_loop_is_refused_when_used_out_of_order(tmp_path: Path) -> None:
    with open_run(uri=str(tmp_path / "run"), install_signal_handlers=False) as run:
        with pytest.raises(RuntimeError, match="inside `for epoch in run.epochs"):
            run.batches(range(3))
        with pytest.raises(TypeError, match=r"the batches go inside each epoch: `for batch in run\.batches"):
            run.epochs(2, range(3))  # the flat loop of an earlier SDK
        with pytest.raises(TypeError, match="number of epochs or a range"):
            run.epochs(2.0)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="__loop__"):
            run.epochs(2, __loop__={})
        for _ in run.epochs(1):
            with pytest.raises(TypeError, match="carry=lambda: hidden"):
                run.batches(range(3), carry=torch.zeros(2))  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="with a length"):
                run.batches(iter(range(3)))
            for _ in run.batches(range(3)):
                pass
            with pytest.raises(RuntimeError, match="once per epoch"):
                run.batches(range(3))
            with pytest.raises(RuntimeError, match="top of each epoch"):
                run.carry(lr=1.0)
        with pytest.raises(RuntimeError, match="ran no batches"):
            for _ in run.epochs(1):
                pass


def test_a_resume_that_carries_other_values_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "run")

    def dies_at_step_2(run: Any) -> None:
        for _ in run.epochs(2):
            run.carry(lr=1.0)
            for _ in run.batches(range(3)):
                if run.step == 2:
                    return

    with open_run(uri=uri, checkpoint_every=1, install_signal_handlers=False) as run:
        dies_at_step_2(run)
    with open_run(uri=uri, install_signal_handlers=False) as run:
        for _ in run.epochs(2):
            with pytest.raises(ValueError, match="was given momentum but the checkpoint carries lr"):
                run.carry(momentum=0.9)
            break
    with open_run(uri=uri, install_signal_handlers=False) as run:
        for _ in run.epochs(2):
            with pytest.raises(RuntimeError, match="carries lr but this epoch did not call run.carry"):
                run.batches(range(3))
            break


class Counter:
    """A plain object: no state_dict/load_state_dict, so nothing could put it back in place."""

    def __init__(self) -> None:
        self.n = 0


@pytest.mark.parametrize(("build", "change", "refusal"), [
    (lambda: (torch.zeros(2), 0), lambda v, x: (v[0] + x, v[1] + 1),
     r"item \[1\] of the value carry= returns was 0 when the epoch's batches began and is 2 now"),
    (lambda: None, lambda v, x: torch.full((2,), float(x)),
     r"the value carry= returns was None when the epoch's batches began and is a tensor of shape \(2,\) now"),
    (lambda: {"h": torch.zeros(2)}, lambda v, x: {"h": torch.zeros(x + 2)},
     r"item \['h'\] of the value carry= returns was a tensor of shape \(2,\) .* and is a tensor of shape \(3,\)"),
    (lambda: [Carry(n=0), Counter()], lambda v, x: v,
     r"item \[1\] of the value carry= returns is a Counter, which carry= cannot restore in place"),
], ids=["a changed number", "None, then a tensor", "a tensor of another shape", "a plain object"])
def test_a_carried_value_a_resume_could_not_put_back_is_refused_at_the_first_save(
        tmp_path: Path, build: Any, change: Any, refusal: str) -> None:
    uri = str(tmp_path / "run")
    with open_run(uri=uri, checkpoint_every=2, install_signal_handlers=False) as run:
        with pytest.raises(TypeError, match=refusal):
            for _ in run.epochs(1):
                value = build()
                for x in run.batches(range(5), carry=lambda: value):  # noqa: B023 - the current value
                    value = change(value, x)
        assert run.step == 2, "refused at the first save, not at a resume"
        assert run.folder.durable_step() == 0


def test_a_nested_carried_value_with_a_module_and_a_carry_is_restored_in_place(tmp_path: Path) -> None:
    uri = str(tmp_path / "run")

    def preamble() -> tuple[torch.Tensor, dict[str, Any]]:
        torch.manual_seed(0)
        return torch.zeros(2), {"cell": torch.nn.Linear(2, 2), "stats": [Carry(total=0.0)]}

    with open_run(uri=uri, checkpoint_every=2, install_signal_handlers=False) as run:
        for _ in run.epochs(1):
            hidden, parts = preamble()
            for x in run.batches(range(5), carry=lambda: (hidden, parts)):  # noqa: B023 - the current value
                hidden.add_(x)
                with torch.no_grad():
                    parts["cell"].weight.mul_(2.0)
                parts["stats"][0].total += x
                if run.step == 3:
                    break
        run.wait()
    with open_run(uri=uri, install_signal_handlers=False) as run:
        for _ in run.epochs(1):
            hidden, parts = preamble()
            fresh = parts["cell"].weight.detach().clone()
            batches = run.batches(range(5), carry=lambda: (hidden, parts))  # noqa: B023
            assert hidden.tolist() == [1.0, 1.0] and parts["stats"][0].total == 1.0  # step 2's, in place
            assert torch.equal(parts["cell"].weight, fresh * 4.0)
            assert list(batches) == [2, 3, 4]


def test_a_generator_of_ones_own_held_in_the_carry_draws_on_as_if_uninterrupted(tmp_path: Path) -> None:
    """As the README advises for random generators of one's own: in the `Carry` given to carry=."""

    def draws(uri: str, die_at: int | None) -> list[float]:
        out = []
        with open_run(uri=uri, checkpoint_every=2, install_signal_handlers=False) as run:
            for _ in run.epochs(2):
                s = Carry(g=torch.Generator().manual_seed(5))
                for _ in run.batches(range(3), carry=lambda: s):  # noqa: B023 - the current value
                    out.append(float(torch.rand(1, generator=s.g)))
                    if run.step == die_at:
                        run.wait()
                        return out
        return out

    reference = draws(str(tmp_path / "ref"), None)
    killed = draws(str(tmp_path / "run"), 5)
    assert killed[:4] + draws(str(tmp_path / "run"), None) == reference
