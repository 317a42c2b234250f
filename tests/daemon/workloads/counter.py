"""A tiny worker for loop tests: sums step numbers, checkpointing through the worker SDK.

usage: counter.py STEP_SECONDS [--first-attempt-step-seconds S] [--interrupt-until-epoch N]
                  [--killed-after-save]
With --first-attempt-step-seconds S, attempt 1 takes S seconds a step (STEP_SECONDS from attempt 2
on): a run that cannot finish in its first session however fast the worker starts.
With --interrupt-until-epoch N, attempts 1..N leave at once with exit 75 (as if preempted after
a final checkpoint), before the SDK is even imported, so many attempts stay cheap.
With --killed-after-save, every attempt is killed by SIGKILL right after its first checkpoint is
durable, with no word from any provider: what an out-of-memory kill looks like.
"""

import os
import signal
import sys
import time

step_seconds = float(sys.argv[1])
if "--first-attempt-step-seconds" in sys.argv and os.environ.get("RECONCILER_EPOCH") == "1":
    step_seconds = float(sys.argv[sys.argv.index("--first-attempt-step-seconds") + 1])
if "--interrupt-until-epoch" in sys.argv:
    limit = int(sys.argv[sys.argv.index("--interrupt-until-epoch") + 1])
    if int(os.environ["RECONCILER_EPOCH"]) <= limit:
        sys.exit(75)

from reconciler.worker import open_run  # noqa: E402

with open_run(heartbeat_interval=0.0) as run:
    target = run.target or 60
    state = {"total": 0}
    start = run.restore(state=state)
    for step in range(start + 1, target + 1):
        state["total"] += step
        time.sleep(step_seconds)
        run.heartbeat(step, total=state["total"])
        if run.should_checkpoint(step):
            run.save(step, state=state)
            if "--killed-after-save" in sys.argv:
                run.wait()
                os.kill(os.getpid(), signal.SIGKILL)
        run.exit_if_stopping(step, state=state)
    assert state["total"] == target * (target + 1) // 2, "a resumed run must carry on where it stopped"
    run.complete(target, total=state["total"])
