"""Step 7c: a drill (docs/guides/drills.md). The manifest asks for one (`spec.drill_request`, a new
id each time, or `spec.drill: first_checkpoint` once per new run); the planner asks the live worker
to drill (ArmDrill: a request in its run folder), ends it with no notice once its lookahead is
written (a hard Terminate: SIGKILL, or the provider's harshest stop), lets the next attempt launch as
after any interruption, and compares the two sides' metrics step by step for the verdict. The
interruption is ours: the attempt closes as cancelled (its `stop_reason`), so nothing is charged
to the job (no retry budget, no crash-loop count). Pure, like the rest of the planner.
"""

from __future__ import annotations

from adapters.drills import TAKE_SECONDS, Seen, Side
from reconciler.planner.tick import ArmDrill, JobTick, Launch, Terminate, live
from status.models import Drill, DrillPhase, Phase

CAUSES = ("what usually causes it: state not passed to restore()/save() (an LR scheduler, an optimizer, "
          "a counter), the data position (a loader that starts its epoch again), an RNG that is not carried, "
          "or a value that should be in a Carry")


def drill(t: JobTick) -> bool:
    """Starts a requested drill, or moves the running one on; settles the tick only when it places
    the relaunch itself (`--to`)."""
    d = t.st.drill
    if d is not None and d.phase != DrillPhase.DONE:
        return _advance(t, d)
    request = t.job.spec.drill_request
    if request is not None and (d is None or d.id != request.id) and request.run in (None, t.st.run_id):
        _start(t, Drill(id=request.id, notice=request.notice, lookahead=request.lookahead,
                        tolerance=request.tolerance, to=request.to, requested=t.now))
    elif t.job.spec.drill == "first_checkpoint" and d is None and t.run.durable_step > 0:
        _start(t, Drill(id=f"first-{t.st.run_id.removeprefix('r-')}", requested=t.now))
    return False


def _start(t: JobTick, d: Drill) -> None:
    """Asks the live attempt to drill; waits (records nothing) while no attempt is running."""
    cur = t.current
    if cur is None or t.st.phase != Phase.RUNNING or t.run.done:
        return
    refs = t.live_refs(cur.epoch)
    if not refs:
        return
    d = d.model_copy(update={"epoch": cur.epoch})
    store = t.observed.run_storage.get((t.job.name, t.st.run_id))
    t.out.actions.append(ArmDrill(refs[0], d.id, d.epoch, d.lookahead, d.notice, store))
    if d.notice:  # the provider's own stop path: SIGTERM (and the stop request), with its grace
        _interrupt(t, hard=False, why=f"drill {d.id}: stopped on the provider's notice")
        d = d.model_copy(update={"phase": DrillPhase.RESUMING, "killed_at": t.run.heartbeat_step})
    t.st.drill = d
    t.st.message = f"{t.st.message}; drill {d.id} asked for"


def _interrupt(t: JobTick, hard: bool, why: str) -> None:
    """Ends the live attempt on purpose; its `stop_reason` makes its end ours (cancelled, free)."""
    assert t.current is not None
    for ref in t.live_refs(t.current.epoch):
        if not any(isinstance(a, Terminate) and a.ref == ref for a in t.out.actions):
            t.out.actions.append(Terminate(ref, why, t.observed.run_storage.get((ref.job, ref.run_id)), hard=hard))
    t.st.attempts[-1] = t.current = t.current.model_copy(
        update={"stop_reason": f"{why} (a drill: charged to nothing)"})


def _advance(t: JobTick, d: Drill) -> bool:
    seen = t.run.drill if t.run.drill is not None and t.run.drill.id == d.id else None
    if t.run.done:
        t.st.drill = _verdict(t, d, "not carried out", "the run completed before the drill was over (a worker "
                              "SDK without drills, or fewer steps left than the lookahead)")
    elif d.phase == DrillPhase.ARMED:
        _armed(t, d, seen)
    elif seen is not None and seen.after is not None:
        t.st.drill = _verdict(t, d, *judge(d, seen.before, seen.after), _facts(d, seen.before, seen.after))
    else:
        return _resuming(t, d)
    return False


def _resuming(t: JobTick, d: Drill) -> bool:
    """Waiting for the resumed side: the first relaunch goes to `--to`'s provider (placed here, so
    only that one: later ones go through the launch's guards); a resumed attempt that ended before
    it wrote its side is a failed resume."""
    later = [a for a in t.st.attempts if a.run_id == t.st.run_id and a.epoch > d.epoch]
    ended = next((a for a in later if not a.open), None)
    if ended is not None:
        outcome = ended.outcome.value if ended.outcome else "ended"
        t.st.drill = _verdict(t, d, "failed resume", f"attempt {ended.epoch} on {ended.provider} ended ({outcome}: "
                              f"{ended.detail}) before it reported the drill's steps; see `reconciler logs`")
        return False
    if d.to and not later and t.current is None and not any(
            live(s) for r, s in t.workers.items() if r.run_id == t.st.run_id):
        t.out.actions.append(Launch(t.job.name, t.st.run_id, d.to, f"drill {d.id}: the relaunch goes to {d.to}"))
        t.st.phase, t.st.message = Phase.LAUNCHING, f"drill {d.id}: relaunching on {d.to}"
        return True
    return False


def _armed(t: JobTick, d: Drill, seen: Seen | None) -> None:
    cur = t.current
    if cur is None or cur.epoch != d.epoch:
        t.st.drill = _verdict(t, d, "not carried out", f"attempt {d.epoch} ended before its lookahead was over; "
                              "ask for the drill again (`reconciler drill`)")
        return
    before = seen.before if seen is not None else None
    if before is None and not (seen is not None and seen.taken) and t.now - d.requested >= TAKE_SECONDS:
        t.st.drill = _verdict(t, d, "not carried out", f"attempt {d.epoch} did not take the drill up within "
                              f"{TAKE_SECONDS / 60:.0f} minutes: its worker SDK is older than drills, or it runs "
                              "several ranks (torchrun), which drills do not support yet")
        return
    if before is None:
        return
    last = max(before.points, default=before.step)
    _interrupt(t, hard=True, why=f"drill {d.id}: killed with no notice at step {last}, "
                                    f"{last - before.step} steps past its checkpoint at step {before.step}")
    t.st.drill = d.model_copy(update={"phase": DrillPhase.RESUMING, "step": before.step, "killed_at": last})


def _verdict(t: JobTick, d: Drill, verdict: str, detail: str, more: dict[str, object] | None = None) -> Drill:
    t.st.message = f"{t.st.message}; drill {d.id}: {verdict}"
    return d.model_copy(update={"phase": DrillPhase.DONE, "verdict": verdict, "detail": detail, "ended": t.now,
                                **(more or {})})


def judge(d: Drill, before: Side | None, after: Side) -> tuple[str, str]:
    """(verdict, the sentence that says it) from the two sides' records."""
    if d.notice:
        return _notice(before, after)
    assert before is not None
    if after.step != before.step:
        return ("failed resume", f"the resumed attempt started at step {after.step}, not at the drill's checkpoint "
                f"(step {before.step}): check that restore() is given the checkpoint's state and its step is used")
    worst = 0.0
    for step in sorted(before.points):
        for name, was in sorted(before.points[step].items()):
            now = after.points.get(step, {}).get(name)
            if now is None:
                return "diverged", f"step {step} reported {name} before the interruption but not after it"
            diff = relative(was, now)
            if diff > d.tolerance:
                return "diverged", (f"first difference at step {step} ({step - before.step} after the "
                                    f"checkpoint): {name} was {was!r} before and {now!r} after (relative "
                                    f"difference {diff:.3g}{f', tolerance {d.tolerance:g}' if d.tolerance else ''}); "
                                    f"{CAUSES}")
            worst = max(worst, diff)
    steps = f"steps {before.step + 1}..{max(before.points, default=before.step)}"
    if worst == 0.0:
        return "exact", f"{steps} reported the same metrics, bit for bit, after resuming at step {before.step}"
    return "within tolerance", (f"{steps} matched within tolerance {d.tolerance:g} (largest relative "
                                f"difference {worst:.3g}) after resuming at step {before.step}")


def _notice(before: Side | None, after: Side) -> tuple[str, str]:
    if before is None:
        return ("failed resume", f"the stopped attempt wrote no final checkpoint within its grace; the next one "
                f"resumed at step {after.step}: save in exit_if_stopping() (or on SIGTERM) before the grace ends")
    lost = before.step - after.step
    grace = f"{before.grace_used:.1f}s of the grace" if before.grace_used is not None else "the grace"
    if lost == 0:
        return "exact", f"stopped at step {before.step} after {grace}, resumed at step {after.step}: 0 steps lost"
    return "failed resume", (f"stopped at step {before.step} after {grace} but resumed at step {after.step}: "
                             f"{lost} steps lost; check that restore() loads the newest checkpoint")


def _facts(d: Drill, before: Side | None, after: Side) -> dict[str, object]:
    """The figures the status keeps beside the verdict."""
    facts: dict[str, object] = {"resumed_step": after.step}
    if d.notice and before is not None:
        facts.update(step=before.step, killed_at=before.step, steps_lost=before.step - after.step,
                     grace_used=round(before.grace_used, 1) if before.grace_used is not None else None)
    return facts


def relative(a: float, b: float) -> float:
    """|a - b| relative to the larger magnitude; 0 only when the two are equal."""
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b))
