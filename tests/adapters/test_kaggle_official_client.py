"""The fake Kaggle API driven by Kaggle's official client, kagglesdk, so the fake and the adapter
are held to the wire format Kaggle's own code speaks, not to our reading of it.

How kagglesdk is pointed at the fake: `KaggleClient(env=KaggleEnv.TEST)` builds URLs as
`{endpoint}/api/v1/{Service}/{Method}` with the endpoint fixed at http://localhost:7777; the
endpoint is a plain attribute of its HTTP client (`_endpoint`), set here to the fake's address,
and the fake accepts the `/api` prefix. Nothing else of kagglesdk is changed: requests are built
by its own request types (`to_dict`, defaults left out), answers parsed by its response types
(`prepare_from`), and errors judged by its own `_prepare_response`.
"""

from __future__ import annotations

import enum
import json
import re
import sys
import time
import typing
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.fakes import official_client

kagglesdk = official_client("kagglesdk", "kagglesdk")

from kagglesdk import KaggleClient  # noqa: E402
from kagglesdk.kaggle_env import KaggleEnv  # noqa: E402
from kagglesdk.kaggle_object import (  # noqa: E402
    DateTimeSerializer,
    KaggleObject,
    ListSerializer,
    MapSerializer,
)
from kagglesdk.kernels.services.kernels_api_service import KernelsApiClient  # noqa: E402
from kagglesdk.kernels.types.kernels_api_service import (  # noqa: E402
    ApiGetAcceleratorQuotaStatisticsRequest,
    ApiGetAcceleratorQuotaStatisticsResponse,
    ApiGetKernelRequest,
    ApiGetKernelSessionStatusRequest,
    ApiGetKernelSessionStatusResponse,
    ApiListKernelSessionOutputRequest,
    ApiListKernelsRequest,
    ApiSaveKernelRequest,
)
from kagglesdk.kernels.types.kernels_enums import (  # noqa: E402
    KernelsListSortType,
    KernelsListViewType,
    KernelWorkerStatus,
)
from kagglesdk.security.services.oauth_service import OAuthClient  # noqa: E402
from kagglesdk.security.types.oauth_service import IntrospectTokenRequest  # noqa: E402

from adapters.compute import LaunchSpec  # noqa: E402
from adapters.kaggle import KaggleAdapter  # noqa: E402
from desired.models import KaggleSettings  # noqa: E402
from tests.adapters.test_contract import ended, wait_state  # noqa: E402
from tests.fakes.kaggle import FakeKaggle  # noqa: E402

SCRIPT = "print('hello from a kernel')\n"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeKaggle]:
    server = FakeKaggle(tmp_path / "kaggle").start()
    yield server
    server.stop()


def client_for(fake: FakeKaggle, token: str | None = None) -> KaggleClient:
    client = KaggleClient(env=KaggleEnv.TEST, api_token=token or fake.token)
    client.http_client()._endpoint = fake.url  # TEST's endpoint is localhost:7777; ours is a free port
    return client


def push(client: KaggleClient, slug: str, *, text: str = SCRIPT, shape: str | None = None,  # type: ignore[no-untyped-def]
         title: str | None = "same"):
    request = ApiSaveKernelRequest()
    request.slug = f"fakeuser/{slug}"
    request.new_title = slug if title == "same" else title
    request.text = text
    request.language = "python"
    request.kernel_type = "script"
    request.is_private = True
    request.enable_internet = False
    request.session_timeout_seconds = 3600
    if shape:
        request.machine_shape = shape
    return client.kernels.kernels_api_client.save_kernel(request)


def status(client: KaggleClient, slug: str):  # type: ignore[no-untyped-def]
    request = ApiGetKernelSessionStatusRequest()
    request.user_name, request.kernel_slug = "fakeuser", slug
    return client.kernels.kernels_api_client.get_kernel_session_status(request)


def test_save_kernel_answers_a_save_kernel_response_and_runs_the_text(fake: FakeKaggle) -> None:
    answer = push(client_for(fake), "rc-hello-kernel")
    assert not answer.error and answer.version_number == 1 and answer.ref == "/code/fakeuser/rc-hello-kernel"
    kernel = fake.kernels["rc-hello-kernel"]
    assert kernel.request["enableInternet"] is False and kernel.request["isPrivate"] is True
    assert kernel.request["sessionTimeoutSeconds"] == 3600 and "machineShape" not in kernel.request


def test_a_push_error_reaches_the_official_client_as_the_error_field(fake: FakeKaggle) -> None:
    fake.max_gpu_sessions = 2
    client = client_for(fake)
    for n in range(2):
        assert push(client, f"rc-gpu-{n}", text="import time; time.sleep(30)", shape="NvidiaTeslaT4").error == ""
    answer = push(client, "rc-gpu-2", shape="NvidiaTeslaT4")
    assert answer.error == "Maximum batch GPU session count of 2 reached"


def test_status_reads_as_kernel_worker_status_queued_when_left_out_then_complete(fake: FakeKaggle) -> None:
    fake.queue_delay = 2
    client = client_for(fake)
    push(client, "rc-status-kernel")
    queued = status(client, "rc-status-kernel")
    assert queued.status is KernelWorkerStatus.QUEUED and not queued.failure_message
    deadline = time.monotonic() + 30
    while status(client, "rc-status-kernel").status is not KernelWorkerStatus.COMPLETE:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_a_failed_kernel_reads_as_error_with_its_failure_message(fake: FakeKaggle) -> None:
    client = client_for(fake)
    push(client, "rc-failing-kernel", text="import sys; sys.exit(3)")
    deadline = time.monotonic() + 30
    while (answer := status(client, "rc-failing-kernel")).status is not KernelWorkerStatus.ERROR:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert "exited with code 3" in (answer.failure_message or "")


def test_session_output_carries_the_log_as_kaggles_json_lines(fake: FakeKaggle) -> None:
    client = client_for(fake)
    push(client, "rc-logging-kernel")
    deadline = time.monotonic() + 30
    while status(client, "rc-logging-kernel").status is not KernelWorkerStatus.COMPLETE:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    request = ApiListKernelSessionOutputRequest()
    request.user_name, request.kernel_slug = "fakeuser", "rc-logging-kernel"
    output = client.kernels.kernels_api_client.list_kernel_session_output(request)
    entries = json.loads(output.log)
    assert entries[0]["data"] == "hello from a kernel\n" and entries[0]["stream_name"] == "stdout"
    assert output.files == []


def test_session_output_pages_the_files_and_carries_the_log_whole_on_the_first_page(fake: FakeKaggle) -> None:
    """The page token of ListKernelSessionOutput pages the output files; the log is one field of the
    first page (kaggle-cli's `kernels output` follows the token for files and keeps the first page's
    log; its `kernels logs` reads one page)."""
    client = client_for(fake)
    push(client, "rc-paged-output", text="for i in range(5):\n    open(f'out-{i}.txt', 'w').write(str(i))\n"
                                          "print('five files written')\n")
    deadline = time.monotonic() + 30
    while status(client, "rc-paged-output").status is not KernelWorkerStatus.COMPLETE:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    pages, token = [], None
    while True:
        request = ApiListKernelSessionOutputRequest()
        request.user_name, request.kernel_slug, request.page_size = "fakeuser", "rc-paged-output", 2
        if token:
            request.page_token = token
        pages.append(client.kernels.kernels_api_client.list_kernel_session_output(request))
        token = pages[-1].next_page_token
        if not token:
            break
    assert [[f.file_name for f in page.files] for page in pages] == [
        ["out-0.txt", "out-1.txt"], ["out-2.txt", "out-3.txt"], ["out-4.txt"]]
    assert json.loads(pages[0].log)[0]["data"] == "five files written\n"
    assert [page.log for page in pages[1:]] == ["", ""]


def test_quota_statistics_parse_into_durations_and_a_refresh_time(fake: FakeKaggle) -> None:
    fake.set_quota(30, 12.5)
    request = ApiGetAcceleratorQuotaStatisticsRequest()
    answer = client_for(fake).kernels.kernels_api_client.get_accelerator_quota_statistics(request)
    assert answer.gpu_quota.total_time_allowed == timedelta(hours=30)
    assert answer.gpu_quota.time_used == timedelta(hours=12.5)
    assert isinstance(answer.quota_refresh_time, datetime)
    refresh = answer.quota_refresh_time.replace(tzinfo=UTC)  # kagglesdk parses "...Z" into a naive datetime
    assert abs(refresh.timestamp() - fake.quota_refresh_at) < 1


def test_list_and_get_kernel_as_the_cli_asks_for_mine(fake: FakeKaggle) -> None:
    client = client_for(fake)
    push(client, "rc-listed-kernel")
    request = ApiListKernelsRequest()
    request.group = KernelsListViewType.PROFILE
    request.sort_by = KernelsListSortType.DATE_RUN
    request.page_size = 20
    listing = client.kernels.kernels_api_client.list_kernels(request)
    assert [k.ref for k in listing.kernels] == ["fakeuser/rc-listed-kernel"] and listing.next_page_token == ""
    get = ApiGetKernelRequest()
    get.user_name, get.kernel_slug = "fakeuser", "rc-listed-kernel"
    assert client.kernels.kernels_api_client.get_kernel(get).blob.source == SCRIPT


def test_introspection_names_the_tokens_user(fake: FakeKaggle) -> None:
    request = IntrospectTokenRequest()
    request.token = fake.token
    answer = client_for(fake).security.oauth_client.introspect_token(request)
    assert answer.active is True and answer.username == "fakeuser"


def test_wrong_credentials_and_unknown_kernels_raise_in_the_official_client(fake: FakeKaggle) -> None:
    with pytest.raises(requests.exceptions.HTTPError, match="Unauthenticated"):
        status(client_for(fake, token="kt-wrong"), "rc-any")
    with pytest.raises(requests.exceptions.HTTPError, match="Permission 'kernels.get' was denied") as missing:
        status(client_for(fake), "rc-missing")
    assert missing.value.response.status_code == 403  # not 404: Kaggle does not say which names exist


def test_a_push_to_an_existing_slug_is_a_new_version_that_runs_and_replaces_the_source(fake: FakeKaggle) -> None:
    """What `kaggle kernels push` does on a kernel that exists (the same slug and title again); a
    title is needed only for a new kernel. The reconciler pushes each attempt of a job this way."""
    client = client_for(fake)
    assert push(client, "rc-versioned-kernel").version_number == 1
    second = push(client, "rc-versioned-kernel", text="print('version two')\n", title=None)
    assert not second.error and second.version_number == 2 and second.ref == "/code/fakeuser/rc-versioned-kernel"
    get = ApiGetKernelRequest()
    get.user_name, get.kernel_slug = "fakeuser", "rc-versioned-kernel"
    kernel = client.kernels.kernels_api_client.get_kernel(get)
    assert kernel.blob.source == "print('version two')\n" and kernel.metadata.current_version_number == 2
    assert kernel.metadata.title == "rc-versioned-kernel"
    mine = ApiListKernelsRequest()
    mine.group = KernelsListViewType.PROFILE
    listing = client.kernels.kernels_api_client.list_kernels(mine)
    assert [(k.ref, k.current_version_number) for k in listing.kernels] == [("fakeuser/rc-versioned-kernel", 2)]
    deadline = time.monotonic() + 30
    while status(client, "rc-versioned-kernel").status is not KernelWorkerStatus.COMPLETE:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    output = ApiListKernelSessionOutputRequest()
    output.user_name, output.kernel_slug = "fakeuser", "rc-versioned-kernel"
    log = client.kernels.kernels_api_client.list_kernel_session_output(output).log
    assert json.loads(log)[0]["data"] == "version two\n"


def test_a_new_kernel_still_needs_a_title(fake: FakeKaggle) -> None:
    answer = push(client_for(fake), "rc-untitled-kernel", title=None)
    assert answer.error == "Notebook title must be at least 5 characters" and fake.kernels == {}


# ---- conformance: what the adapter sends and what the fake answers, read strictly by kagglesdk's types ----

SERVICES = {"kernels.KernelsApiService": KernelsApiClient, "security.OAuthService": OAuthClient}


def rpc_types(service: str, method: str) -> tuple[type, type]:
    """(request type, response type) of `service/method`, from the signature of kagglesdk's own
    client method for it (`save_kernel(request: ApiSaveKernelRequest) -> ApiSaveKernelResponse`)."""
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", method).lower()
    hints = typing.get_type_hints(getattr(SERVICES[service], snake))
    return hints["request"], hints["return"]


def value_of(kind: Any, value: Any, where: str) -> None:
    """One field's value as kagglesdk's serializer for `kind` reads it, strictly."""
    if isinstance(kind, type) and issubclass(kind, KaggleObject):
        strict(kind, value, where)
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        assert value in kind.__members__, f"{where}: {value!r} is not a name of {kind.__name__}"
    elif kind is datetime:
        assert isinstance(value, str) and DateTimeSerializer._from_str(value), f"{where}: {value!r} is not a time"
    elif kind is timedelta:
        assert isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d{1,9})?s", value), \
            f"{where}: {value!r} is not a protobuf duration"
    elif kind in (bool, str):
        assert isinstance(value, kind), f"{where}: {value!r} is not {kind.__name__}"
    elif kind in (int, float):
        assert isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool), \
            f"{where}: {value!r} is not {kind.__name__}"
    else:
        raise AssertionError(f"{where}: no strict reading for {kind!r}")


def strict(kind: type, data: Any, where: str = "") -> None:
    """`data` as kagglesdk's generated type `kind` reads it, strictly: a key that is not one of its
    fields, or a value of another type, fails (kagglesdk's from_dict skips unknown keys and keeps any
    value). Proto3 has no required fields: one left out reads as its default, as Kaggle sends it."""
    where = where or kind.__name__
    assert isinstance(data, dict), f"{where}: {data!r} is not an object"
    fields = {f.json_name: f for f in kind._fields}
    unknown = set(data) - set(fields)
    assert not unknown, f"{where}: {sorted(unknown)} are not fields of {kind.__name__}"
    for key, value in data.items():
        field, at = fields[key], f"{where}.{key}"
        if isinstance(field.serializer, ListSerializer):
            assert isinstance(value, list), f"{at}: {value!r} is not a list"
            for i, item in enumerate(value):
                value_of(field.field_type, item, f"{at}[{i}]")
        elif isinstance(field.serializer, MapSerializer):
            assert isinstance(value, dict), f"{at}: {value!r} is not a map"
            for name, item in value.items():
                value_of(field.field_type, item, f"{at}.{name}")
        else:
            value_of(field.field_type, value, at)
    kind.from_dict(data)  # and kagglesdk's own reader takes it


def test_the_strict_reading_refuses_unknown_fields_wrong_types_and_enum_spellings() -> None:
    for bad, match in (({"state": "RUNNING"}, "not fields of"), ({"status": "Complete"}, "not a name of"),
                       ({"failureMessage": 3}, "is not str")):
        with pytest.raises(AssertionError, match=match):
            strict(ApiGetKernelSessionStatusResponse, bad)
    with pytest.raises(AssertionError, match="not a protobuf duration"):
        strict(ApiGetAcceleratorQuotaStatisticsResponse, {"gpuQuota": {"timeUsed": 3600}})


def test_every_request_of_the_adapter_and_every_answer_of_the_fake_parse_strictly_as_kagglesdk_s_types(
        fake: FakeKaggle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's whole life through the adapter (token introspection, first push on Kaggle's 403,
    status, listing, source, log and output, quota, doctor's secrets check, a second attempt as a
    new version): each request body against the request type kagglesdk's client method takes,
    each answer against the type it returns."""
    for name in ("KAGGLE_USERNAME", "KAGGLE_KEY", "KAGGLE_CONFIG_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KAGGLE_API_TOKEN", fake.token)
    fake.secrets["HF_TOKEN"] = "hf-value"
    kaggle = KaggleAdapter("kaggle", KaggleSettings(api_url=fake.url, request_timeout_seconds=10), owner="repo-a")
    command = [sys.executable, "-c", "print('attempt done')"]
    spec = LaunchSpec(job="conform", run_id="r-1", epoch=1, command=command, gpus=1)
    ref = kaggle.launch(spec)
    wait_state(kaggle, ref, ended)
    assert "attempt done" in kaggle.logs(ref)
    kaggle.allowance()
    kaggle.preflight([LaunchSpec(job="conform", run_id="r-1", epoch=1, command=command, secret_env={"HF_TOKEN": "x"})])
    second = kaggle.launch(LaunchSpec(job="conform", run_id="r-1", epoch=2, command=command, gpus=1))
    wait_state(kaggle, second, ended)
    methods = {method for _, method, _, _ in fake.exchanges}
    assert methods >= {"IntrospectToken", "SaveKernel", "GetKernel", "ListKernels", "GetKernelSessionStatus",
                       "ListKernelSessionOutput", "GetAcceleratorQuotaStatistics"}
    for service, method, request, answer in fake.exchanges:
        asks, answers = rpc_types(service, method)
        strict(asks, request, f"{method} request")
        strict(answers, answer, f"{method} answer")
    assert not any(m == "SaveKernel" and "hf-value" in json.dumps(r) for _, m, r, _ in fake.exchanges)
