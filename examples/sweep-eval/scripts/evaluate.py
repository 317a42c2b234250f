"""Runs after the whole sweep: reads each member's metrics.json from the sweep's outputs (the
reconciler downloads them, verified, under $RECONCILER_INPUT_DIR/<sweep>/<member>/), picks the
member with the lowest validation loss, evaluates its model on a test set no member saw, and
leaves in its own outputs:

    best.json   {"member": ..., "lr": ..., "val_loss": ..., "test_loss": ..., "members": {...}}
    model.pt    the chosen member's weights
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import torch
from model import build, held_out, loss_on

from reconciler.worker import open_run

SWEEP = os.environ.get("SWEEP", "train")


def main() -> None:
    torch.set_num_threads(1)
    with open_run() as run:
        sweep = run.input_dir / SWEEP
        members = {m.name: json.loads((m / "metrics.json").read_text())
                   for m in sorted(sweep.iterdir()) if (m / "metrics.json").is_file()} if sweep.is_dir() else {}
        if not members:
            sys.exit(f"no member of {SWEEP} left a metrics.json in {sweep}; check that this job runs after {SWEEP}")
        best = min(members, key=lambda name: members[name]["val_loss"])
        model, _ = build(members[best]["lr"])
        model.load_state_dict(torch.load(sweep / best / "model.pt", weights_only=True))
        test_loss = loss_on(model, held_out(seed=2))
        result = {"member": best, "lr": members[best]["lr"], "val_loss": members[best]["val_loss"],
                  "test_loss": test_loss, "members": {n: m["val_loss"] for n, m in members.items()}}
        (run.output_dir / "best.json").write_text(json.dumps(result, indent=2) + "\n")
        shutil.copyfile(sweep / best / "model.pt", run.output_dir / "model.pt")
        print(f"best: {best} (validation loss {result['val_loss']:.6f}, test loss {test_loss:.6f})", flush=True)
        run.complete(1, test_loss=test_loss)


if __name__ == "__main__":
    main()
