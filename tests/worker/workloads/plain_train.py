"""A training job without torch: least squares by SGD in NumPy, shuffled with Python's and NumPy's
generators, checkpointed through the worker SDK. Any lost or mis-restored piece of state (the
weights, the generators, the per-step history) changes the final state it writes.

usage: plain_train.py CFG_JSON, cfg keys: steps, seed, out (final state file, a pickle), die_at
(step: SIGKILL right after that step's save is durable), no_torch (make `import torch` fail, as
where it is not installed), with_torch (import torch first, as a script that uses it would).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import sys

cfg = json.loads(sys.argv[1])
if cfg.get("no_torch"):
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` now raises ImportError
if cfg.get("with_torch"):
    import torch  # noqa: F401

import numpy as np  # noqa: E402

from reconciler.worker import open_run  # noqa: E402

random.seed(cfg["seed"])
np.random.seed(cfg["seed"])
truth = np.arange(1.0, 5.0)
weights = {"w": np.zeros(4)}
history: dict[str, list[float]] = {"loss": []}
with open_run() as run:
    start = run.restore(weights=weights, history=history)
    for step in range(start + 1, int(cfg["steps"]) + 1):
        x = np.random.randn(8, 4)
        y = x @ truth + random.gauss(0.0, 0.1)
        grad = 2 * x.T @ (x @ weights["w"] - y) / len(x)
        weights["w"] = weights["w"] - 0.05 * grad
        history["loss"].append(float(((x @ weights["w"] - y) ** 2).mean()))
        run.heartbeat(step)
        if run.should_checkpoint(step):
            run.save(step, weights=weights, history=history)
            if step == cfg.get("die_at"):
                run.wait()
                os.kill(os.getpid(), signal.SIGKILL)
        run.exit_if_stopping(step, weights=weights, history=history)
    if cfg.get("out"):
        with open(cfg["out"], "wb") as fh:
            imported = "torch" in sys.modules and sys.modules["torch"] is not None
            pickle.dump({"weights": weights["w"].tobytes(), "history": history, "torch_imported": imported}, fh)
    run.complete(int(cfg["steps"]))
