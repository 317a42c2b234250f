"""The worker agent that the ssh and slurm adapters put next to every worker they start.

This file is both a helper module for those adapters (`agent_source()`, `agent_digest()`) and the
script itself: its own source is uploaded to `<workdir>/bin/agent-<digest>.py` on each SSH host
(or written to the shared workdir of a Slurm cluster) and run there with the host's Python. It
therefore imports only the standard library and runs on Python >= 3.7.

Why an agent instead of shell one-liners: the worker's argv, env and secrets arrive as one JSON
document on stdin (or, for Slurm, in a 0600 file that is removed as soon as it is read), so no
argument ever passes through a shell, and no secret is ever on a command line or in a file others
can read. One `list` call per host reports every worker of ours, which is what `observe` needs.

Each worker has a folder `<workdir>/workers/<owner>.<job>.<run_id>.e<epoch>/` (0700, the same layout
as the local adapter; `owner` is the state repository's identity) holding:

    labels.json      provider, owner, job, run_id, epoch (written first; the folder is created
                     exclusively, so a second launch with the same labels adopts instead of starting twice)
    wrapper.pid      pid and start time of the agent process that supervises the command
    child.pid        pid and start time of the command (it leads its own process group)
    log              the command's stdout and stderr (0600), with the payload's `mask` applied as it is
                     written (every form of the job's secrets becomes ***; see OutputMasker)
    exit.json        {"code": n} or {"signal": n, "oom": bool}, written by the wrapper when the command
                     ends; oom = the command died of SIGKILL while its memory cgroup's oom_kill counter
                     rose (`oom_kills`; absent where the counter cannot be read)
    terminated       the reconciler asked for the stop (so a kill is not blamed on someone else)
    warned           Slurm's time-limit warning arrived before the end

The command gets only a minimal environment: PATH, HOME, USER/LOGNAME, LANG/LC_*, TZ, TMPDIR of
the agent's own (those that are set; the same list as `adapters.compute.worker_base_env`), the
variables named by the payload's `pass_prefixes` (Slurm: SLURM_*, set by Slurm for the job), the
job's env and its secrets.

Subcommands: `launch DIR` (ssh: detach and supervise), `run DIR` (slurm batch step: supervise in
the foreground), `list WORKDIR PROVIDER OWNER` (our workers, and how many live ones other owners
have there), `terminate DIR`, `logs DIR N`.
"""

import codecs
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

AGENT_VERSION = "1"
KEEP_FINISHED_SECONDS = 7 * 24 * 3600  # finished worker folders older than this are removed by `list`
NEVER_STARTED_SECONDS = 120  # a folder with no wrapper after this long is reported lost
WARNING_HOLD_SECONDS = 10  # a time-limit warning is passed on no sooner than this after the worker starts
BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR")  # = adapters.compute.BASE_ENV
BASE_ENV_PREFIXES = ("LC_",)
HOLD_LIMIT = 65536  # characters of one unended line held back before part of it is written out
DRAIN_SECONDS = 5  # how long output still coming after the command's end (a process it left) is read


def agent_source():
    """The text uploaded to hosts: this very file."""
    with open(os.path.abspath(__file__), encoding="utf-8") as fh:
        return fh.read()


def agent_digest():
    """Names the uploaded copy, so hosts keep one file per agent version and never run a stale one."""
    return hashlib.sha256(agent_source().encode()).hexdigest()[:16]


# ---- small file helpers ---------------------------------------------------------------------------


def _write(path, text, mode=0o600):
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _read_json(path):
    text = _read(path)
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def process_start_time(pid):
    """Start time of a process in clock ticks since boot, to tell a pid from its reuse (None once
    it has ended, a zombie included)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            return None
        return fields[19]
    except (OSError, IndexError):
        return None


def _alive(record):
    if not record or not record.get("pid"):
        return False
    pid = int(record["pid"])
    if os.path.isdir("/proc"):
        now = process_start_time(pid)
        return now is not None and (record.get("start") in (None, now))
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _process_record(pid):
    return json.dumps({"pid": pid, "start": process_start_time(pid)})


def oom_kills(proc_root="/proc", cgroup_root="/sys/fs/cgroup"):
    """The `oom_kill` counter of this process's memory cgroup, or None if it cannot be read: cgroup v2
    `memory.events`, or v1 `memory/.../memory.oom_control`. Where the process's cgroup path is not
    under the mount (a container sees its own cgroup as the mount's root), the mount's root is read."""
    try:
        with open(os.path.join(proc_root, "self", "cgroup")) as fh:
            lines = [line.split(":", 2) for line in fh.read().splitlines() if line.count(":") >= 2]
    except OSError:
        return None
    v1 = [path for _, controllers, path in lines if "memory" in controllers.split(",")]
    if v1:
        where, name = os.path.join(cgroup_root, "memory"), "memory.oom_control"
        paths = v1
    else:
        where, name = cgroup_root, "memory.events"
        paths = [path for number, _, path in lines if number == "0"]
    for path in paths[:1] + ["/"]:
        count = _counter(os.path.join(where, path.lstrip("/"), name), "oom_kill")
        if count is not None:
            return count
    return None


def _counter(path, key):
    try:
        with open(path) as fh:
            for line in fh:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _base_env(environ, prefixes=()):
    keep = BASE_ENV_PREFIXES + tuple(prefixes)
    return {k: v for k, v in environ.items() if k in BASE_ENV or k.startswith(keep)}


# ---- masking the command's output ------------------------------------------------------------------


class OutputMasker:
    """Masks secrets in a stream of output before it is stored: `pattern` (a regular expression,
    status.redact.Redactor's) matches every form of every secret, none longer than `longest`.
    Whole lines (ended by \\n, or \\r as a progress bar ends them) are written at once; a line
    longer than HOLD_LIMIT is written in parts that keep its last `longest - 1` characters back. So
    a secret split across two writes is still seen whole. Bytes that are not UTF-8 pass unchanged."""

    def __init__(self, pattern, longest, write):
        self.regex = re.compile(pattern)
        self.keep = max(0, int(longest) - 1)
        self.limit = max(HOLD_LIMIT, 2 * self.keep)
        self.write = write
        self.decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self.held = ""

    def feed(self, data):
        self.held += self.decoder.decode(data)
        end = max(self.held.rfind("\n"), self.held.rfind("\r")) + 1
        if end == 0 and len(self.held) > self.limit:
            end = len(self.held) - self.keep
        if end > 0:
            self._emit(end)

    def close(self):
        self.held += self.decoder.decode(b"", True)
        self._emit(len(self.held))

    def _emit(self, end):
        """Writes the held text up to `end` (or the end of a match that starts before it), masked."""
        out, at = [], 0
        for match in self.regex.finditer(self.held):
            if match.start() >= end:
                break
            out += [self.held[at:match.start()], "***"]
            at = match.end()
        end = max(end, at)
        out.append(self.held[at:end])
        self.held = self.held[end:]
        self.write("".join(out).encode("utf-8", "surrogateescape"))


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data):]


def pump_masked(source, fd, mask):
    """Copies what comes out of `source` (a pipe's file descriptor) to `fd` with `mask`
    ({"pattern", "longest"}) applied, until the pipe's end."""
    masker = OutputMasker(mask["pattern"], mask["longest"], lambda data: _write_all(fd, data))
    while True:
        data = os.read(source, 65536)
        if not data:
            break
        masker.feed(data)
    masker.close()


def start_masked(popen, mask, fd):
    """Starts a command with `popen(stdout, stderr)` (a subprocess.Popen call); with a `mask`, its
    output goes through a pipe to a thread that masks it into `fd`, else straight to `fd`. Returns
    the child and the thread (None without a mask) that `finish_masked` waits for."""
    if not mask or not mask.get("pattern"):
        return popen(fd, fd), None
    child = popen(subprocess.PIPE, subprocess.STDOUT)
    pump = threading.Thread(target=pump_masked, args=(child.stdout.fileno(), fd, mask), daemon=True)
    pump.start()
    return child, pump


def finish_masked(pump):
    """Waits (a bounded time: a process the command left may hold the pipe) until the output is stored."""
    if pump is not None:
        pump.join(DRAIN_SECONDS)


# ---- supervising the command -----------------------------------------------------------------------


def supervise(folder, payload):
    """Runs the command, forwards stop signals to its process group, records how it ended."""
    log = os.open(os.path.join(folder, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    env = _base_env(os.environ, payload.get("pass_prefixes") or ())
    env.update(payload.get("env") or {})
    env.update(payload.get("secret_env") or {})
    payload["secret_env"] = None
    deadline_in = payload.get("deadline_in")
    if deadline_in:
        deadline = int(time.time() + float(deadline_in))
        given = env.get("RECONCILER_DEADLINE", "")
        if given.isdigit():
            deadline = min(deadline, int(given))
        env["RECONCILER_DEADLINE"] = str(deadline)
    grace = float(payload.get("grace") or 30)
    stop_signal = getattr(signal, payload.get("stop_signal") or "SIGTERM")
    state = dict(child=None, stop=None, started=time.time())  # type: dict

    def signal_child(sig):
        child = state["child"]
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def on_stop(signum, _frame):
        # One stop per worker: the reconciler asks on every tick until the worker is gone, and a
        # second signal could kill a command that saved and restored its default handler on its way
        # to exit 75, or put the SIGKILL after the grace off again.
        if state["stop"] is not None:
            return
        state["stop"] = signum
        signal_child(stop_signal)
        signal.alarm(max(1, int(grace)))

    def on_alarm(_signum, _frame):
        signal_child(signal.SIGKILL)

    def on_warning(_signum, _frame):
        """Slurm's time-limit warning. One that comes while the worker is still starting (Slurm may send
        it up to a minute early) is held until the worker had WARNING_HOLD_SECONDS to set its handlers."""
        _write(os.path.join(folder, "warned"), str(int(time.time())))
        held = WARNING_HOLD_SECONDS - (time.time() - state["started"])
        if held > 0:
            timer = threading.Timer(held, signal_child, (stop_signal,))
            timer.daemon = True
            timer.start()
        else:
            signal_child(stop_signal)

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGUSR1, on_warning)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    cwd = payload.get("cwd")
    cwd = os.path.expanduser(cwd) if cwd else folder
    ooms_before = oom_kills()
    mask, payload["mask"] = payload.get("mask"), None

    def popen(stdout, stderr):
        return subprocess.Popen(payload["command"], cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=stderr, start_new_session=True)

    try:
        child, pump = start_masked(popen, mask, log)
    except OSError as exc:
        os.write(log, ("reconciler agent: cannot start {!r}: {}\n".format(payload["command"][0], exc)).encode())
        _write(
            os.path.join(folder, "exit.json"),
            json.dumps({"code": 127, "error": str(exc), "time": time.time()}),
        )
        return 127
    env.clear()  # drop our copy of the secrets
    state["child"] = child
    state["started"] = time.time()
    _write(os.path.join(folder, "child.pid"), _process_record(child.pid))
    if state["stop"] is not None:
        signal_child(stop_signal)
    code = child.wait()
    finish_masked(pump)
    signal.alarm(0)
    record = {"signal": -code} if code < 0 else {"code": code}  # type: dict
    if code == -signal.SIGKILL and ooms_before is not None:
        record["oom"] = (oom_kills() or 0) > ooms_before
    record["time"] = time.time()
    _write(os.path.join(folder, "exit.json"), json.dumps(record))
    return code if code >= 0 else 128 - code


def _create(folder, labels):
    """Creates the worker folder exclusively; False when it already exists (adopt, do not duplicate)."""
    parent = os.path.dirname(folder)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        return False
    os.chmod(folder, 0o700)
    _write(os.path.join(folder, "labels.json"), json.dumps(labels))
    return True


def cmd_launch(folder):
    """ssh: read the payload from stdin, detach a supervisor into its own session, wait until it runs."""
    payload = json.loads(sys.stdin.read())
    labels = payload["labels"]
    labels["created"] = time.time()
    if not _create(folder, labels):
        print(json.dumps({"adopted": True}))
        return 0
    first = os.fork()
    if first == 0:
        try:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            _write(os.path.join(folder, "wrapper.pid"), _process_record(os.getpid()))
            code = supervise(folder, payload)
        except BaseException:
            code = 70
        os._exit(code & 0xFF)
    payload = None
    os.waitpid(first, 0)
    for _ in range(200):
        if os.path.exists(os.path.join(folder, "child.pid")) or os.path.exists(os.path.join(folder, "exit.json")):
            break
        time.sleep(0.05)
    print(json.dumps({"adopted": False, "child": _read_json(os.path.join(folder, "child.pid"))}))
    return 0


def cmd_run(folder):
    """slurm batch step: the payload file is read and removed at once, then the command is supervised here."""
    path = os.path.join(folder, "payload.json")
    try:
        with open(path) as fh:
            payload = json.load(fh)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    _write(os.path.join(folder, "wrapper.pid"), _process_record(os.getpid()))
    return supervise(folder, payload)


def describe(folder):
    labels = _read_json(os.path.join(folder, "labels.json"))
    if not isinstance(labels, dict):
        return None
    entry = {
        "folder": os.path.basename(folder),
        "labels": labels,
        "exit": _read_json(os.path.join(folder, "exit.json")),
        "terminated": os.path.exists(os.path.join(folder, "terminated")),
        "warned": os.path.exists(os.path.join(folder, "warned")),
        "slurm_job_id": _read(os.path.join(folder, "slurm_job_id")),
    }
    wrapper = _read_json(os.path.join(folder, "wrapper.pid"))
    child = _read_json(os.path.join(folder, "child.pid"))
    entry["child_pid"] = child.get("pid") if child else None
    if entry["exit"] is not None:
        entry["state"] = "exited"
    elif wrapper is not None and _alive(wrapper):
        entry["state"] = "running" if child else "starting"
    elif wrapper is None and time.time() - float(labels.get("created") or 0) < NEVER_STARTED_SECONDS:
        entry["state"] = "starting"
    else:
        entry["state"] = "vanished"
    return entry


def cmd_list(workdir, provider, owner):
    """Our workers (this provider and owner) as `{"workers": [...], "foreign": n}`; n counts the live
    workers of other owners, which are never touched (not even cleaned up)."""
    root = os.path.join(os.path.expanduser(workdir), "workers")
    found = []
    foreign = 0
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        names = []
    now = time.time()
    for name in names:
        folder = os.path.join(root, name)
        entry = describe(folder)
        if entry is None:
            continue
        if owner != "*" and entry["labels"].get("owner") != owner:
            foreign += entry["state"] in ("starting", "running")
            continue
        if entry["labels"].get("provider") != provider:
            continue
        ended = (entry["exit"] or {}).get("time")
        if ended and now - float(ended) > KEEP_FINISHED_SECONDS:
            _remove_tree(folder)
            continue
        found.append(entry)
    print(json.dumps({"workers": found, "foreign": foreign}))
    return 0


def _remove_tree(folder):
    for name in os.listdir(folder):
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass
    try:
        os.rmdir(folder)
    except OSError:
        pass


def cmd_terminate(folder):
    """Asks the wrapper to stop the command (SIGTERM, SIGKILL after its grace); kills it directly if the
    wrapper is gone. A worker already ended is left alone."""
    if not os.path.isdir(folder):
        print(json.dumps({"found": False}))
        return 0
    _write(os.path.join(folder, "terminated"), str(int(time.time())))
    if os.path.exists(os.path.join(folder, "exit.json")):
        print(json.dumps({"found": True, "running": False}))
        return 0
    wrapper = _read_json(os.path.join(folder, "wrapper.pid"))
    child = _read_json(os.path.join(folder, "child.pid"))
    if wrapper is not None and _alive(wrapper):
        os.kill(int(wrapper["pid"]), signal.SIGTERM)
    elif child is not None and _alive(child):
        try:
            os.killpg(int(child["pid"]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    print(json.dumps({"found": True, "running": True}))
    return 0


def cmd_kill(folder):
    """No notice (a drill): SIGKILL to the command's process group at once, as a machine that vanishes;
    the wrapper records the exit. Marked as terminate's stop is, so the end reads as ours."""
    if not os.path.isdir(folder):
        print(json.dumps({"found": False}))
        return 0
    _write(os.path.join(folder, "terminated"), str(int(time.time())))
    child = _read_json(os.path.join(folder, "child.pid"))
    if child is not None and _alive(child):
        try:
            os.killpg(int(child["pid"]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    print(json.dumps({"found": True}))
    return 0


def cmd_logs(folder, tail):
    path = os.path.join(folder, "log")
    tail = max(0, int(tail))
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            block = min(size, max(65536, tail * 512))
            fh.seek(size - block)
            data = fh.read()
    except OSError:
        return 0
    lines = data.decode("utf-8", "replace").splitlines(True)
    sys.stdout.write("".join(lines[-tail:] if tail else []))
    return 0


def main(argv):
    if not argv:
        sys.stderr.write("usage: agent launch|run|list|terminate|kill|logs ...\n")
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "launch":
        return cmd_launch(args[0])
    if cmd == "run":
        return cmd_run(args[0])
    if cmd == "list":
        return cmd_list(args[0], args[1], args[2])
    if cmd == "terminate":
        return cmd_terminate(args[0])
    if cmd == "kill":
        return cmd_kill(args[0])
    if cmd == "logs":
        return cmd_logs(args[0], args[1] if len(args) > 1 else 50)
    if cmd == "version":
        print(AGENT_VERSION)
        return 0
    sys.stderr.write(f"agent: unknown command {cmd!r}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
