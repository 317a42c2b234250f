"""The parts every hosted provider shares: the HTTP convention (adapters/http.py) and the generated
bootstrap that carries the worker SDK (adapters/hosted.py). Run for real: the bootstrap is executed
by a real Python in a clean environment; the HTTP rules are checked against httpx's MockTransport
(our own boundary), the providers' fake servers check them over real sockets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from adapters.compute import JobConfigError, LaunchSpec, ProviderConfigError, ProviderUnavailable
from adapters.hosted import (
    ARG_LIMIT,
    EXIT_MARK,
    SDK_FILES,
    SECRETS_FROM_ENV,
    STORAGE_UNREACHABLE,
    Bootstrap,
    LaunchTooLarge,
    bootstrap_script,
    packed,
    parse_exit_record,
    sdk_bundle,
    unpack_bundle,
)
from adapters.http import HostedApi, HttpRefused, retry_after_seconds
from adapters.storage import RunFolder

# ---- the HTTP convention --------------------------------------------------------------------------


def api(handler, **kw) -> tuple[HostedApi, list[float]]:
    slept: list[float] = []
    return HostedApi("test provider 'p'", "http://provider.test", headers={"Authorization": "Bearer tok-123"},
                     credentials_hint="credentials are read from $TEST_TOKEN", transport=httpx.MockTransport(handler),
                     sleep=slept.append, **kw), slept


def test_429_is_retried_after_the_servers_retry_after() -> None:
    answers = iter([httpx.Response(429, headers={"Retry-After": "2"}), httpx.Response(200, json={"ok": 1})])
    client, slept = api(lambda request: next(answers))
    assert client.call("GET", "/x") == {"ok": 1}
    assert slept == [2.0]


def test_a_retry_after_longer_than_the_limit_gives_up_at_once_as_unavailable() -> None:
    client, slept = api(lambda request: httpx.Response(429, headers={"Retry-After": "3600"}), max_wait=30)
    with pytest.raises(ProviderUnavailable, match="test provider 'p' is unavailable.*wait 3600 s"):
        client.call("GET", "/x")
    assert slept == []


def test_5xx_is_unavailable_after_the_retries() -> None:
    calls = []
    client, slept = api(lambda request: calls.append(1) or httpx.Response(503), retries=2)
    with pytest.raises(ProviderUnavailable, match="HTTP 503"):
        client.call("GET", "/x")
    assert len(calls) == 3 and len(slept) == 2


def test_a_request_that_acts_is_not_repeated_after_a_5xx_or_a_timeout() -> None:
    calls = []

    def boom(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ReadTimeout("slow", request=request)

    client, _ = api(boom)
    with pytest.raises(ProviderUnavailable, match="may have acted"):
        client.call("POST", "/launch", json_body={}, acts=True)
    assert len(calls) == 1
    client, _ = api(lambda request: calls.append(1) or httpx.Response(502))
    with pytest.raises(ProviderUnavailable):
        client.call("POST", "/launch", json_body={}, acts=True)
    assert len(calls) == 2


def test_refused_credentials_name_the_provider_and_where_they_are_read_and_never_the_token() -> None:
    client, _ = api(lambda request: httpx.Response(401, json={"message": "bad token"}))
    with pytest.raises(ProviderConfigError) as err:
        client.call("GET", "/x")
    text = str(err.value)
    assert "test provider 'p'" in text and "$TEST_TOKEN" in text and "tok-123" not in text


def test_garbage_json_is_unavailable_in_one_sentence() -> None:
    client, _ = api(lambda request: httpx.Response(200, text="<html>gateway</html>"))
    with pytest.raises(ProviderUnavailable, match="not JSON"):
        client.call("GET", "/x")


def test_other_4xx_carry_status_and_the_providers_message() -> None:
    client, _ = api(lambda request: httpx.Response(404, json={"message": "no such job"}))
    with pytest.raises(HttpRefused) as err:
        client.call("GET", "/x")
    assert err.value.status == 404 and err.value.detail == "no such job"
    assert client.call("GET", "/x", allow=(404,)) is None


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("7") == 7.0
    in_ten = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 10))
    assert 9 <= (retry_after_seconds(in_ten) or 0) <= 10
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


# ---- the bootstrap --------------------------------------------------------------------------------

PRINT_ENV = "import json, os, sys; print('ENV ' + json.dumps(dict(os.environ))); sys.exit(int(sys.argv[1]))"


def spec(tmp_path: Path, *args: str, deadline: float | None = None, uri: str | None = None) -> LaunchSpec:
    env = {"PLAIN": "a value"}
    if uri:
        env.update({"RECONCILER_RUN_URI": uri, "RECONCILER_EPOCH": "2"})
    return LaunchSpec(job="train", run_id="r-1", epoch=2, command=[sys.executable, "-c", PRINT_ENV, *args],
                      env=env, secret_env={"TOKEN": "never-in-the-script"}, deadline=deadline)


def run_script(tmp_path: Path, text: str, **env: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "boot.py"
    path.write_text(text)
    clean = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env}
    return subprocess.run([sys.executable, str(path)], env=clean, capture_output=True, text=True, timeout=120)


def test_bootstrap_runs_the_command_with_minimal_env_secrets_and_sdk_and_reports_the_exit(tmp_path: Path) -> None:
    the_spec = spec(tmp_path, "3")
    text = bootstrap_script(the_spec, {"job": "train"}, Bootstrap("test", SECRETS_FROM_ENV))
    assert "never-in-the-script" not in text and '"TOKEN"' in text
    done = run_script(tmp_path, text, TOKEN="from-the-provider", PROVIDER_PRIVATE="x")
    assert done.returncode == 3, done.stdout + done.stderr
    env = json.loads(next(line[4:] for line in done.stdout.splitlines() if line.startswith("ENV ")))
    assert env["TOKEN"] == "***" and env["PLAIN"] == "a value"  # it got the value, masked in its output
    assert "PROVIDER_PRIVATE" not in env
    assert parse_exit_record(done.stdout) == {"code": 3}


def test_bootstrap_masks_the_secret_values_in_the_output_it_forwards_and_copies(tmp_path: Path) -> None:
    """The provider's log and the run folder's tail reach the status, and the reconciler may not know
    these values (they live in the provider's secret store): the bootstrap masks them itself."""
    folder = RunFolder(f"file://{tmp_path}/runs/train/r-1")
    folder.bump_lease()
    code = "import base64, os; t = os.environ['TOKEN']; print('token', t, base64.b64encode(t.encode()).decode())"
    leak = LaunchSpec(job="train", run_id="r-1", epoch=2, command=[sys.executable, "-c", code],
                      env={"RECONCILER_RUN_URI": folder.uri, "RECONCILER_EPOCH": "2"}, secret_env={"TOKEN": ""})
    script = bootstrap_script(leak, {}, Bootstrap("test", SECRETS_FROM_ENV))
    done = run_script(tmp_path, script, TOKEN="tok-from-provider")
    assert "token *** ***" in done.stdout and "tok-from-provider" not in done.stdout
    assert "token *** ***" in folder.attempt_log(2) and "tok-from-provider" not in folder.attempt_log(2)


def test_bootstrap_masks_every_encoding_of_a_secret_with_characters_encodings_change(tmp_path: Path) -> None:
    """Lowercase %-encoding, HTML escapes and JSON \\u escapes are masked as the reconciler masks them."""
    code = ("import html, json, os, urllib.parse as u; t = os.environ['TOKEN']; "
            "print('url', u.quote(t, safe='').lower()); print('html', html.escape(t)); print('json', json.dumps(t))")
    leak = LaunchSpec(job="train", run_id="r-1", epoch=2, command=[sys.executable, "-c", code],
                      env={}, secret_env={"TOKEN": ""})
    done = run_script(tmp_path, bootstrap_script(leak, {}, Bootstrap("test", SECRETS_FROM_ENV)),
                      TOKEN="tok/fr+m=&<>\"'é")
    assert "url ***\nhtml ***\njson \"***\"\n" in done.stdout, done.stdout + done.stderr


def test_bootstrap_reports_a_signal_death(tmp_path: Path) -> None:
    crash = LaunchSpec(job="j", run_id="r", epoch=1, command=[sys.executable, "-c", "import os; os.abort()"])
    done = run_script(tmp_path, bootstrap_script(crash, {}, Bootstrap("test", SECRETS_FROM_ENV)))
    assert parse_exit_record(done.stdout) == {"code": -6, "signal": "SIGABRT"}


def test_bootstrap_deadline_is_the_earlier_of_the_job_and_the_session(tmp_path: Path) -> None:
    far = time.time() + 10 * 3600
    boot = Bootstrap("test", SECRETS_FROM_ENV, session_seconds=3600, save_margin_seconds=600)
    done = run_script(tmp_path, bootstrap_script(spec(tmp_path, "0", deadline=far), {}, boot), TOKEN="t")
    env = json.loads(next(line[4:] for line in done.stdout.splitlines() if line.startswith("ENV ")))
    assert abs(int(env["RECONCILER_DEADLINE"]) - (time.time() + 3000)) < 60
    near = time.time() + 1200
    done = run_script(tmp_path, bootstrap_script(spec(tmp_path, "0", deadline=near), {}, boot), TOKEN="t")
    env = json.loads(next(line[4:] for line in done.stdout.splitlines() if line.startswith("ENV ")))
    assert env["RECONCILER_DEADLINE"] == str(int(near))


def test_bootstrap_fails_once_with_the_reason_when_storage_cannot_be_reached(tmp_path: Path) -> None:
    folder = RunFolder(f"file://{tmp_path}/runs/train/r-1")
    folder.bump_lease()
    ok = run_script(tmp_path, bootstrap_script(spec(tmp_path, "0", uri=folder.uri), {},
                                               Bootstrap("test", SECRETS_FROM_ENV)), TOKEN="t")
    assert parse_exit_record(ok.stdout) == {"code": 0}, ok.stdout + ok.stderr
    assert "ENV " in folder.attempt_log(2)  # the output's tail, for providers without a log API
    bad = "s3://no-such-bucket/runs/train/r-1"
    done = run_script(tmp_path, bootstrap_script(spec(tmp_path, "0", uri=bad), {}, Bootstrap("test", SECRETS_FROM_ENV)),
                      TOKEN="t", AWS_ENDPOINT_URL_S3="http://127.0.0.1:9", AWS_ACCESS_KEY_ID="a",
                      AWS_SECRET_ACCESS_KEY="b")
    record = parse_exit_record(done.stdout)
    assert record is not None and record["code"] == STORAGE_UNREACHABLE, done.stdout + done.stderr
    assert "cannot reach run storage " + bad in record["reason"]
    assert "ENV " not in done.stdout  # the command never ran


def test_the_sdk_bundle_alone_imports_the_worker_sdk_and_exec(tmp_path: Path) -> None:
    """SDK_FILES is complete: with only the bundle on the path, the worker modules import from it."""
    unpack_bundle(sdk_bundle(), str(tmp_path / "sdk"))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import reconciler.worker, reconciler.execwrap; "
            "mods = [m for m in sys.modules.values() if (m.__name__.split('.')[0] in "
            "('reconciler', 'adapters', 'status', 'desired')) and getattr(m, '__file__', None)]; "
            "bad = [m.__name__ for m in mods if not m.__file__.startswith(sys.argv[1])]; print(bad); "
            "sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "sdk")], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(SDK_FILES) == sorted(set(SDK_FILES))
    # Every module of the worker package travels, the optional trainer integrations too (a worker on a
    # hosted provider may import them; they import their trainer only when used).
    root = Path(__file__).resolve().parents[2]
    worker = {str(p.relative_to(root)) for p in (root / "reconciler" / "worker").rglob("*.py")}
    assert worker <= set(SDK_FILES), f"not in the bundle: {sorted(worker - set(SDK_FILES))}"


def test_exit_record_is_the_last_one_and_garbage_is_none() -> None:
    log = f"x\n{EXIT_MARK}{{\"code\": 1}}\nmore\n{EXIT_MARK}{{\"code\": 75}}\n"
    assert parse_exit_record(log) == {"code": 75}
    assert parse_exit_record(f"{EXIT_MARK}not json") is None and parse_exit_record("") is None


def test_every_packed_launch_fits_one_argument_with_room_to_grow(tmp_path: Path) -> None:
    """Vast.ai, RunPod and Lightning AI start the worker with `sh -c <the packed bootstrap>`: one
    argument, which Linux caps at 128 KiB. The SDK bundle grows with the SDK; this fails while there
    is still a quarter of the limit left, so the next module added says so here and not on a rented
    machine as "Argument list too long"."""
    from adapters.lightning import shell_command
    from adapters.runpod import start_command
    from adapters.vast import onstart_script

    text = bootstrap_script(spec(tmp_path), {"job": "train"}, Bootstrap("test", SECRETS_FROM_ENV))
    for launch in (onstart_script(text), start_command(text), shell_command(text)):
        assert len(launch.encode()) < 0.75 * ARG_LIMIT, len(launch)
    unpack_only = onstart_script(text).replace("exec python3 -u bootstrap.py", "wc -c bootstrap.py")
    done = subprocess.run(["sh", "-c", unpack_only], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and int(done.stdout.split()[0]) == len(text.encode()), done.stderr


def test_a_bootstrap_too_big_for_one_argument_is_the_jobs_config_error_in_one_sentence(tmp_path: Path) -> None:
    huge = spec(tmp_path)
    huge.env["NOISE"] = os.urandom(120 * 1024).hex()  # incompressible
    with pytest.raises(LaunchTooLarge, match="over the 131072-byte limit of one command-line argument"):
        packed(bootstrap_script(huge, {"job": "train"}, Bootstrap("test", SECRETS_FROM_ENV)))
    assert issubclass(LaunchTooLarge, JobConfigError)


def test_the_bundle_carries_each_module_line_for_line_without_comments_or_docstrings(tmp_path: Path) -> None:
    """A worker's traceback names the repository's line numbers: slimming keeps every line in place."""
    import ast
    import io
    import tokenize

    from adapters.hosted import package_root
    from adapters.slim import slim

    unpack_bundle(sdk_bundle(), str(tmp_path / "sdk"))
    for name in SDK_FILES:
        source = (package_root() / name).read_text(encoding="utf-8")
        carried = (tmp_path / "sdk" / name).read_text(encoding="utf-8")
        assert carried == slim(source) and carried.count("\n") == source.count("\n"), name
        tokens = tokenize.generate_tokens(io.StringIO(carried).readline)
        assert not [t for t in tokens if t.type == tokenize.COMMENT], name
        for a, b in zip(ast.walk(ast.parse(source)), ast.walk(ast.parse(carried)), strict=True):
            assert type(a) is type(b) and getattr(a, "lineno", None) == getattr(b, "lineno", None), name
