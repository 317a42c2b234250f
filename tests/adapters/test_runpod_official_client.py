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

import dataclasses
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
from graphql import FieldNode, NamedTypeNode, OperationDefinitionNode, parse
from graphql.utilities import value_from_ast_untyped

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


# ---- conformance: what the adapter sends and what the fake answers, against the SDK's own queries ----
#
# RunPod publishes no GraphQL schema file and the SDK has no models: its queries and mutations are the
# definitions we hold our requests and the fake's answers to. Each type's fields are the union of what
# the SDK selects on it anywhere (a Pod from `pod`, `myself { pods }` and the mutations that return
# one); each argument's input fields are those the SDK sends. What the SDK does not send is added by
# DOCUMENTED below, each with where RunPod says it.

ROOT_TYPES = {"pod": "Pod", "myself": "User", "gpuTypes": "GpuType", "podFindAndDeployOnDemand": "Pod",
              "podRentInterruptable": "Pod", "podStop": "Pod", "podResume": "Pod", "podTerminate": None}
NESTED_TYPES = {("User", "pods"): "Pod"}
SCALARS = {"String", "Int", "Float", "Boolean", "ID"}
# Input type names the SDK never writes (it pastes values inline): PodFindAndDeployOnDemandInput is the
# one RunPod's own CLI declares (runpodctl internal/api/graphql.go, CreatePod); PodRentInterruptableInput
# is its spot twin in RunPod's GraphQL reference (graphql-spec.runpod.io) [UNCONFIRMED: no client sends it].
INPUT_TYPES = {"PodFindAndDeployOnDemandInput", "PodRentInterruptableInput"}
POD_STATUSES = {"CREATED", "RUNNING", "RESTARTING", "EXITED", "PAUSED", "DEAD", "TERMINATED"}


@dataclasses.dataclass
class Field:
    kind: str | None  # the type of its value when it has fields of its own, else None (a scalar)
    inputs: set[str] = dataclasses.field(default_factory=set)  # "input.podId": argument.input field


Schema = dict[str, dict[str, Field]]


def field_kind(parent: str, name: str) -> str:
    if parent in ("Query", "Mutation"):
        return ROOT_TYPES.get(name) or f"{parent}.{name}"
    return NESTED_TYPES.get((parent, name), f"{parent}.{name}")


def arguments(node: FieldNode, variables: dict[str, Any]) -> set[str]:
    names = set()
    for arg in node.arguments or ():
        value = value_from_ast_untyped(arg.value, variables)
        names |= {f"{arg.name.value}.{key}" for key in value} if isinstance(value, dict) else {arg.name.value}
    return names


def learn(schema: Schema, kind: str, selections: Any) -> None:
    for node in (s for s in selections.selections if isinstance(s, FieldNode)):
        child = field_kind(kind, node.name.value) if node.selection_set else None
        known = schema.setdefault(kind, {}).setdefault(node.name.value, Field(child))
        known.kind = known.kind or child
        known.inputs |= arguments(node, {})
        if node.selection_set is not None and child is not None:
            learn(schema, child, node.selection_set)


def sdk_schema() -> Schema:
    """What runpod 1.12.0's queries and mutations select and send, every optional input filled in."""
    pods, gpus, user, made = (importlib.import_module(f"runpod.api.{m}") for m in
                              ("queries.pods", "queries.gpus", "queries.user", "mutations.pods"))
    every = {"gpu_type_id": GPU, "data_center_id": "EU-RO-1", "country_code": "RO", "gpu_count": 1, "volume_in_gb": 1,
             "container_disk_in_gb": 1, "min_vcpu_count": 1, "min_memory_in_gb": 1, "docker_args": "a", "ports": "p",
             "volume_mount_path": "/w", "env": {"K": "V"}, "template_id": "t", "network_volume_id": "n",
             "allowed_cuda_versions": ["12.4"], "min_download": 1, "min_upload": 1}
    texts = [pods.QUERY_POD, pods.generate_pod_query("p"), gpus.QUERY_GPU_TYPES, gpus.generate_gpu_query(GPU, 2),
             user.QUERY_USER, made.generate_pod_deployment_mutation("n", "i", **every),
             made.generate_pod_stop_mutation("p"), made.generate_pod_resume_mutation("p", 1),
             made.generate_pod_terminate_mutation("p")]
    schema: Schema = {}
    for text in texts:
        for op in (d for d in parse(text).definitions if isinstance(d, OperationDefinitionNode)):
            learn(schema, op.operation.value.title(), op.selection_set)
    documented(schema)
    return schema


def documented(schema: Schema) -> None:
    """What RunPod documents beyond the SDK's queries."""
    # RunPod's own CLI reads the balance here (runpodctl internal/api/gpu.go, GetUser: myself { clientBalance }).
    schema["User"]["clientBalance"] = Field(None)
    # Spot pods: RunPod's GraphQL guide (docs.runpod.io sdks/graphql/manage-pods, "Create spot Pod") sends
    # the on-demand input plus bidPerGpu and reads a Pod back. Its spot sections were removed from the
    # docs on 2026-05-06 (runpod/docs 8e5aebdb, "API schema fields ... are retained").
    on_demand = schema["Mutation"]["podFindAndDeployOnDemand"]
    schema["Mutation"]["podRentInterruptable"] = Field("Pod", on_demand.inputs | {"input.bidPerGpu"})


def check_request(schema: Schema, query: str, variables: dict[str, Any]) -> OperationDefinitionNode:
    """Every field the request selects, every argument and input field it sends, and every variable
    type it declares are the SDK's (or DOCUMENTED)."""
    op = next(d for d in parse(query).definitions if isinstance(d, OperationDefinitionNode))
    for var in op.variable_definitions or ():
        named = var.type
        while not isinstance(named, NamedTypeNode):
            named = named.type
        assert named.name.value in SCALARS | INPUT_TYPES, f"${var.variable.name.value}: {named.name.value} is unknown"

    def walk(kind: str, selections: Any) -> None:
        for node in (s for s in selections.selections if isinstance(s, FieldNode)):
            known = schema.get(kind, {}).get(node.name.value)
            assert known is not None, f"{kind}.{node.name.value} is not selected by the runpod SDK: {query}"
            extra = arguments(node, variables) - known.inputs
            assert not extra, f"{kind}.{node.name.value}: {sorted(extra)} are not sent by the runpod SDK"
            assert (node.selection_set is None) == (known.kind is None), f"{kind}.{node.name.value}: wrong shape"
            if node.selection_set is not None and known.kind is not None:
                walk(known.kind, node.selection_set)

    walk(op.operation.value.title(), op.selection_set)
    return op


def leaf(kind: str, name: str, value: Any) -> None:
    """The types of the values the adapter reads; any other leaf is a scalar or a list of them."""
    numbers = {("Pod", "costPerHr"), ("User", "clientBalance"), ("GpuType.lowestPrice", "minimumBidPrice"),
               ("GpuType.lowestPrice", "uninterruptablePrice")}
    where = f"{kind}.{name} = {value!r}"
    if (kind, name) in numbers:
        assert value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)), where
    elif (kind, name) in {("Pod", "uptimeSeconds"), ("Pod", "gpuCount")}:
        assert isinstance(value, int) and not isinstance(value, bool), where
    elif (kind, name) == ("Pod", "env"):
        assert isinstance(value, list) and all(isinstance(e, str) and "=" in e for e in value), where
    elif (kind, name) == ("Pod", "desiredStatus"):
        assert value in POD_STATUSES, where
    else:
        items = value if isinstance(value, list) else [value]
        assert all(v is None or isinstance(v, (str, int, float, bool)) for v in items), where


def check_answer(schema: Schema, kind: str, selections: Any, data: Any) -> None:
    """The answer has every field the request selected and no other (a missing or an unknown one fails)."""
    if data is None:
        return
    if isinstance(data, list):
        for item in data:
            check_answer(schema, kind, selections, item)
        return
    nodes = [s for s in selections.selections if isinstance(s, FieldNode)]
    assert isinstance(data, dict), f"{kind}: {data!r} is not an object"
    assert set(data) == {(n.alias or n.name).value for n in nodes}, f"{kind}: {sorted(data)} is not what was asked"
    for node in nodes:
        value, known = data[(node.alias or node.name).value], schema[kind][node.name.value]
        if node.selection_set is None or known.kind is None:
            leaf(kind, node.name.value, value)
        else:
            check_answer(schema, known.kind, node.selection_set, value)


def test_the_check_is_strict(sdk: Any) -> None:
    schema = sdk_schema()
    with pytest.raises(AssertionError, match="not selected by the runpod SDK"):
        check_request(schema, "query { myself { pods { id exitCode } } }", {})
    with pytest.raises(AssertionError, match="not sent by the runpod SDK"):
        check_request(schema, "mutation M($i: PodRentInterruptableInput!) { podRentInterruptable(input: $i) { id } }",
                      {"i": {"name": "n", "bidPerGPU": 0.2}})
    op = check_request(schema, "query { pod(input: {podId: \"p\"}) { id desiredStatus } }", {})
    with pytest.raises(AssertionError, match="is not what was asked"):
        check_answer(schema, "Pod", op.selection_set.selections[0].selection_set, {"id": "p"})
    with pytest.raises(AssertionError, match="desiredStatus"):
        check_answer(schema, "Pod", op.selection_set.selections[0].selection_set, {"id": "p", "desiredStatus": "Gone"})


@pytest.mark.parametrize("interruptible", [True, False])
def test_every_request_of_the_adapter_and_its_pods_and_every_answer_of_the_fake_keep_to_the_sdk(
        fake: FakeRunpod, sdk: Any, interruptible: bool) -> None:
    """A pod's life through the adapter (launch, observe, the bootstrap's own podStop with the pod's
    key, release, terminate, balance, doctor's checks): each request against the SDK's queries, each
    answer against what that request selected."""
    schema = sdk_schema()
    adapter = RunpodAdapter("runpod", RunpodSettings(api_url=fake.url, interruptible=interruptible), owner="repo-a")
    done = adapter.launch(LaunchSpec(job="ends", run_id="r1", epoch=1, command=[sys.executable, "-c", "print(1)"]))
    wait_for(lambda: fake.pods[done.id].status == "EXITED")  # stopped by its own bootstrap
    wait_for(lambda: (s := adapter.observe().get(done)) and s.phase not in (WorkerPhase.PENDING, WorkerPhase.RUNNING))
    sleeper = adapter.launch(LaunchSpec(job="sleeps", run_id="r1", epoch=1,
                                        command=[sys.executable, "-c", "import time; time.sleep(30)"]))
    wait_for(lambda: (s := adapter.observe().get(sleeper)) and s.phase is WorkerPhase.RUNNING)
    adapter.terminate(sleeper)
    adapter.allowance()
    adapter.preflight([LaunchSpec(job="ends", run_id="r1", epoch=2, command=["true"])])
    roots = set()
    for query, variables, data in fake.exchanges:
        op = check_request(schema, query, variables)
        check_answer(schema, op.operation.value.title(), op.selection_set, data)
        roots |= set(data)
    assert roots >= {"myself", "podStop", "podTerminate", "gpuTypes",
                     "podRentInterruptable" if interruptible else "podFindAndDeployOnDemand"}
