"""`reconciler run`: ticks on an interval (APScheduler, one at a time, coalesced) and at once when
`desired/` changes in a local repository, a worker writes its completion record, or a local
worker's supervisor writes its exit record (a SIGKILL relaunches at once: watchfiles), or a push
webhook for the reconciled branch arrives (`listen`, reconciler.daemon.webhook), or `reconciler reconcile`
asks on the clone's socket (reconciler.daemon.nudge, which waits for that tick), or an adapter that can
see its workers end (SSH exit records, Slurm job states: `adapters.compute.WatchesEndings`) says
one did; that watch runs on a thread per provider and only wakes the tick, which decides.

Stopping the daemon never stops workers; the next start adopts them.

Threads. Ticks run one at a time on a daemon thread of their own ("tick"); the scheduler, the
watcher and the webhook server only wake it (`trigger`, from any thread). The main thread does
nothing but wait in short timed waits, so a SIGTERM or SIGINT is always heard at once (a wait
without a timeout can hold a signal back), and its handler only sets a flag (it takes no lock, so
it cannot deadlock with the code it interrupts). On a stop the running tick gets `stop_grace`
seconds to finish; after that it is abandoned with the process: every tick
is level-triggered and each of its writes is atomic, so the next start carries on.

Settings are re-read every tick: a changed `tick_seconds` reschedules the interval, a changed
`storage` moves the watcher, and the rest (remote, status branch, identity, storage) the tick itself
reads anew.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from adapters.compute import ComputeAdapter, WatchesEndings
from adapters.gitrepo import StateRepo
from adapters.local import worker_roots
from desired.models import LocalSettings, Settings
from desired.parse import SETTINGS_FILE
from reconciler.daemon.loop import Reconciler, TickReport
from reconciler.daemon.nudge import NudgeError, NudgeServer, told
from reconciler.daemon.webhook_server import WebhookServer
from status.models import Phase

log = logging.getLogger("reconciler")

POLL_SECONDS = 0.2  # how long the main thread waits at a time
ENDINGS = ("done.json", "exit_code")  # a run completed (storage), a local worker ended (its supervisor)


class Daemon:
    def __init__(self, reconciler: Reconciler, *, tick_seconds: float | None = None, until_done: bool = False,
                 on_tick: Callable[[TickReport], None] | None = None, watch: bool = True,
                 stop_grace: float = 5.0, listen: tuple[str, int] | None = None, webhook_secret: str = "",
                 mounts: dict[str, object] | None = None, nudge: bool = True) -> None:
        """`mounts`: applications served with the webhook on `listen` (the status page, the metrics,
        when `run --serve` or `--metrics` names the same address). `nudge`: listen on the clone's
        socket for `reconciler reconcile`."""
        self.rec = reconciler
        self.until_done = until_done
        self.on_tick = on_tick
        self.watch = watch
        self.stop_grace = stop_grace
        self.stop_event = threading.Event()
        self.last_report: TickReport | None = None
        self.tick_seconds = tick_seconds  # the command line's override; beats reconciler.yaml
        self.interval: float | None = None  # the interval now scheduled
        self.abandoned = False  # a tick was still running when the daemon stopped
        self._signalled: int | None = None  # set by the signal handler, read by the main thread
        self._wake = threading.Event()
        self._ticking = threading.Lock()  # held by a running tick; the stop takes it to know none runs
        self._seen_desired: str | None = None
        self._watch_roots: tuple[Path, ...] = ()
        self._local_roots: tuple[Path, ...] = ()
        self._watch_stop: threading.Event | None = None
        self._endings: dict[str, tuple[ComputeAdapter, threading.Event]] = {}  # provider -> its watch
        self.webhook = None if listen is None else WebhookServer(
            *listen, secret=webhook_secret, wake=self.trigger, branch=self._branch, mounts=mounts)
        self.webhook_address: tuple[str, int] | None = None  # bound once running (port 0 picks one)
        self.nudge = (NudgeServer(self.rec.repo.repo.git_dir, self.tick_now)  # `reconciler reconcile`
                      if nudge and isinstance(self.rec.repo, StateRepo) else None)
        self._ticks = threading.Condition()  # counts ticks begun and ended, for `tick_now`
        self._begun = self._ended = 0
        self._outcome: dict[str, Any] = {}  # what the last tick did, as `reconciler reconcile` prints it
        self._scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(1),
                                                         "lease": ThreadPoolExecutor(1)})

    # ---- ticks ------------------------------------------------------------------------------------
    def _tick_loop(self) -> None:
        """The tick thread: one tick per wake-up, wake-ups that arrive meanwhile coalesce."""
        while not self.stop_event.is_set():
            if not self._wake.wait(POLL_SECONDS):
                continue
            with self._ticking:
                if self.stop_event.is_set() or self._signalled is not None:
                    return
                with self._ticks:
                    self._wake.clear()
                    self._begun += 1
                outcome = self._tick()
                with self._ticks:
                    self._ended, self._outcome = self._begun, outcome
                    self._ticks.notify_all()

    def tick_now(self) -> dict[str, Any]:
        """Wakes a tick and waits for one that began after this call to end; what it did, for
        `reconciler reconcile` (from the request's own thread)."""
        with self._ticks:
            wanted = self._begun + 1
            self._wake.set()
            while self._ended < wanted:
                if self.stop_event.is_set():
                    return {"error": "the daemon is stopping; no tick was run"}
                self._ticks.wait(POLL_SECONDS)
            return self._outcome

    def _tick(self) -> dict[str, Any]:
        """One tick; returns what it did, as `reconciler reconcile` tells it."""
        report: TickReport | None = None
        failure = ""
        started = time.monotonic()
        acted_on = self._desired_id()  # a commit to desired/ that lands during the tick is compared after it
        try:
            report = self.rec.tick()
            report.seconds = time.monotonic() - started
        except Exception as exc:  # one bad tick must not end the daemon
            if self._stopping():
                log.info("the stop cut a tick short (%s); the next start carries on", exc)
            else:
                self.rec.conditions.holds("tick failed", f"tick failed: {exc}; the next tick tries again",
                                         logging.ERROR)
            log.debug("tick failure detail", exc_info=True)
            failure = self.rec.redactor.redact(f"the tick failed: {exc}; the next tick tries again")
        else:
            self.rec.conditions.ended("tick failed", "ticks work again")
        self._seen_desired = acted_on
        # a commit during the tick: its watch event may have come and gone (with --no-watch, only the
        # interval or a webhook ticks, as the user asked)
        if self.watch and self._desired_id() != acted_on:
            log.info("desired state changed during the tick; ticking again")
            self.trigger()
        try:
            self._follow_settings(report)
        except Exception as exc:  # e.g. no commit yet: the interval stays as it was
            log.debug("settings not followed this tick: %s", exc)
        if report is not None and report.standby is None and report.halted is None:
            self.last_report = report
            self._wake_after_backoff(report)
            if self.on_tick:
                self.on_tick(report)
            if self.until_done and report.all_terminal:
                self.stop_event.set()
        return told(report, failure)

    def _stopping(self) -> bool:
        """A stop is under way. A SIGTERM or SIGINT sent to the whole process group (systemd, Ctrl-C)
        also ends the git processes a tick talks to, which fails it (broken pipe, an empty SHA),
        maybe a moment before the main thread has heard the signal: a stop is not a failure."""
        return self._signalled is not None or self.stop_event.wait(4 * POLL_SECONDS)
    def _wake_after_backoff(self, report: TickReport) -> None:
        """A job backing off relaunches when its back-off ends, not at the next tick (an hour away
        with `tick_seconds: 3600`): one tick is scheduled then, for the earliest of the jobs'."""
        ends = [st.backoff_until for st in report.statuses.values()
                if st.phase == Phase.BACKOFF and st.backoff_until is not None]
        if not ends or self.stop_event.is_set():
            return
        delay = max(0.0, min(ends) - self.rec.clock.now()) + 0.05  # just past it: the planner compares now < until
        self._scheduler.add_job(self._wake.set, "date", run_date=datetime.now(UTC) + timedelta(seconds=delay),
                                id="backoff", replace_existing=True, misfire_grace_time=None)

    def _keep_lease(self) -> None:
        """Renews the leader lease between ticks, so that a tick longer than the lease keeps it."""
        election = self.rec.election
        if election is None or self.stop_event.is_set():
            return
        try:
            held = election.keep_alive(self.rec.clock.now())
        except Exception as exc:
            self.rec.lease_fault(exc)
        else:
            if held is not None:
                self.rec.lease_held(held)

    def trigger(self) -> None:
        """Run a tick now (coalesced with any pending one). Safe from any thread: it only sets an event."""
        self._wake.set()

    def _branch(self) -> str | None:
        """The branch this clone reconciles, for the webhook thread (with a repository object of its
        own: GitPython objects are not thread-safe); None when HEAD is detached."""
        try:
            return self.rec.repo.twin().branch()
        except Exception:
            return None

    # ---- settings, re-read every tick -------------------------------------------------------------
    def _settings(self, report: TickReport | None) -> Settings:
        if report is not None and report.desired is not None:
            return report.desired.settings
        return self.rec.settings_at(self.rec.repo.head())  # a standby's or failed tick

    def _follow_settings(self, report: TickReport | None) -> None:
        """A changed interval or storage folder applies from this tick on, without a restart."""
        settings = self._settings(report)
        interval = self.tick_seconds or settings.tick_seconds
        if interval != self.interval:
            if self.interval is not None:
                log.info("tick_seconds changed from %g to %g; rescheduled", self.interval, interval)
            self.interval = interval
            if not self.stop_event.is_set():
                self._scheduler.reschedule_job("tick", trigger="interval", seconds=interval)
        if self.watch:
            storage = settings.storage
            root = Path(storage[len("file://"):]).expanduser() if storage.startswith("file://") else None
            roots = tuple(r for r in (root, *self._local_worker_roots(report)) if r is not None and r.exists())
            if roots != self._watch_roots or self._watch_stop is None:
                self._start_watch(roots)
            desired = report.desired if report is not None else None
            if desired is not None and not any(e.file == SETTINGS_FILE for e in desired.errors):
                self._follow_endings(self.rec.adapters_for(desired, []))  # the tick's own adapters (cached)

    def _local_worker_roots(self, report: TickReport | None) -> tuple[Path, ...]:
        """Where local providers' supervisors write exit records: a worker that dies there (a
        SIGKILL, an OOM) starts a tick at once instead of waiting up to a whole interval."""
        desired = report.desired if report is not None else None
        if desired is None:
            return self._local_roots
        self._local_roots = tuple(sorted({r for p in desired.providers.values()
                                          if isinstance(p.spec.settings, LocalSettings)
                                          for r in worker_roots(p.spec.settings)}))
        return self._local_roots

    def _follow_endings(self, adapters: dict[str, ComputeAdapter]) -> None:
        """One endings watch per provider whose adapter has one; a provider gone or rebuilt (changed
        settings) has its watch stopped, and the new adapter's started."""
        wanted = {name: a for name, a in adapters.items() if isinstance(a, WatchesEndings)}
        for name, (adapter, stop) in list(self._endings.items()):
            if wanted.get(name) is not adapter:
                stop.set()
                del self._endings[name]
        for name, adapter in wanted.items():
            if name not in self._endings and not self.stop_event.is_set():
                stop = threading.Event()
                self._endings[name] = (adapter, stop)
                threading.Thread(target=self._watch_endings, args=(name, adapter, stop), daemon=True,
                                 name=f"endings-{name}").start()

    def _watch_endings(self, name: str, adapter: ComputeAdapter, stop: threading.Event) -> None:
        def ended() -> None:
            log.info("a worker on provider %s ended; ticking now", name)
            self.trigger()

        try:
            adapter.watch_endings(stop, ended)  # type: ignore[attr-defined]  # a WatchesEndings
        except Exception as exc:  # the interval stays the fallback
            log.warning("provider %s: watching for workers' ends stopped (%s); the interval still ticks", name, exc)

    # ---- watching the repository and local storage -------------------------------------------------
    def _desired_id(self, repo: StateRepo | None = None) -> str:
        """Identifies the desired state at HEAD. GitPython objects are not thread-safe, so the
        watcher thread passes a repository object of its own."""
        repo = repo or self.rec.repo
        try:
            head = repo.head()
            return f"{repo.tree_id(head, 'desired')}:{repo.read_settings(head)!r}"
        except Exception:
            return ""

    def _start_watch(self, roots: tuple[Path, ...]) -> None:
        if self._watch_stop is not None:
            self._watch_stop.set()
        self._watch_roots = roots
        self._watch_stop = threading.Event()
        threading.Thread(target=self._watch, args=(roots, self._watch_stop), daemon=True, name="watch").start()

    def _watch(self, roots: tuple[Path, ...], stop: threading.Event) -> None:
        """Local storage (completion records), local workers' folders (exit records) and the
        repository's refs (a commit to desired/)."""
        import watchfiles

        paths = [Path(self.rec.repo.repo.git_dir), *(r for r in roots if r.exists())]

        def interesting(_change: object, path: str) -> bool:
            name = Path(path).name
            return name in ENDINGS or "/refs/heads" in path or name in ("HEAD", "packed-refs")

        for changes in watchfiles.watch(*paths, watch_filter=interesting, stop_event=stop,
                                        debounce=300, rust_timeout=1000, yield_on_timeout=False):
            if any(Path(p).name in ENDINGS for _c, p in changes):
                self.trigger()
            elif self._desired_id(self.rec.repo.twin()) != self._seen_desired:  # our status commits do not count
                log.info("desired state changed; ticking now")
                self.trigger()

    # ---- running and stopping ---------------------------------------------------------------------
    def run(self) -> TickReport | None:
        """Blocks until stopped (SIGINT/SIGTERM) or, with until_done, every job is terminal."""
        self.rec.acquire_lock()
        previous = self._install_handlers()
        try:
            if self.webhook is not None:  # after the lock: a second daemon on this clone fails on that first
                self.webhook_address = self.webhook.start()
            if self.nudge is not None:
                try:
                    self.nudge.start()
                except (OSError, NudgeError) as exc:  # the daemon still ticks; only the nudge is lost
                    log.warning("`reconciler reconcile` cannot reach this daemon: %s", exc)
                    self.nudge = None
            self.interval = None
            self._scheduler.add_job(self._wake.set, "interval", seconds=self.tick_seconds or 30.0, id="tick",
                                    max_instances=1, coalesce=True, misfire_grace_time=None)
            self._scheduler.add_job(self._keep_lease, "interval", seconds=1.0, id="lease", executor="lease",
                                    max_instances=1, coalesce=True, misfire_grace_time=None)
            self._scheduler.start()
            threading.Thread(target=self._tick_loop, daemon=True, name="tick").start()
            self._wake.set()  # the first tick, at once
            while not self.stop_event.wait(POLL_SECONDS):
                if self._signalled is not None:
                    log.info("received %s; stopping (workers keep running)", signal.Signals(self._signalled).name)
                    self.stop_event.set()
            return self.last_report
        finally:
            self._stop()
            self._restore_handlers(previous)

    def _stop(self) -> None:
        """Stop waking ticks, give a running one `stop_grace` seconds, then let go of the leases."""
        self.stop_event.set()
        if self._watch_stop is not None:
            self._watch_stop.set()
        for _adapter, stop in self._endings.values():
            stop.set()
        if self.webhook is not None:
            self.webhook.stop()
        if self.nudge is not None:
            self.nudge.stop()
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        if not self._ticking.acquire(timeout=self.stop_grace):
            # The process ends with the tick thread: the flock goes with it, the leader lease expires.
            self.abandoned = True
            log.warning("a tick was still running %gs after the stop; leaving it (workers keep running, "
                        "the next start carries on)", self.stop_grace)
            return
        try:
            self.rec.resign()
            self.rec.release_lock()
        finally:
            self._ticking.release()

    def _install_handlers(self) -> dict[signal.Signals, Any]:
        signals = (signal.SIGINT, signal.SIGTERM)
        previous: dict[signal.Signals, Any] = {s: signal.getsignal(s) for s in signals}

        def heard(signum: int, _frame: object) -> None:
            self._signalled = signum  # no lock, no logging: the main thread acts on it within POLL_SECONDS

        if threading.current_thread() is threading.main_thread():
            for s in signals:
                signal.signal(s, heard)
        return previous

    def _restore_handlers(self, previous: dict[signal.Signals, Any]) -> None:
        if threading.current_thread() is threading.main_thread():
            for s, handler in previous.items():
                signal.signal(s, handler)
