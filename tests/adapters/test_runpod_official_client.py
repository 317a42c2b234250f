"""The fake RunPod server driven by RunPod's own Python SDK (`runpod` 1.12.0), pointed at it with
RUNPOD_API_BASE_URL: its queries and mutations (get_pods, get_pod, get_gpu, get_user, create_pod,
terminate_pod) parse and resolve on the fake exactly as they are written in the SDK, so the fake
speaks the API the SDK speaks. And the reason the adapter does not use the SDK: it pastes values
into the query text unescaped, so a quote in an env value breaks the request or rewrites it, while
the adapter's GraphQL variables carry the same value verbatim.

The SDK is installed without its dependencies (`pip install --no-deps runpod==1.12.0`; its
package `__init__` imports the serverless worker, paramiko, fastapi...): the test loads only
`runpod.api` (which needs `requests`), under a bare `runpod` package module.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.compute import LaunchSpec, WorkerPhase
from adapters.runpod import LABELS_VAR, RunpodAdapter, env_map
from desired.models import RunpodSettings
from tests.fakes.runpod import API_KEY, FakeRunpod

GPU = "NVIDIA GeForce RTX 4090"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunpod]:
    server = FakeRunpod(tmp_path / "machines", kill_grace=1.0)
    monkeypatch.setenv("RUNPOD_API_KEY", API_KEY)
    monkeypatch.setenv("RUNPOD_API_BASE_URL", server.url)
    yield server
    server.close()


@pytest.fixture
def sdk(monkeypatch: pytest.MonkeyPatch) -> Any:
    """runpod.api.ctl_commands, loaded under a bare `runpod` package (its __init__ is not run)."""
    found = importlib.util.find_spec("runpod")
    if found is None or not found.submodule_search_locations:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true but runpod==1.12.0 is not installed (scripts/install-dev.sh installs it)")
        pytest.skip("the runpod SDK is not installed (pip install --no-deps runpod==1.12.0)")
    package = types.ModuleType("runpod")
    package.__path__ = list(found.submodule_search_locations)
    package.api_key = API_KEY  # type: ignore[attr-defined]
    for name in [m for m in sys.modules if m == "runpod" or m.startswith("runpod.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "runpod", package)
    return importlib.import_module("runpod.api.ctl_commands")


def wait_for(check: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_sdk_get_gpu_and_get_user_read_the_fake(fake: FakeRunpod, sdk: Any) -> None:
    gpu = sdk.get_gpu(GPU, 2)
    assert gpu["id"] == GPU and gpu["lowestPrice"]["minimumBidPrice"] == 0.35
    assert gpu["lowestPrice"]["uninterruptablePrice"] == 0.69
    assert {g["id"] for g in sdk.get_gpus()} >= {GPU}
    user = sdk.get_user()
    assert user["id"] and user["networkVolumes"] == []


def test_sdk_sees_the_adapter_s_pod_with_its_labels_and_can_terminate_it(
        fake: FakeRunpod, sdk: Any, tmp_path: Path) -> None:
    adapter = RunpodAdapter("runpod", RunpodSettings(api_url=fake.url), owner="repo-a")
    spec = LaunchSpec(job="j1", run_id="r1", epoch=2, command=[sys.executable, "-c", "import time; time.sleep(30)"])
    ref = adapter.launch(spec)
    wait_for(lambda: sdk.get_pod(ref.id)["desiredStatus"] == "RUNNING")
    pods = sdk.get_pods()
    assert [p["name"] for p in pods] == ["rc-repo-a-j1-r1-e2"]
    assert env_map(pods[0]["env"])[LABELS_VAR] == "repo-a/j1/r1/e2"
    assert pods[0]["costPerHr"] == 0.35 and pods[0]["machine"]["gpuDisplayName"] == "RTX 4090"
    sdk.terminate_pod(ref.id)
    state = wait_for(lambda: (s := adapter.observe().get(ref)) and s.phase is not WorkerPhase.RUNNING and s)
    assert state.phase is WorkerPhase.PREEMPTED


def test_sdk_create_pod_on_demand_runs_its_docker_args_restarts_them_and_stop_pod_ends_it(
        fake: FakeRunpod, sdk: Any, tmp_path: Path) -> None:
    out = tmp_path / "hello"
    pod = sdk.create_pod("sdk-pod", "runpod/base", GPU, cloud_type="SECURE",
                         docker_args=f"sh -c 'echo $GREETING > {out}'", env={"GREETING": "hello there"})
    assert pod["id"] and pod["imageName"] == "runpod/base"
    assert wait_for(lambda: out.exists() and out.read_text()) == "hello there\n"
    assert wait_for(lambda: fake.pods[pod["id"]].restarts >= 1)  # its command ended: RunPod restarts it
    assert sdk.get_pod(pod["id"])["desiredStatus"] in ("RUNNING", "RESTARTING")
    assert sdk.stop_pod(pod["id"])["id"] == pod["id"]  # only a stop ends it
    assert wait_for(lambda: sdk.get_pod(pod["id"])["desiredStatus"] == "EXITED")
    assert not fake.pods[pod["id"]].spot


def test_sdk_pastes_a_quote_unescaped_and_breaks_while_the_adapter_s_variables_carry_it(
        fake: FakeRunpod, sdk: Any, tmp_path: Path) -> None:
    from runpod.error import QueryError

    hostile = 'say "hi"'
    with pytest.raises(QueryError):
        sdk.create_pod("sdk-broken", "runpod/base", GPU, docker_args="true", env={"X": hostile})
    # ...and a crafted value rewrites the SDK's request: one env value becomes two variables
    injected = 'a" }, { key: "INJECTED", value: "yes'
    pod = sdk.create_pod("sdk-injected", "runpod/base", GPU, docker_args="true", env={"X": injected})
    assert env_map(fake.pods[pod["id"]].input["env"])["INJECTED"] == "yes"
    adapter = RunpodAdapter("runpod", RunpodSettings(api_url=fake.url), owner="repo-a")
    out = tmp_path / "env.json"
    show = f"import json, os; open({str(out)!r}, 'w').write(json.dumps([os.environ['X'], os.environ['Y']]))"
    spec = LaunchSpec(job="j2", run_id="r1", epoch=1, command=[sys.executable, "-c", show],
                      env={"X": injected, "Y": hostile})
    adapter.launch(spec)
    assert json.loads(wait_for(lambda: out.exists() and out.read_text())) == [injected, hostile]


def test_sdk_with_a_wrong_key_gets_runpod_s_401(fake: FakeRunpod, sdk: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from runpod.error import AuthenticationError

    monkeypatch.setattr(sys.modules["runpod"], "api_key", "wrong")
    with pytest.raises(AuthenticationError):
        sdk.get_pods()
