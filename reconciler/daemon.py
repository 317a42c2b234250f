"""`reconciler run`: ticks on an interval (APScheduler, one at a time, coalesced) and at once when
`desired/` changes in a local repository or a worker writes its completion record (watchfiles).

Stopping the daemon never stops workers; the next start adopts them.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from adapters.gitrepo import StateRepo
from reconciler.loop import Reconciler, TickReport

log = logging.getLogger("reconciler")


class Daemon:
    def __init__(self, reconciler: Reconciler, *, tick_seconds: float | None = None, until_done: bool = False,
                 on_tick: Callable[[TickReport], None] | None = None, watch: bool = True) -> None:
        self.rec = reconciler
        self.until_done = until_done
        self.on_tick = on_tick
        self.watch = watch
        self.stop_event = threading.Event()
        self.last_report: TickReport | None = None
        self.tick_seconds = tick_seconds
        self._seen_desired: str | None = None
        self._scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(1)})

    def _tick(self) -> None:
        if self.stop_event.is_set():
            return
        try:
            report = self.rec.tick()
        except Exception as exc:  # one bad tick must not end the daemon
            log.error("tick failed: %s; the next tick tries again", exc)
            log.debug("tick failure detail", exc_info=True)
            return
        self.last_report = report
        self._seen_desired = self._desired_id()
        if self.on_tick:
            self.on_tick(report)
        if self.until_done and report.all_terminal:
            self.stop_event.set()

    def _desired_id(self, repo: StateRepo | None = None) -> str:
        """Identifies the desired state at HEAD. GitPython objects are not thread-safe, so the
        watcher thread passes a repository object of its own."""
        repo = repo or self.rec.repo
        try:
            head = repo.head()
            return f"{repo.tree_id(head, 'desired')}:{repo.read_settings(head)!r}"
        except Exception:
            return ""

    def trigger(self) -> None:
        """Run a tick now (coalesced with any pending one)."""
        job = self._scheduler.get_job("tick")
        if job is not None:
            job.modify(next_run_time=datetime.now().astimezone())

    def _watch(self, storage_root: Path | None) -> None:
        import watchfiles

        own_repo = StateRepo(self.rec.repo.path)
        git_dir = Path(own_repo.repo.git_dir)
        paths = [git_dir]
        if storage_root is not None and storage_root.exists():
            paths.append(storage_root)

        def interesting(_change: object, path: str) -> bool:
            name = Path(path).name
            return name == "done.json" or "/refs/heads" in path or name in ("HEAD", "packed-refs")

        for changes in watchfiles.watch(*paths, watch_filter=interesting, stop_event=self.stop_event,
                                        debounce=300, rust_timeout=1000, yield_on_timeout=False):
            if any(Path(p).name == "done.json" for _c, p in changes):
                self.trigger()
            elif self._desired_id(own_repo) != self._seen_desired:  # our own status commits do not count
                log.info("desired state changed; ticking now")
                self.trigger()

    def run(self) -> TickReport | None:
        """Blocks until stopped (SIGINT/SIGTERM) or, with until_done, every job is terminal."""
        self.rec.acquire_lock()
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

        def stop(signum: int, _frame: object) -> None:
            log.info("received %s; stopping (workers keep running)", signal.Signals(signum).name)
            self.stop_event.set()

        if threading.current_thread() is threading.main_thread():
            for s in previous:
                signal.signal(s, stop)
        try:
            self._tick()
            first = self.last_report
            if self.until_done and first is not None and first.all_terminal:
                return first
            interval = self.tick_seconds or (first.desired.settings.tick_seconds
                                             if first is not None and first.desired else 30.0)
            self._scheduler.add_job(self._tick, "interval", seconds=interval, id="tick", max_instances=1,
                                    coalesce=True, misfire_grace_time=None)
            self._scheduler.start()
            watcher = None
            if self.watch:
                storage = first.desired.settings.storage if first is not None and first.desired else ""
                root = Path(storage[len("file://"):]).expanduser() if storage.startswith("file://") else None
                watcher = threading.Thread(target=self._watch, args=(root,), daemon=True, name="watch")
                watcher.start()
            self.stop_event.wait()
            return self.last_report
        finally:
            self.stop_event.set()
            if self._scheduler.running:
                self._scheduler.shutdown(wait=True)
            self.rec.release_lock()
            if threading.current_thread() is threading.main_thread():
                for s, handler in previous.items():
                    signal.signal(s, handler)
