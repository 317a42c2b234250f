"""Which notification events a tick brought about, from the statuses before and after it (pure).

An event is a transition between two recorded statuses: the status at the commit the tick read,
and the status the tick committed. Because the reconciler derives events only from what it has
just committed, a restarted daemon (which reads the committed status as its "before") never finds
the same transition again: no event is sent twice. The price is at-most-once delivery: a daemon
killed between its status commit and the send loses that message; DESIGN.md prefers a missed
message to a flood of repeats after every restart.

Events:
- succeeded / failed: the phase became Succeeded / Failed;
- deadline-at-risk: the forecast's risk became "at risk" or "infeasible";
- budget-nearly-spent: spending first reached `budget_fraction` of the job's `budget_usd`;
- repeated-preemptions: the attempts ending in an interruption, in a row, reached `preemptions`;
- held: a change is held until someone confirms it (a commit that would cancel most jobs) or signs
  it; one event per hold, naming the jobs it holds and what releases it.
- storage-fault: run storage became full, read-only, unavailable, ... or works again (not a job's
  event: one message per change, to every target that asked for it, whatever its `jobs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from desired.models import Notifications, NotifyTarget
from status.models import JobStatus, Outcome, Phase

AT_RISK = ("at risk", "infeasible")
# How each event is sent: apprise's notify types, which targets show as a colour or an icon.
LEVELS = {"succeeded": "success", "failed": "failure", "deadline-at-risk": "warning",
          "budget-nearly-spent": "warning", "repeated-preemptions": "warning", "storage-fault": "warning"}


@dataclass(frozen=True)
class Event:
    job: str
    kind: str  # one of desired.models.NOTIFY_EVENTS
    run_id: str
    text: str  # one line for people
    jobs: tuple[str, ...] = ()  # an event about several jobs at once (a hold); `job` is then the first
    how: str = ""  # its own level, where the kind alone does not say (a drill that passed, or did not)
    sweep: str = ""  # the sweep whose members these jobs are, for an event rolled up from theirs
    parts: tuple[Event, ...] = ()  # a rolled-up event's member events, to narrow it to a target's jobs
    member_of: str = ""  # the sweep whose member `job` is, for an event of one member (not rolled up)

    @property
    def title(self) -> str:
        if self.sweep:
            return f"reconciler: sweep {self.sweep}: {len(self.jobs)} members {self.kind.replace('-', ' ')}"
        if len(self.jobs) > 1:
            return f"reconciler: {len(self.jobs)} jobs {self.kind.replace('-', ' ')}"
        return f"reconciler: {self.job} {self.kind.replace('-', ' ')}"

    @property
    def level(self) -> str:
        return self.how or LEVELS.get(self.kind, "info")


@dataclass(frozen=True)
class Message:
    url_env: str  # the target, by the name of the variable holding its URL
    title: str
    body: str
    level: str = "info"  # apprise's notify type: info, success, warning or failure


def spent(st: JobStatus) -> float:
    """Money spent on the job so far: closed attempts, plus the live one when the forecast knows it."""
    live = st.forecast.spent_usd if st.forecast is not None else 0.0
    return max(st.cost_usd, live)


def preempted_in_a_row(st: JobStatus) -> int:
    """Attempts that ended in an interruption the provider confirmed, counted back from the newest
    closed one: a process that died on a machine still there (an OOM kill, say) was not preempted."""
    count = 0
    for att in reversed(st.attempts):
        if att.open:
            continue
        if att.outcome != Outcome.INTERRUPTION or not att.provider_ended:
            break
        count += 1
    return count


def events(before: Mapping[str, JobStatus], after: Mapping[str, JobStatus],
           budgets: Mapping[str, float | None], rules: Notifications) -> list[Event]:
    """The events of one tick, job by job in name order; `budgets` is each job's budget_usd."""
    out: list[Event] = []
    for name in sorted(after):
        out.extend(job_events(before.get(name), after[name], budgets.get(name), rules))
    return by_sweep(out, after) + hold_events(before, after)


SWEEP_LISTED = 10  # members a sweep's rolled-up event tells of by name; the rest are counted


def by_sweep(found: list[Event], after: Mapping[str, JobStatus]) -> list[Event]:
    """The events of one kind that several members of one sweep brought about in this tick, as one
    event in the place of the first: a sweep whose hundred members succeed together is one message."""
    groups: dict[tuple[str, str], list[Event]] = {}
    for e in found:
        st = after.get(e.job)
        if st is not None and st.sweep and not e.jobs:
            groups.setdefault((st.sweep, e.kind), []).append(e)
    out: list[Event] = []
    for e in found:
        st = after.get(e.job)
        group = groups.get((st.sweep, e.kind), []) if st is not None and st.sweep and not e.jobs else []
        if len(group) < 2:
            out.append(replace(e, member_of=st.sweep or "") if st is not None and not e.jobs else e)
        elif e is group[0]:
            out.append(_rolled_up(after[e.job].sweep or "", group))
    return out


def _rolled_up(sweep: str, group: list[Event]) -> Event:
    listed = "; ".join(e.text for e in group[:SWEEP_LISTED])
    more = f"; and {len(group) - SWEEP_LISTED} more" if len(group) > SWEEP_LISTED else ""
    hows = {e.how for e in group}
    how = hows.pop() if len(hows) == 1 else "warning"  # drills: all passed, or not
    return Event(group[0].job, group[0].kind, "", listed + more, tuple(e.job for e in group), how, sweep,
                 tuple(group))


def hold_events(before: Mapping[str, JobStatus], after: Mapping[str, JobStatus]) -> list[Event]:
    """One event per hold that this tick started, however many jobs it holds: the note says what
    releases it, so one message is enough to act on."""
    held: dict[str, list[str]] = {}
    for name in sorted(after):
        note = after[name].held
        old = before.get(name)
        if note and (old is None or old.held != note):
            held.setdefault(note, []).append(name)
    return [Event(names[0], "held", "", note, tuple(names)) for note, names in held.items()]


def job_events(old: JobStatus | None, new: JobStatus, budget: float | None, rules: Notifications) -> list[Event]:
    found: list[Event] = []

    def add(kind: str, text: str) -> None:
        found.append(Event(new.job, kind, new.run_id, text))

    old_phase = old.phase if old is not None else None
    if new.phase == Phase.SUCCEEDED and old_phase != Phase.SUCCEEDED:
        add("succeeded", f"{new.job} succeeded at step {new.progress.step} after {new.total_attempts} "
                         f"attempt(s), ${spent(new):.2f} spent")
    if new.phase == Phase.FAILED and old_phase != Phase.FAILED:
        add("failed", f"{new.job}: {new.message}" if new.message else f"{new.job} failed")  # the title says failed
    risk = new.forecast.risk if new.forecast is not None else ""
    old_risk = old.forecast.risk if old is not None and old.forecast is not None else ""
    if risk in AT_RISK and old_risk not in AT_RISK and not new.phase.terminal:
        add("deadline-at-risk", f"{new.job}: deadline {risk}" + (f" ({new.forecast.decision})"
                                                                if new.forecast and new.forecast.decision else ""))
    if budget:
        line = rules.budget_fraction * budget
        if spent(new) >= line > (spent(old) if old is not None else 0.0):
            add("budget-nearly-spent", f"{new.job} has spent ${spent(new):.2f} of its ${budget:.2f} budget "
                                       f"({100 * spent(new) / budget:.0f} %)")
    streak = preempted_in_a_row(new)
    if streak >= rules.preemptions > (preempted_in_a_row(old) if old is not None else 0):
        provider = next((a.provider for a in reversed(new.attempts) if not a.open), "?")
        add("repeated-preemptions", f"{new.job} was interrupted {streak} times in a row (last on {provider})")
    d = new.drill
    if d is not None and d.verdict is not None and (old is None or old.drill is None or old.drill.id != d.id
                                                    or old.drill.verdict is None):
        found.append(Event(new.job, "drill", new.run_id, f"{new.job}: {d.summary()}",
                           how="success" if d.passed else "warning"))
    return found


def wants(target: NotifyTarget, event: Event) -> bool:
    """Whether `target` asked for `event`: its kind, and one of its jobs, or its sweep, by name."""
    names = {*(event.jobs or (event.job,)), event.sweep, event.member_of} - {""}
    return event.kind in target.events and (not target.jobs or any(n in target.jobs for n in names))


def for_target(target: NotifyTarget, event: Event) -> Event | None:
    """The event as `target` hears it, or None when it did not ask for it. A sweep's roll-up goes
    to a target with `jobs:` narrowed to its members there: a target for one member hears of that
    member alone, and never of members it did not name; one that names the sweep hears all of it."""
    if not wants(target, event):
        return None
    if not event.parts or not target.jobs or event.sweep in target.jobs:
        return event
    chosen = [e for e in event.parts if e.job in target.jobs]
    return chosen[0] if len(chosen) == 1 else _rolled_up(event.sweep, chosen)


def messages(found: list[Event], rules: Notifications) -> list[Message]:
    """One message per event and target that asked for it."""
    sent = [(t, for_target(t, e)) for e in found for t in rules.targets]
    return [Message(t.url_env, e.title, e.text, e.level) for t, e in sent if e is not None]


def store_messages(before: str | None, after: str | None, rules: Notifications) -> list[Message]:
    """One message per target when what is wrong with run storage changed: `before` and `after`
    say what was and is wrong (StoreFault.describe), None when nothing is."""
    if before == after:
        return []
    if after is not None:
        title, level = "reconciler: run storage fault", "warning"
        body = f"{after}; nothing is charged or launched until it is back"
    else:
        title, body, level = "reconciler: run storage works again", f"resolved: {before}; jobs carry on", "success"
    return [Message(t.url_env, title, body, level) for t in rules.targets if "storage-fault" in t.events]
