"""`reconciler logs`: one attempt's worker log, read through its provider's adapter.

Which attempt: the job's recorded status (git, HEAD) lists its attempts; they are numbered from the
job's first attempt (`describe` shows the same numbers), the newest by default. Where the log comes
from: the adapter's `logs()` (a local or SSH worker's folder, Slurm's output file, a hosted
provider's log API); an adapter that only knows workers it has observed (Kaggle) is asked again
after one `observe()`; when the provider has no log API (RunPod), has forgotten the worker, or
cannot be reached, the copy a hosted bootstrap writes to the run folder (`logs/e<epoch>.log`).

`follow` prints what was there, then polls and prints new lines until the worker has ended.
Everything goes through the secret redactor before it is returned. Errors are one sentence
(`LogError`): an unknown job, an attempt that does not exist, a provider that is gone or unreachable
with no stored copy to fall back on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import git

from adapters.compute import ComputeAdapter, ProviderConfigError, WorkerPhase, WorkerRef
from adapters.gitrepo import STATUS_DIR
from adapters.storage import RunFolder, StorageError
from desired.models import Provider
from reconciler.daemon.execute import store_options
from reconciler.daemon.loop import Reconciler
from reconciler.trust.redaction import secret_values
from status.models import Attempt, JobStatus, parse_status
from status.redact import Redactor

HISTORY_DEPTH = 200  # status commits searched for the run of an older attempt
FOLLOW_TAIL = 2000  # lines asked for on each poll of --follow (new lines are found by overlap)
LIVE = (WorkerPhase.PENDING, WorkerPhase.RUNNING)


class LogError(Exception):
    """The log cannot be read; the message is one sentence for the user."""


@dataclass
class LogSource:
    """One attempt's log: the adapter that ran it (None: its provider is defined nowhere now), the
    run folder that may hold a stored copy, and the redactor for what is shown."""

    ref: WorkerRef
    number: int  # the attempt's number, counted from the job's first attempt
    attempt: Attempt
    adapter: ComputeAdapter | None
    folder: RunFolder | None
    redactor: Redactor
    problem: str = ""  # why the adapter could not be built, if it could not

    def read(self, tail: int) -> str:
        """The last `tail` lines, redacted; LogError when no source has anything and one failed."""
        text, problem = self._from_adapter(tail)
        if not text:
            stored = self._stored(tail)
            text, problem = (stored, "") if stored else (text, problem or self.problem)
        if not text and problem:
            raise LogError(problem)
        return self.redactor.redact(text)

    def _from_adapter(self, tail: int) -> tuple[str, str]:
        if self.adapter is None:
            return "", self.problem
        try:
            text = self.adapter.logs(self.ref, tail)
            if not text:  # some adapters only know workers they have observed (Kaggle's versions)
                self.adapter.observe()
                text = self.adapter.logs(self.ref, tail)
        except Exception as exc:  # noqa: BLE001 - any failure to ask is "unreachable", said in one line
            return "", f"provider {self.ref.provider} cannot be reached: {_sentence(exc)}"
        return text, ""

    def _stored(self, tail: int) -> str:
        if self.folder is None:
            return ""
        try:
            text = self.folder.attempt_log(self.ref.epoch)
        except (StorageError, OSError):
            return ""
        return "".join(text.splitlines(keepends=True)[-tail:]) if tail > 0 else ""

    def running(self) -> bool:
        """Whether the worker is still pending or running, in its provider's word (False when the
        provider cannot be asked, or the status says the attempt has ended)."""
        if self.adapter is None or not self.attempt.open:
            return False
        try:
            state = self.adapter.observe().get(self.ref)
        except Exception:  # noqa: BLE001 - cannot tell: stop following rather than hang
            return False
        return state is not None and state.phase in LIVE


def locate(rec: Reconciler, job: str, attempt: int | None = None, fetch: bool = False) -> LogSource:
    """The log source of `job`'s attempt number `attempt` (the newest when None), from HEAD; `fetch`:
    the status the remote holds now (a clone of --repo-url)."""
    recorded = rec.read_recorded(rec.fresh_status(fetch))  # the status branch's, when there is one
    commit = rec.repo.head()
    desired = rec.read_desired(commit)
    st = recorded.get(job)
    if st is None:
        known = sorted(set(recorded) | set(desired.jobs))
        if job in desired.jobs:
            raise LogError(f"job {job} has no attempts yet (no status recorded)")
        raise LogError(f"no job named {job} (jobs: {', '.join(known) or 'none'})")
    number, att = pick_attempt(st, attempt)
    run_id = st.run_id if att is st.attempts[-1] else _run_of(rec, st, att)
    ref = WorkerRef(provider=att.provider, id=att.worker, job=job, run_id=run_id, epoch=att.epoch)
    redactor = Redactor(secret_values(desired, rec.environ))
    store = st.storage or desired.settings.storage
    try:
        folder: RunFolder | None = RunFolder.for_run(store, job, run_id, store_options(store, desired.settings))
    except (StorageError, OSError, ValueError):
        folder = None
    provider = desired.providers.get(att.provider) or _earlier_definition(rec, att.provider, st)
    adapter, problem = None, f"provider {att.provider} is no longer defined in desired/ and no stored log exists"
    if provider is not None:
        try:
            adapter = rec.adapter_factory(provider, rec.identity(desired))
            problem = ""
        except ProviderConfigError as exc:
            problem = f"provider {att.provider} cannot be used: {_sentence(exc)}"
    return LogSource(ref=ref, number=number, attempt=att, adapter=adapter, folder=folder, redactor=redactor,
                     problem=problem)


def attempt_numbers(st: JobStatus) -> list[int]:
    """The numbers of the attempts the status keeps (older ones were dropped from it)."""
    first = max(1, st.total_attempts - len(st.attempts) + 1)
    return list(range(first, first + len(st.attempts)))


def pick_attempt(st: JobStatus, attempt: int | None) -> tuple[int, Attempt]:
    numbers = attempt_numbers(st)
    if not numbers:
        raise LogError(f"job {st.job} has no attempts yet")
    if attempt is None:
        return numbers[-1], st.attempts[-1]
    if attempt not in numbers:
        kept = f"{numbers[0]}" if len(numbers) == 1 else f"{numbers[0]} to {numbers[-1]}"
        raise LogError(f"job {st.job} has no attempt {attempt} (its status keeps attempt {kept})")
    return attempt, st.attempts[numbers.index(attempt)]


def _run_of(rec: Reconciler, st: JobStatus, att: Attempt, depth: int = HISTORY_DEPTH) -> str:
    """The run an older attempt belonged to: a changed command starts a new run, whose status keeps
    the old run's attempts, so it is the run of the newest recorded status in which it was open."""
    path = f"{STATUS_DIR}/{st.job}.yaml"
    try:
        commits = rec.repo.repo.git.log(f"-{depth}", "--format=%H", "--", path).split()
    except git.GitCommandError:
        return st.run_id
    for commit in commits:
        blob = rec.repo.read_file(commit, path)
        then = parse_status(blob) if blob else None
        if then is not None and any(a.worker == att.worker and a.epoch == att.epoch and a.open
                                    for a in then.attempts):
            return then.run_id
    return st.run_id


def _earlier_definition(rec: Reconciler, provider: str, st: JobStatus) -> Provider | None:
    """A provider removed from desired/ since: as the newest earlier commit defined it."""
    if not st.desired_commit:
        return None
    return rec._last_definition(provider, st.desired_commit)  # noqa: SLF001 - the loop's own lookup


def new_lines(seen: list[str], now: list[str]) -> list[str]:
    """The lines of `now` after what `seen` already showed: both are tails of one growing log read
    with the same window, so the longest end of `seen` that starts `now` marks where the new part
    begins (a log that repeats whole windows of identical lines may be misjudged)."""
    if not seen:
        return now
    for k in range(min(len(seen), len(now)), 0, -1):
        if seen[-k:] == now[:k]:
            return now[k:]
    return now  # no overlap: the log moved on by more than a whole tail


def follow(source: LogSource, tail: int, emit: Callable[[str], None], *, poll: float = 1.0,
           sleep: Callable[[float], None] = time.sleep) -> None:
    """Emits the last `tail` lines, then each new line as it appears, until the worker has ended
    (one last read after that). KeyboardInterrupt is the caller's to catch."""
    seen = source.read(FOLLOW_TAIL).splitlines()  # every read asks for the same window: see new_lines
    if seen[-tail:] and tail > 0:
        emit("\n".join(seen[-tail:]) + "\n")
    while True:
        alive = source.running()
        lines = source.read(FOLLOW_TAIL).splitlines()
        fresh = new_lines(seen, lines)
        if fresh:
            emit("\n".join(fresh) + "\n")
            seen = lines
        if not alive:
            return
        sleep(poll)


def _sentence(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].rstrip(".")
