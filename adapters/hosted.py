"""What every hosted provider's launch carries: the worker SDK and a small generated bootstrap.

A hosted worker (a Kaggle kernel, a Lightning job, a rented container) cannot see the daemon's
disk or its Python packages. So the launch carries:

- the worker SDK (`sdk_bundle()`: a compressed tar of the modules a worker imports, base64 inside the script;
  the SDK is not published to a package index), unpacked to a temporary folder put on PYTHONPATH,
  with a `reconciler` command on PATH for `reconciler exec -- ...`;
- the job's code: `code.git` cloned at `code.ref` (or the provider's container `image`);
- a bootstrap (`bootstrap_script()`): a Python script the user can read, that sets the attempt's
  environment, fetches the job's named secrets from the provider's own secret store (the values
  never travel in the launch), checks that run storage can be reached, runs the command with only
  the minimal environment, masks every form of the secrets in its output (status.redact, the
  same masking as the reconciler's), copies the last 400 lines of its output into the run folder
  (`logs/e<epoch>.log`, every 30 s and at the end: RunPod has no log API), and ends with one
  `reconciler-bootstrap: exit {...}` line in the log and in that copy (with `received`: the
  signal the provider sent it, if any), because most hosted APIs report only
  "complete" or "error", never an exit code or signal.

The session clock: a provider with a session limit passes `session_seconds`; the bootstrap sets
RECONCILER_DEADLINE to the earlier of the job's deadline and (its own start + session - margin),
so the SDK saves and exits 75 before the provider's cut.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from adapters.compute import BASE_ENV, BASE_ENV_PREFIXES, JobConfigError, LaunchSpec
from adapters.slim import slim
from adapters.wire import load_json

# The modules a worker imports (reconciler.worker and `reconciler exec`, with their storage layer);
# tests/adapters/test_hosted.py imports the bundle alone to prove the list is complete.
SDK_FILES = (
    "reconciler/__init__.py",
    "reconciler/worker/__init__.py",
    "reconciler/worker/run.py",
    "reconciler/worker/terms.py",
    "reconciler/worker/snapshot.py",
    "reconciler/worker/staging.py",
    "reconciler/worker/lazy_torch.py",
    "reconciler/worker/data.py",
    "reconciler/worker/loop.py",
    "reconciler/worker/carried.py",
    "reconciler/worker/reported.py",
    "reconciler/worker/drilling.py",
    "reconciler/worker/handover.py",
    "reconciler/worker/storefault.py",
    "reconciler/worker/dist.py",
    "reconciler/worker/sharded.py",
    "reconciler/worker/integrations/__init__.py",
    "reconciler/worker/integrations/files.py",
    "reconciler/worker/integrations/lightning.py",
    "reconciler/worker/integrations/huggingface.py",
    "reconciler/checkpoint_policy.py",
    "reconciler/execwrap.py",
    "adapters/__init__.py",
    "adapters/digest.py",
    "adapters/stores/__init__.py",
    "adapters/stores/base.py",
    "adapters/stores/local.py",
    "adapters/stores/s3.py",
    "adapters/stores/memory.py",
    "adapters/stores/fsspec.py",
    "adapters/stores/marks.py",
    "adapters/stores/faults.py",
    "adapters/series.py",
    "adapters/drills.py",
    "adapters/storage.py",
    "adapters/artifacts.py",
    "adapters/s3.py",
    "status/__init__.py",
    "status/redact.py",
    "adapters/wire.py",
)
EXIT_MARK = "reconciler-bootstrap: exit "
STORAGE_UNREACHABLE = 66  # EX_NOINPUT: the bootstrap could not reach run storage; the command never ran
# EX_NOUSER: a secret the job names is not available to the worker at its provider (Kaggle: not
# attached to the job's kernel); the command never ran, and only a person can fix it.
SECRET_NOT_ATTACHED = 67


def package_root() -> Path:
    return Path(__file__).resolve().parent.parent


@lru_cache(maxsize=1)
def sdk_bundle() -> bytes:
    """The worker SDK as one zlib-compressed tar (deterministic: sorted names, no times or owners).
    Compressed as one stream, not file by file as a zip is, it is a fifth smaller, which counts
    where the whole launch must fit in one 128 KiB argument (see `packed`); so does carrying the
    modules without their comments and docstrings (adapters.slim), line for line."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in sorted(SDK_FILES):
            data = slim((package_root() / name).read_text(encoding="utf-8")).encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return zlib.compress(out.getvalue(), 9)


def unpack_bundle(bundle: bytes, root: str) -> None:
    """What `sdk_bundle` packed, written under `root` (the bootstrap does the same in its own words)."""
    with tarfile.open(fileobj=io.BytesIO(zlib.decompress(bundle))) as tar:
        tar.extractall(root, filter="data")


def sdk_digest() -> str:
    return hashlib.sha256(sdk_bundle()).hexdigest()[:16]


@dataclass(frozen=True)
class Bootstrap:
    """Provider-specific parts of the bootstrap. `secrets_source` is a Python function body
    `def load_secrets(names): ...` returning {name: value}; `session_seconds` the provider's cut
    measured from the bootstrap's start (None = none); `python` the interpreter for the command's
    `reconciler` helper."""

    provider: str
    secrets_source: str
    session_seconds: float | None = None
    save_margin_seconds: float = 600.0
    at_exit_source: str = "def at_exit(record):\n    pass"  # runs as the bootstrap ends (RunPod: stop the pod)


SECRETS_FROM_ENV = '''
def load_secrets(names):
    """The provider puts the job's secrets in this process's environment."""
    missing = [n for n in names if n not in os.environ]
    if missing:
        fail(f"secret {', '.join(missing)} is not set by the provider; attach it there")
    return {n: os.environ[n] for n in names}
'''


def bootstrap_script(spec: LaunchSpec, labels: dict[str, Any], boot: Bootstrap, *, code_git: str | None = None,
                     code_ref: str | None = None) -> str:
    """The Python script a hosted worker runs: readable on top, the SDK archive at the bottom.
    Holds no secret value: only the names of the secrets to fetch."""
    plan = {
        "labels": labels,
        "command": spec.command,
        "env": spec.env,
        "secrets": sorted(spec.secret_env),
        "workdir": spec.workdir,
        "code": {"git": code_git, "ref": code_ref} if code_git else None,
        "job_deadline": spec.deadline,
        "session_seconds": boot.session_seconds,
        "save_margin_seconds": boot.save_margin_seconds,
        "base_env": list(BASE_ENV),
        "base_env_prefixes": list(BASE_ENV_PREFIXES),
    }
    blob = base64.b64encode(sdk_bundle()).decode()
    lines = [blob[i:i + 100] for i in range(0, len(blob), 100)]
    return _TEMPLATE.format(
        provider=boot.provider, job=spec.job, run_id=spec.run_id, epoch=spec.epoch,
        plan=json.dumps(plan, indent=1, sort_keys=True), secrets_source=boot.secrets_source.strip(),
        at_exit_source=boot.at_exit_source.strip(),
        digest=sdk_digest(), sdk="\n".join(lines), mark=EXIT_MARK, unreachable=STORAGE_UNREACHABLE,
    )


# Linux refuses one argument or environment string longer than this (MAX_ARG_STRLEN, 32 pages):
# a launch that hands the packed bootstrap to `sh -c` (Vast.ai, RunPod, Lightning AI) must fit.
ARG_LIMIT = 128 * 1024
UNPACK_PY = "import base64,sys,zlib; sys.stdout.buffer.write(zlib.decompress(base64.b64decode(sys.stdin.read())))"


class LaunchTooLarge(JobConfigError):
    """The packed bootstrap would not fit in one command-line argument: the job's own doing (its
    command and env are what grows), so the job fails with the reason instead of looping."""


def packed(script: str) -> str:
    """The bootstrap zlib-compressed and in base64 (no character of it means anything to a shell),
    for a launch that carries it in one argument; `python3 -c UNPACK_PY` turns it back. Raises
    LaunchTooLarge rather than let the provider's machine fail with "Argument list too long"."""
    blob = base64.b64encode(zlib.compress(script.encode(), 9)).decode()
    if len(blob) > ARG_LIMIT - 1024:  # room for the few words of shell around it
        raise LaunchTooLarge(f"the worker's bootstrap packs to {len(blob)} bytes, over the {ARG_LIMIT}-byte limit "
                             "of one command-line argument on the provider's machine: shorten the job's command "
                             "and env (or give large inputs through code.git or storage)")
    return blob


def parse_exit_record(log_text: str) -> dict[str, Any] | None:
    """The bootstrap's last `exit` line: {"code": n} or {"signal": "SIGSEGV", "code": -11}, plus
    "reason" when the bootstrap itself failed and "received" (e.g. "SIGTERM") when the provider
    signalled the machine; None when the worker never got that far."""
    for line in reversed(log_text.splitlines()):
        at = line.find(EXIT_MARK)
        if at < 0:
            continue
        try:
            record = load_json(line[at + len(EXIT_MARK):])
        except ValueError:
            return None
        return record if isinstance(record, dict) else None
    return None


PLAN_START = 'PLAN = json.loads(r"""\n'
PLAN_END = '\n""")'


def script_plan(script: str) -> dict[str, Any] | None:
    """The plan (labels, command, secret names...) of a bootstrap script read back from a provider
    that keeps the script (Kaggle's kernel source): how a restarted daemon learns a worker's labels."""
    start = script.find(PLAN_START)
    end = script.find(PLAN_END, start + len(PLAN_START)) if start >= 0 else -1
    if end < 0:
        return None
    try:
        plan = load_json(script[start + len(PLAN_START):end])
    except ValueError:
        return None
    return plan if isinstance(plan, dict) else None


_TEMPLATE = '''#!/usr/bin/env python3
# reconciler bootstrap for {provider}: job {job}, run {run_id}, attempt {epoch}.
# Generated by the reconciler; safe to read. It holds no secret values, only their names.
# What it does: unpack the worker SDK (bottom of this file) and put it on PYTHONPATH, fetch the
# job's code, read the named secrets from the provider's secret store, check that run storage
# answers, run the command with a minimal environment (its output's tail also goes to the run
# folder as logs/e<epoch>.log), and print one exit line for the reconciler.
import base64, collections, io, json, os, signal, subprocess, sys, tarfile, tempfile, threading, time, zlib

PLAN = json.loads(r"""
{plan}
""")
STARTED = time.time()


def say(message):
    print("reconciler-bootstrap: " + message, flush=True)


def finish(record):
    print("{mark}" + json.dumps(record, sort_keys=True), flush=True)
    at_exit(record)
    code = record.get("code", 1)
    sys.exit(code if 0 <= code < 256 else 128 + abs(code))


def fail(reason, code=1):
    finish({{"code": code, "reason": reason}})


{secrets_source}


{at_exit_source}


def deadline():
    """The earlier of the job's deadline and this session's end less a margin to save in."""
    known = [PLAN["job_deadline"]] if PLAN["job_deadline"] else []
    if PLAN["session_seconds"]:
        known.append(STARTED + PLAN["session_seconds"] - PLAN["save_margin_seconds"])
    return str(int(min(known))) if known else None


def unpack_sdk():
    """The worker SDK (sha256 {digest}) into a private folder; a `reconciler` command beside it."""
    root = tempfile.mkdtemp(prefix="reconciler-sdk-")
    with tarfile.open(fileobj=io.BytesIO(zlib.decompress(base64.b64decode(SDK)))) as tar:
        tar.extractall(root, **({{"filter": "data"}} if hasattr(tarfile, "data_filter") else {{}}))
    bin_dir = os.path.join(root, "bin")
    os.mkdir(bin_dir)
    helper = os.path.join(bin_dir, "reconciler")
    with open(helper, "w") as fh:
        fh.write("#!" + sys.executable + "\\nimport sys\\nsys.path.insert(0, " + repr(root) + ")\\n"
                 "from reconciler.execwrap import main\\n"
                 "if sys.argv[1:2] != ['exec']:\\n    sys.exit('only `reconciler exec` is available here')\\n"
                 "sys.exit(main(sys.argv[2:]))\\n")
    os.chmod(helper, 0o755)
    return root, bin_dir


def fetch_code():
    code = PLAN["code"]
    if not code:
        return PLAN["workdir"]
    dest = tempfile.mkdtemp(prefix="reconciler-code-")
    steps = [["git", "clone", "--quiet", "--", code["git"], dest]]
    if code["ref"]:
        steps.append(["git", "-C", dest, "checkout", "--quiet", code["ref"]])
    for step in steps:
        try:
            done = subprocess.run(step)
        except FileNotFoundError:
            fail("the image has no git, so the job's code (code.git) cannot be fetched: use an image with git")
        if done.returncode != 0:
            fail("cannot fetch the job's code with: " + " ".join(step[:-1] if step[1] == "clone" else step))
    return os.path.join(dest, PLAN["workdir"]) if PLAN["workdir"] else dest


def check_storage(env, sdk):
    """Fail early, once, with the reason, when run storage cannot be reached from here."""
    probe = "from adapters.storage import RunFolder; RunFolder(%r).lease_epoch()" % env["RECONCILER_RUN_URI"]
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        fail("cannot reach run storage " + env["RECONCILER_RUN_URI"] + ": " + last, {unreachable})


LOG_TAIL_LINES = 400
LOG_EVERY_SECONDS = 30
SHIP = ("import os, sys; from adapters.storage import RunFolder; "
        "RunFolder(os.environ['RECONCILER_RUN_URI']).write_attempt_log(int(os.environ['RECONCILER_EPOCH']), "
        "sys.stdin.read())")


SHIP_LOCK = threading.Lock()
SHIPPED_FINAL = []


def ship_log(env, tail, final=False):
    """The output's tail into the run folder (logs/e<epoch>.log), for providers with no log API.
    One copy at a time, and none after the final one (which carries the exit line)."""
    if "RECONCILER_RUN_URI" not in env or "RECONCILER_EPOCH" not in env:
        return
    with SHIP_LOCK:
        if SHIPPED_FINAL:
            return
        if final:
            SHIPPED_FINAL.append(True)
        _ship(env, "".join(tail))


def _ship(env, text):
    try:
        subprocess.run([sys.executable, "-c", SHIP], env=env, input=text.encode(), timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        pass  # best effort: the provider's own log, where there is one, still has everything


def ship_log_every(env, tail):
    shipped = None
    while True:
        time.sleep(LOG_EVERY_SECONDS)
        if tail and tail[-1] is not shipped:
            shipped = tail[-1]
            ship_log(env, tail)


def main():
    sdk, bin_dir = unpack_sdk()
    base = {{k: v for k, v in os.environ.items()
            if k in PLAN["base_env"] or k.startswith(tuple(PLAN["base_env_prefixes"]))}}
    env = dict(base, **PLAN["env"])
    secrets = load_secrets(PLAN["secrets"])
    env.update(secrets)
    sys.path.insert(0, sdk)
    from status.redact import Redactor  # the reconciler's own masking, from the SDK
    hidden = Redactor(secrets.values())  # the reconciler may not know these values: masked here
    env["PYTHONPATH"] = sdk
    env["PATH"] = bin_dir + os.pathsep + base.get("PATH", os.defpath)
    if deadline():
        env["RECONCILER_DEADLINE"] = deadline()
    cwd = fetch_code()
    if "RECONCILER_RUN_URI" in env:
        check_storage(env, sdk)
    say("starting " + json.dumps(PLAN["command"]))
    try:
        child = subprocess.Popen(PLAN["command"], env=env, cwd=cwd, start_new_session=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as exc:
        fail("cannot start the command: " + str(exc), 127)
    received = []  # signals the provider sent the machine (a stop it asked for, not a crash)
    def forward(signum, frame):
        received.append(signal.Signals(signum).name)
        child.send_signal(signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, forward)
    tail = collections.deque(maxlen=LOG_TAIL_LINES)
    shipper = threading.Thread(target=ship_log_every, args=(env, tail), daemon=True)
    shipper.start()
    for raw in iter(child.stdout.readline, b""):
        line = hidden.redact(raw.decode("utf-8", "replace"))
        sys.stdout.write(line)
        sys.stdout.flush()
        tail.append(line)
    code = child.wait()
    record = {{"code": code, "signal": signal.Signals(-code).name}} if code < 0 else {{"code": code}}
    if received:
        record["received"] = received[0]
    if code == 75 and PLAN["session_seconds"]:  # how close the session's cut was: a session end, or not
        record["session_left"] = round(STARTED + PLAN["session_seconds"] - time.time())
    tail.append("{mark}" + json.dumps(record, sort_keys=True) + "\\n")  # the exit travels with the log
    ship_log(env, tail, final=True)
    finish(record)


SDK = """
{sdk}
"""

if __name__ == "__main__":
    main()
'''
