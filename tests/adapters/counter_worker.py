"""End-to-end worker: sums step numbers through the worker SDK, so a resumed run must carry on exactly.

usage: counter_worker.py STEP_SECONDS
"""

import sys
import time

from reconciler.worker import open_run

step_seconds = float(sys.argv[1])
with open_run(heartbeat_interval=0.0) as run:
    target = run.target or 60
    state = {"total": 0}
    start = run.restore(state=state)
    print(f"starting at step {start}", flush=True)
    for step in range(start + 1, target + 1):
        state["total"] += step
        time.sleep(step_seconds)
        run.heartbeat(step, total=state["total"])
        if run.should_checkpoint(step):
            run.save(step, state=state)
        run.exit_if_stopping(step, state=state)
    assert state["total"] == target * (target + 1) // 2, "a resumed run must carry on exactly where it stopped"
    run.complete(target, total=state["total"])
