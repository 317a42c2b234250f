"""A test worker: records what it was given, prints numbered lines, then sleeps or exits.

Controlled only through env (argv is what the tests check): PROBE_OUT (append one JSON line per
start: argv, selected env, names of all env variables, pid), PROBE_LINES, PROBE_SLEEP, PROBE_EXIT,
PROBE_CRASH (a signal number to die of), PROBE_ON_TERM (exit code to use on SIGTERM, e.g. 75 as
after a final checkpoint; "ignore" = note it and carry on; unset = die by the signal), PROBE_LEAK
(print PROBE_SECRET as-is and encoded, and once split across two writes).
"""

import base64
import html
import json
import os
import signal
import sys
import time
from urllib.parse import quote

WATCHED = ("RECONCILER_RUN_ID", "RECONCILER_EPOCH", "RECONCILER_DEADLINE", "PROBE_PLAIN", "PROBE_SECRET")


def main() -> int:
    on_term = os.environ.get("PROBE_ON_TERM")
    if on_term:

        def stop(_signum: int, _frame: object) -> None:
            print("probe: got SIGTERM", flush=True)
            with open(os.environ["PROBE_OUT"] + ".term", "a") as fh:
                fh.write(f"{time.time()}\n")
            if on_term != "ignore":
                sys.exit(int(on_term))

        signal.signal(signal.SIGTERM, stop)
    record = {
        "argv": sys.argv[1:],
        "env": {k: os.environ.get(k) for k in WATCHED},
        "env_keys": sorted(os.environ),
        "pid": os.getpid(),
    }
    with open(os.environ["PROBE_OUT"], "a") as fh:
        fh.write(json.dumps(record) + "\n")
    if os.environ.get("PROBE_LEAK"):
        leak(os.environ["PROBE_SECRET"])
    for i in range(int(os.environ.get("PROBE_LINES", "0"))):
        print(f"line {i}", flush=True)
    if os.environ.get("PROBE_CRASH"):  # die of this signal, as a crashing program does
        os.kill(os.getpid(), int(os.environ["PROBE_CRASH"]))
    deadline = time.time() + float(os.environ.get("PROBE_SLEEP", "0"))
    while time.time() < deadline:
        time.sleep(0.1)
    return int(os.environ.get("PROBE_EXIT", "0"))


def leak(secret: str) -> None:
    print("plain", secret, "url", quote(secret, safe="").lower(), "html", html.escape(secret), flush=True)
    print("json", json.dumps(secret), "basic", base64.b64encode(("user:" + secret).encode()).decode(), flush=True)
    half = len(secret) // 2
    sys.stdout.write("split " + secret[:half])
    sys.stdout.flush()
    time.sleep(0.3)
    sys.stdout.write(secret[half:] + " end\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
