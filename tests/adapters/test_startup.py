"""What the local provider's supervisor imports (it starts once per local worker), and
bench/startup.py in its quick form."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_local_supervisor_starts_without_the_local_adapter_or_pydantic() -> None:
    code = "import sys, adapters.local_supervisor; print(sorted(m for m in ('adapters.local', 'pydantic', " \
           "'desired.models') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_startup_bench_ends_with_its_figures() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "startup.py"), "--quick"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    last = res.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"supervisor_cpu_s=[\d.]+ local_adapter_cpu_s=[\d.]+ cli_cpu_s=[\d.]+ daemon_cpu_s=[\d.]+ "
                        r"sdk_cpu_s=[\d.]+ sdk_with_torch_cpu_s=[\d.]+ bare_cpu_s=[\d.]+", last), last
