"""CPU a process pays to start, for the processes the reconciler starts most: the local provider's
supervisor (one per local worker), the command line, the daemon (what `reconciler run` imports before
its first tick), and the worker SDK (alone, as a script that does not use torch imports it, and after
torch, as a PyTorch script does). Each is measured as the
CPU-seconds of `python -c "import MODULE"` in a fresh process, as a ratio to a bare `python -c pass`
measured in the same run (this machine is noisy; the ratio is what to compare between runs).

    python bench/startup.py            # 10 processes each
    python bench/startup.py --quick    # 1 each: a smoke run (tests/)

The last line: supervisor_cpu_s=A local_adapter_cpu_s=B cli_cpu_s=C daemon_cpu_s=D sdk_cpu_s=E
sdk_with_torch_cpu_s=F bare_cpu_s=G
(means; the supervisor is what a local launch pays, the local adapter what it paid while the
supervisor imported it).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = {"supervisor": "adapters.local_supervisor", "local_adapter": "adapters.local",
           "cli": "reconciler.cli.main", "daemon": "reconciler.cli.main, reconciler.daemon.service",
           "sdk": "reconciler.worker", "sdk_with_torch": "torch, reconciler.worker"}


def cpu_of(code: str, n: int) -> float:
    """Mean CPU-seconds (user + system) of `n` fresh Python processes running `code`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(n):
        subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 process each instead of 10")
    n = 1 if parser.parse_args().quick else 10
    bare = cpu_of("pass", n)
    figures = {name: cpu_of(f"import {module}", n) for name, module in MODULES.items()}
    print("| process | CPU-s | × bare python |")
    print("|---|---|---|")
    for name, value in figures.items():
        print(f"| {name} (`import {MODULES[name]}`) | {value:.3f} | {value / bare:.1f} |")
    print(" ".join(f"{name}_cpu_s={value:.3f}" for name, value in figures.items()) + f" bare_cpu_s={bare:.3f}")


if __name__ == "__main__":
    main()
