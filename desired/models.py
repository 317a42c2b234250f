"""Manifest models: what a user may write under `desired/`.

Every model forbids unknown fields, so a typo is an error naming the field rather than a
setting that silently does nothing. Names are lowercase DNS labels because they become
storage paths, worker labels and file names.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from desired.suggest import did_you_mean

API_VERSION = "reconciler.dev/v1"

# Every name check is a full match (re.fullmatch): `$` also matches before a final newline, so
# "x\n" used to pass as a name.
DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
UNIX_USER = re.compile(r"[a-z_][a-z0-9_-]*\$?")
HOST_ADDRESS = re.compile(r"[A-Za-z0-9_:]([A-Za-z0-9._:%-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.%A-Za-z]+\]")
IDENTITY = re.compile(r"[a-z0-9][a-z0-9-]{2,39}")
# Variables that hold credentials by every tool's convention: a value under `env:` would be in git
# for good, so these must be named under `secrets:` (their values come from the reconciler's
# environment, or the provider's own secret store for hosted providers).
CREDENTIAL_ENV = re.compile(
    r"AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN|KAGGLE_KEY|KAGGLE_API_TOKEN|LIGHTNING_API_KEY|LIGHTNING_AUTH_TOKEN"
    r"|HF_TOKEN|HUGGING_FACE_HUB_TOKEN|WANDB_API_KEY|VAST_API_KEY|RUNPOD_API_KEY|.*_(PASSWORD|PASSWD|SECRET)")
RESERVED_ENV = frozenset({
    "RECONCILER_JOB", "RECONCILER_RUN_URI", "RECONCILER_RUN_ID", "RECONCILER_EPOCH",
    "RECONCILER_DEADLINE", "RECONCILER_CHECKPOINT_EVERY", "RECONCILER_TARGET_STEPS",
})


def check_dns_label(value: str) -> str:
    if not DNS_LABEL.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid name: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return value


def check_env_names(names: list[str], what: str) -> list[str]:
    """Environment names the reconciler passes to a worker; the fencing variables stay its own."""
    for key in names:
        if not ENV_NAME.fullmatch(key):
            raise ValueError(f"{what} {key!r} is not a valid environment variable name")
        if key in RESERVED_ENV:
            raise ValueError(f"{what} {key!r} is reserved: the reconciler sets it for every attempt")
    return names


Name = Annotated[str, Field(min_length=1, max_length=63)]


class Strict(BaseModel):
    # No infinity or NaN: `.inf` in a budget, price or interval is a typo, never a setting.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Metadata(Strict):
    name: Name = Field(
        description="the object's name: a lowercase DNS label (it becomes paths, labels and file names)")
    labels: dict[str, str] = Field(default_factory=dict,
        description="free-form key/value labels for people and tools; the reconciler ignores them")

    @field_validator("name")
    @classmethod
    def _name_is_dns_label(cls, v: str) -> str:
        return check_dns_label(v)


class Placement(Strict):
    """Where a run may go: providers in order of preference (empty = any), and a price cap."""

    providers: list[Name] = Field(default_factory=list,
        description="providers the run may use, in order of preference; empty = any")
    max_price_per_hour: float | None = Field(default=None, ge=0,
        description="never place the run where it costs more than this, $/h")
    interruptible: bool = Field(
        default=True, description="false: never on machines that can be taken away (a hosted provider with "
                                  "`interruptible: true`); define an on-demand provider for such jobs")

    @field_validator("providers")
    @classmethod
    def _providers_are_names(cls, v: list[str]) -> list[str]:
        return [check_dns_label(p) for p in v]


class ExitCodeRule(Strict):
    """The job's own word on what an exit code means (in the spirit of Kubernetes'
    podFailurePolicy): `fail` = Failed at once, `count` = a job error charged to the retry
    budget, `ignore` = a free interruption (the crash-loop guard still applies)."""

    codes: list[int] = Field(min_length=1, description="the exit codes this rule applies to")
    action: Literal["fail", "count", "ignore"] = Field(
        description="fail: Failed at once; count: a job error, charged to the retry budget; ignore: free")


class Retry(Strict):
    """Budget for the job's own failures. Interruptions never count against it."""

    max_retries: int = Field(default=3, ge=0, description="relaunches after job errors before Failed")
    backoff_seconds: float = Field(default=10.0, ge=0,
        description="wait before the first relaunch after a job error (doubles each time)")
    backoff_max_seconds: float = Field(default=600.0, ge=0, description="the longest wait between relaunches")
    max_unproductive_attempts: int = Field(
        default=5, ge=1,
        description="attempts in a row that end without a new durable checkpoint before the job fails "
                    "as a crash loop (they also back off exponentially)",
    )
    exit_codes: list[ExitCodeRule] = Field(default_factory=list, description="what an exit code means")


class Resources(Strict):
    """What a job needs; it is placed only where a provider (or one of its hosts) offers it."""

    cpus: int = Field(default=1, ge=1, description="CPU cores the job needs")
    memory_gb: float | None = Field(default=None, gt=0, description="memory the job needs, GB")
    gpus: int = Field(default=0, ge=0, description="GPUs the job needs")
    gpu_model: str | None = Field(default=None, description="GPU model the job needs, e.g. A100 (case-insensitive)")
    gpu_memory_gb: float | None = Field(default=None, gt=0, description="memory of each GPU, at least")
    cuda: float | None = Field(default=None, gt=0, description="highest CUDA version the driver must support, "
                                                               "at least (e.g. 12.1)")


class Capacity(Strict):
    """What a provider, or one SSH host, offers. A field left out is unknown and not checked."""

    cpus: int | None = Field(default=None, ge=1, description="CPU cores offered; unset = unknown")
    memory_gb: float | None = Field(default=None, gt=0, description="memory offered, GB; unset = unknown")
    gpus: int | None = Field(default=None, ge=0, description="GPUs offered; unset = unknown")
    gpu_models: list[str] = Field(default_factory=list, description="GPU models offered, e.g. [A100, rtx4090]")

    def shortfall(self, need: Resources) -> str | None:
        """Why `need` does not fit here, or None when it does (or cannot be told)."""
        if self.cpus is not None and need.cpus > self.cpus:
            return f"needs {need.cpus} CPUs, offers {self.cpus}"
        if self.memory_gb is not None and need.memory_gb is not None and need.memory_gb > self.memory_gb:
            return f"needs {need.memory_gb:g} GB of memory, offers {self.memory_gb:g}"
        if self.gpus is not None and need.gpus > self.gpus:
            return f"needs {need.gpus} GPUs, offers {self.gpus}"
        if need.gpu_model and need.gpus and self.gpu_models and \
                need.gpu_model.lower() not in {m.lower() for m in self.gpu_models}:
            return f"needs GPU model {need.gpu_model}, offers {', '.join(self.gpu_models)}"
        return None


class Code(Strict):
    """Where the job's code comes from; part of the run identity."""

    path: str | None = Field(default=None, description="working directory for the command")
    git: str | None = Field(default=None, description="git URL of the code")
    ref: str | None = Field(default=None, description="commit, tag or branch of `git`")
    image: str | None = Field(default=None, description="container image, for providers that use one")

    @field_validator("path")
    @classmethod
    def _not_the_root(cls, v: str | None) -> str | None:
        """A working directory of `/` hands the job the whole filesystem: almost always a typo."""
        if v is not None and (not v.strip() or posixpath.normpath(v.strip()) in ("/", "//")):
            raise ValueError(f"{v!r} is the root of the filesystem (or empty); name the folder that holds the "
                             "job's code")
        return v


# A matrix key: it is spelled in `${{ matrix.KEY }}`, in member names and in RECONCILER_MATRIX_<KEY>.
MATRIX_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")
MATRIX_FIELDS = frozenset({"include", "exclude", "max_parallel"})


def _plain_value(value: Any) -> Any:
    """One clear sentence for a value that is not a string, number or boolean (pydantic would give
    one error per type it tried)."""
    if value is None or isinstance(value, dict | list):
        raise ValueError(f"{value!r} is not a plain value: use a string, number or boolean")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return value


def _some_values(values: list[Any]) -> list[Any]:
    if not values:
        raise ValueError("an empty list makes no members: give it at least one value, or remove the key")
    return values


MatrixValue = Annotated[str | int | float | bool, BeforeValidator(_plain_value)]


class Matrix(BaseModel):
    """A sweep, as GitHub Actions' `strategy.matrix`: every key other than `include`, `exclude` and
    `max_parallel` names a non-empty list of values (strings, numbers or booleans), and the job runs
    once for each combination of them, each member its own run. Key names: a letter, then letters,
    digits, `_` or `-` (at most 40)."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    __pydantic_extra__: dict[str, Annotated[list[MatrixValue], AfterValidator(_some_values)]] = Field(init=False)

    include: list[dict[str, MatrixValue]] = Field(
        default_factory=list,
        description="extra members, or extra keys for members: each entry's keys are added to every "
                    "combination whose matrix values it does not change; an entry that fits none is a member "
                    "of its own (as in GitHub Actions)")
    exclude: list[dict[str, MatrixValue]] = Field(
        default_factory=list,
        description="combinations to leave out: a combination matching every key of an entry is removed "
                    "(before `include` is applied)")
    max_parallel: int | None = Field(
        default=None, ge=1, description="most members with a live attempt at once; unset = no limit")

    @model_validator(mode="before")
    @classmethod
    def _keys(cls, data: Any) -> Any:
        """Key names that can be spelled everywhere a key goes; a non-list value (`max-parallel: 2`)
        named with the field it is closest to."""
        if not isinstance(data, dict):
            return data
        for key, value in data.items():
            if key in MATRIX_FIELDS:
                continue
            if not isinstance(key, str) or not MATRIX_KEY.fullmatch(key):
                raise ValueError(f"matrix key {key!r} is not a valid key: use a letter, then letters, digits, "
                                 "'_' or '-' (at most 40)")
            if not isinstance(value, list):
                hint = did_you_mean(key, set(MATRIX_FIELDS))
                raise ValueError(f"matrix key `{key}` must name a list of values{hint or ', e.g. [1, 2]'}")
        return data

    @property
    def axes(self) -> dict[str, list[str | int | float | bool]]:
        """The keys and their values, in the order written."""
        return dict(self.model_extra or {})


DRILL_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")


class DrillRequest(Strict):
    """One drill asked for by `reconciler drill JOB` (docs/guides/drills.md): a new `id` asks for
    a new drill; the daemon carries out each id once, and its verdict is in the job's status."""

    id: str = Field(description="the request's id, made by `reconciler drill`; a new id is a new drill")
    run: str | None = Field(default=None,
        description="the run it was asked for (a new run of the job is not drilled by an old request)")
    lookahead: int = Field(default=5, ge=1, le=1000,
        description="steps the worker runs past its checkpoint before it is killed, and runs again after")
    tolerance: float = Field(default=0.0, ge=0,
        description="largest relative difference of a metric that still counts as the same run; 0 = exact")
    notice: bool = Field(default=False,
        description="true: stop through the provider's notice (SIGTERM and its grace) instead of a kill")
    to: Name | None = Field(default=None, description="the provider the relaunch goes to; unset = placement decides")

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not DRILL_ID.fullmatch(v):
            raise ValueError(f"{v!r} is not a drill id: use lower-case letters, digits and '-' (at most 40)")
        return v


class JobSpec(Strict):
    command: list[str] = Field(min_length=1, description="argv of the worker; no shell is involved")
    code: Code = Field(default_factory=Code, description="where the job's code comes from (part of the run identity)")
    env: dict[str, str] = Field(default_factory=dict,
        description="environment variables for the worker (never credentials: name those under `secrets`)")
    secrets: list[str] = Field(
        default_factory=list,
        description="names of environment variables whose values the reconciler passes to the worker",
    )
    resources: Resources = Field(default_factory=Resources,
        description="what one worker needs; the job is placed only where it fits")
    target_steps: int | None = Field(default=None, ge=1, description="completion target, for progress")
    checkpoint_every: int | None = Field(default=None, ge=1, description="checkpoint interval hint, steps")
    step_seconds: float | None = Field(
        default=None, gt=0,
        description="your estimate of the seconds one step takes (say, from a run on your own machine): "
                    "placement, the ETA and the deadline and budget checks use it until the job's own rate "
                    "is measured (15 min of attempt time with progress), then the measured rate alone",
    )
    placement: Placement = Field(default_factory=Placement,
        description="which providers may run it, in which order, and the price cap")
    retry: Retry = Field(default_factory=Retry,
        description="how many job errors are retried, and how long to back off")
    budget_usd: float | None = Field(default=None, ge=0,
        description="the most the run may cost over all its attempts; nothing starts beyond it")
    deadline: datetime | None = Field(default=None,
        description="when the run should be done (ISO 8601); placement favours meeting it")
    stall_timeout_seconds: float | None = Field(
        default=None, gt=0,
        description="heartbeat age after which a running worker is stalled; unset = 300 s, and a worker "
                    "that has never heartbeated (not instrumented) is judged by its provider's state alone",
    )
    suspend: bool = Field(default=False,
        description="true: stop the worker after a final checkpoint and start none until false again")
    drill: Literal["first_checkpoint"] | None = Field(
        default=None,
        description="first_checkpoint: one hard drill runs by itself after the first durable checkpoint of "
                    "each new run (an interruption proved to cost only time); its verdict is in status")
    drill_request: DrillRequest | None = Field(
        default=None,
        description="written by `reconciler drill JOB`: interrupt the running worker on purpose and check "
                    "that the resumed run is the same run (docs/guides/drills.md)")
    matrix: Matrix | None = Field(
        default=None,
        description="run the job once per combination of values (a sweep, as in GitHub Actions): each "
                    "member is a job of its own, named from the job's name and its values; "
                    "`${{ matrix.KEY }}` in `command` and `env` values is replaced by the member's value")

    after: list[Name] = Field(
        default_factory=list,
        description="jobs of this repository that must have Succeeded before this job's run starts at all; "
                    "one that Failed holds it until a new run of that job succeeds (no cycles, no unknown names)")

    @field_validator("after")
    @classmethod
    def _after_names(cls, v: list[str]) -> list[str]:
        """Job names, each once: a name given twice is a slip worth saying."""
        twice = sorted({n for n in v if v.count(n) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} is named more than once; name each job once")
        return [check_dns_label(n) for n in v]

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        check_env_names(list(v), "variable")
        held = sorted(k for k in v if CREDENTIAL_ENV.fullmatch(k))
        if held:
            raise ValueError(f"{', '.join(held)} holds a credential: name it under `secrets:` instead of `env:`, "
                             "since every value in a manifest stays in git's history")
        return v

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, v: list[str]) -> list[str]:
        return check_env_names(v, "secret")

    @model_validator(mode="after")
    def _env_or_secret(self) -> JobSpec:
        """A name in both would let a value in git decide what the worker sees as a secret."""
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise ValueError(f"{', '.join(both)} is named in both env and secrets; keep it in one")
        return self


class Job(Strict):
    apiVersion: Literal["reconciler.dev/v1"] = Field(default="reconciler.dev/v1",
        description="manifest format version")
    kind: Literal["Job"] = Field(description="Job: one run to drive to completion")
    metadata: Metadata = Field(description="the job's name and labels")
    spec: JobSpec = Field(description="what to run and how")

    @property
    def name(self) -> str:
        return self.metadata.name

    def run_id(self) -> str:
        """Digest of the fields that define *what is computed*; a change starts a new run."""
        identity = {
            "name": self.metadata.name,
            "command": self.spec.command,
            "code": self.spec.code.model_dump(mode="json"),
            "env": dict(sorted(self.spec.env.items())),
            "secrets": sorted(self.spec.secrets),
        }
        blob = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
        return "r-" + hashlib.sha256(blob).hexdigest()[:12]


# ---- providers -------------------------------------------------------------------------------


class LocalSettings(Strict):
    type: Literal["local"] = Field(default="local",
        description="local: worker processes on the reconciler's own machine")
    workdir: str | None = Field(default=None, description="the folder that holds the workers' folders, one "
                                                          "per attempt; default ~/.reconciler/local/workers")


class SshHost(Strict):
    name: Name = Field(description="the host's name in worker ids and status (a DNS label)")
    address: str = Field(min_length=1, description="host name or IP address to connect to")
    port: int = Field(default=22, ge=1, le=65535, description="SSH port")
    user: str = Field(default="root", pattern=r"^[a-z_][a-z0-9_-]*\$?$", description="user to log in as")
    key_file: str | None = Field(default=None, description="private key file; unset = ssh's own defaults")
    max_workers: int = Field(default=1, ge=1, description="most workers at once on this host")
    labels: dict[str, str] = Field(default_factory=dict,
        description="free-form labels for people and tools; the reconciler ignores them")
    resources: Capacity | None = Field(default=None, description="what the host offers (CPUs, memory, GPUs)")
    python: str = Field(default="python3", description="interpreter used on the host")

    @field_validator("name")
    @classmethod
    def _host_name(cls, v: str) -> str:
        return check_dns_label(v)

    @field_validator("user")
    @classmethod
    def _user_name(cls, v: str) -> str:
        """Full match whatever regex engine pydantic uses for `pattern`."""
        if not UNIX_USER.fullmatch(v):
            raise ValueError(f"{v!r} is not a valid user name")
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        """A host name or IP address; never an option (`-o...`), a space or a newline."""
        if not HOST_ADDRESS.fullmatch(v):
            raise ValueError(f"{v!r} is not a host name or IP address")
        return v


class SshSettings(Strict):
    type: Literal["ssh"] = Field(default="ssh", description="ssh: worker processes on hosts reached over SSH")
    hosts: list[SshHost] = Field(min_length=1, description="the hosts to run workers on")
    host_key_policy: Literal["strict", "accept-new"] = Field(default="strict",
        description="strict: the host key must be known already; accept-new: trust it on first use")
    known_hosts: str | None = Field(default=None, description="known_hosts file; default ~/.ssh/known_hosts")
    workdir: str = Field(default="~/.reconciler", description="folder on each host for worker files")
    connect_timeout_seconds: float = Field(default=10.0, gt=0, description="how long one connection attempt may take")
    lost_after_failures: int = Field(
        default=3, ge=1, description="failed probes in a row before a silent host's workers are lost"
    )
    lost_after_seconds: float = Field(
        default=120.0, ge=0, description="and at least this long since the first failed probe"
    )
    terminate_grace_seconds: float = Field(
        default=30.0, gt=0, description="time a worker gets after SIGTERM to checkpoint before SIGKILL"
    )
    control_persist_seconds: float | None = Field(
        default=None, gt=0, description="reuse one SSH connection per host (ControlMaster) for this long"
    )


class SlurmSettings(Strict):
    type: Literal["slurm"] = Field(default="slurm",
        description="slurm: batch jobs on a Slurm cluster (sbatch, squeue, scancel)")
    partition: str | None = Field(default=None, description="sbatch --partition; unset = the cluster's default")
    account: str | None = Field(default=None, description="sbatch --account; unset = the user's default")
    qos: str | None = Field(default=None, description="sbatch --qos; unset = the default")
    time_limit: str | None = Field(default=None, description="sbatch --time, e.g. 04:00:00")
    sbatch_options: list[str] = Field(default_factory=list,
        description="further sbatch options, passed as given (one option per item)")
    signal_seconds: int = Field(default=120, ge=0, description="warning signal this long before the limit")
    workdir: str = Field(
        default="~/.reconciler",
        description="folder for batch scripts and logs; must be visible on the compute nodes (shared)",
    )
    python: str = Field(default="python3", description="interpreter on the compute nodes")
    command_timeout_seconds: float = Field(default=30.0, gt=0, description="limit for one sbatch/squeue call")
    tasks: int = Field(default=1, ge=1, description="processes per worker on one node, started with srun, "
        "each a rank (the worker SDK reads SLURM_PROCID/SLURM_NTASKS as torchrun's ranks); 1 = the command once")


class SimSettings(Strict):
    """A simulated provider, for tests and benchmarks in simulated time."""

    type: Literal["sim"] = Field(default="sim", description="sim: a simulated provider (tests and benchmarks)")
    launch_delay_seconds: float = Field(default=60.0, ge=0, description="time from launch to a running worker")
    mean_time_between_preemptions_seconds: float | None = Field(default=None, gt=0,
        description="average time between preemptions; unset = never")
    api_error_rate: float = Field(default=0.0, ge=0, le=1, description="share of API calls that fail (0 to 1)")
    interruptible: bool = Field(default=False, description="its machines can be taken away (spot)")


class HostedSettings(Strict):
    """What every hosted provider shares: where its API is, and how long one request may take."""

    api_url: str = Field(description="base URL of the provider's API (the public one unless testing)")
    request_timeout_seconds: float = Field(default=30.0, gt=0, description="how long one API request may take")

    @field_validator("api_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", v):
            raise ValueError(f"{v!r} is not an http(s) URL")
        return v.rstrip("/")


# The accelerators as Kaggle's editor names them -> the `machineShape` its API takes (the enum
# spelling of kagglesdk's ApiSaveKernelRequest docs: NvidiaTeslaT4, NvidiaTeslaP100, Tpu1VmV38).
KAGGLE_SHAPE_NAMES = {"gpu t4 x2": "NvidiaTeslaT4", "t4 x2": "NvidiaTeslaT4", "gpu p100": "NvidiaTeslaP100",
                      "p100": "NvidiaTeslaP100", "gpu l4": "NvidiaL4", "tpu v5e-8": "TpuV5E8",
                      "tpu vm v3-8": "Tpu1VmV38"}


class KaggleSettings(HostedSettings):
    """Kaggle kernels: a weekly GPU quota, sessions cut at `session_hours`, no cancel."""

    @field_validator("machine_shape")
    @classmethod
    def _api_shape(cls, value: str) -> str:
        """`GPU T4 x2`, as Kaggle's editor shows it, is `NvidiaTeslaT4` on the wire."""
        return KAGGLE_SHAPE_NAMES.get(" ".join(value.lower().split()), value)

    type: Literal["kaggle"] = Field(default="kaggle", description="kaggle: Kaggle kernels")
    api_url: str = Field(default="https://api.kaggle.com", description="Kaggle's API (the public one unless testing)")
    username: str | None = Field(default=None, description="kernel owner; unset = the credentials' user")
    machine_shape: str = Field(default="NvidiaTeslaT4", description="accelerator for jobs that ask for GPUs: "
                               "the API's name (NvidiaTeslaT4) or the one Kaggle's editor shows (GPU T4 x2)")
    session_hours: float = Field(default=12.0, gt=0, description="Kaggle's session limit; the worker saves before it")
    save_margin_seconds: float = Field(default=600.0, ge=0, description="time kept before the session end to save")
    min_quota_hours: float = Field(
        default=1.0, ge=0, description="a GPU session is not started with less weekly quota left than this")
    enable_internet: bool = Field(default=True,
        description="give the kernel internet access (needed to fetch code and reach storage)")


class LightningSettings(HostedSettings):
    """Lightning AI jobs in one teamspace (a "project" in its REST API), paid from its credits."""

    type: Literal["lightning"] = Field(default="lightning", description="lightning: Lightning AI jobs")
    api_url: str = Field(default="https://lightning.ai",
        description="Lightning AI's API (the public one unless testing)")
    project_id: str = Field(min_length=1, description="the teamspace's project id")
    machine: str = Field(default="cpu-4", description="machine slug, e.g. lit-t4-1, lit-l4-1, lit-a100-1")
    interruptible: bool = Field(default=True, description="spot machines: cheaper, may be taken away")
    image: str | None = Field(default=None, description="container image when the job names none")
    cloudspace_id: str | None = Field(default=None, description="run inside this Studio's snapshot instead")
    min_credits: float = Field(
        default=0.0, ge=0, description="credits kept aside: nothing starts that would dip below them")


class VastSettings(HostedSettings):
    """Vast.ai: rent the best offer for the job (price and reliability), interruptible by bid."""

    type: Literal["vast"] = Field(default="vast", description="vast: Vast.ai instances")
    api_url: str = Field(default="https://console.vast.ai",
        description="Vast.ai's API (the public one unless testing)")
    image: str = Field(default="pytorch/pytorch:latest", description="container image when the job names none")
    interruptible: bool = Field(default=True, description="bid for interruptible instances (cheaper, may be outbid)")
    max_price_per_hour: float | None = Field(default=None, gt=0, description="never bid or rent above this, $/h")
    min_reliability: float = Field(default=0.98, ge=0, le=1,
        description="rent only machines at least this reliable by Vast.ai's score (0 to 1)")
    disk_gb: float = Field(default=20.0, gt=0, description="disk to rent with the instance, GB")
    verified_only: bool = Field(default=True, description="rent only machines Vast.ai has verified")
    loading_timeout_seconds: float = Field(
        default=900.0, gt=0, description="an instance still loading after this is destroyed (capacity unavailable)")


RUNPOD_DEFAULT_IMAGE = "runpod/pytorch:2.1.0-py3.10-cuda11.8.0-devel-ubuntu22.04"


class RunpodSettings(HostedSettings):
    """RunPod pods through its GraphQL API: spot by bid, or on-demand."""

    type: Literal["runpod"] = Field(default="runpod", description="runpod: RunPod pods")
    api_url: str = Field(default="https://api.runpod.io", description="RunPod's API (the public one unless testing)")
    gpu_type_id: str = Field(default="NVIDIA GeForce RTX 4090", description="RunPod's GPU type id")
    cloud_type: Literal["SECURE", "COMMUNITY", "ALL"] = Field(default="SECURE",
        description="SECURE (data centres), COMMUNITY (hosts of the community) or ALL")
    interruptible: bool = Field(default=True, description="spot pods: SIGTERM then SIGKILL 5 s later when outbid")
    bid_per_gpu: float | None = Field(default=None, gt=0, description="spot bid, $/h per GPU; unset = the minimum bid")
    # RunPod publishes versioned tags of runpod/pytorch only (no `latest`): this is the image of RunPod's
    # "RunPod Pytorch 2.1" template, <torch>-py<python>-cuda<cuda>-devel-ubuntu<version>.
    image: str = Field(default=RUNPOD_DEFAULT_IMAGE, description="container image when the job names none")
    container_disk_gb: int = Field(default=20, ge=1, description="container disk of the pod, GB")


HOSTED_PROVIDER_TYPES = frozenset({"kaggle", "lightning", "vast", "runpod"})

ProviderSettings = Annotated[
    LocalSettings | SshSettings | SlurmSettings | SimSettings | KaggleSettings | LightningSettings | VastSettings
    | RunpodSettings,
    Field(discriminator="type"),
]


class ProviderSpec(Strict):
    settings: ProviderSettings = Field(description="the provider's type and its own settings (`type` selects which)")
    concurrency: int = Field(default=1, ge=1, description="most workers at once on this provider")
    price_per_hour: float = Field(default=0.0, ge=0, description="what one worker costs per hour here, $ (0 = free)")
    free_quota_hours: float | None = Field(default=None, ge=0, description="free hours per week, if any")
    resources: Capacity | None = Field(
        default=None, description="what one worker may use here; unset = what the adapter reports, or unknown")
    secrets: list[str] = Field(default_factory=list, description="credential variable names it needs")

    @field_validator("secrets")
    @classmethod
    def _secret_names(cls, v: list[str]) -> list[str]:
        return check_env_names(v, "secret")

    @property
    def type(self) -> str:
        return self.settings.type


class Provider(Strict):
    apiVersion: Literal["reconciler.dev/v1"] = Field(default="reconciler.dev/v1",
        description="manifest format version")
    kind: Literal["Provider"] = Field(description="Provider: one pool of executors")
    metadata: Metadata = Field(description="the provider's name and labels")
    spec: ProviderSpec = Field(description="the provider's type, settings and limits")

    @property
    def name(self) -> str:
        return self.metadata.name


NotifyEvent = Literal["succeeded", "failed", "deadline-at-risk", "budget-nearly-spent", "repeated-preemptions",
                      "held", "storage-fault", "drill"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = get_args(NotifyEvent)


class NotifyTarget(Strict):
    """One place to send notifications: an apprise URL (Slack, Discord, Telegram, e-mail, a JSON
    webhook...) held in an environment variable, since such URLs carry tokens and git keeps
    everything it is given."""

    url_env: str = Field(description="name of the environment variable of the reconciler that holds "
                                     "the apprise URL (e.g. SLACK_WEBHOOK_URL)")
    events: list[NotifyEvent] = Field(default_factory=lambda: list(NOTIFY_EVENTS),
                                      description="the events sent here; unset = all of them")
    jobs: list[Name] = Field(default_factory=list, description="only these jobs; empty = every job")

    @field_validator("url_env")
    @classmethod
    def _env_name(cls, v: str) -> str:
        if not ENV_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not a valid environment variable name")
        return v


class Notifications(Strict):
    """Who hears about what: targets, and the thresholds of the warning events."""

    targets: list[NotifyTarget] = Field(default_factory=list, description="where notices go, and for which events")
    budget_fraction: float = Field(
        default=0.8, gt=0, le=1,
        description="budget-nearly-spent fires when a job's spending first reaches this share of budget_usd")
    preemptions: int = Field(
        default=3, ge=1,
        description="repeated-preemptions fires when this many attempts in a row ended in an interruption")
class SignaturePolicy(Strict):
    """`signatures:` of reconciler.yaml: who may change `desired/` and `reconciler.yaml`. Each path
    is a file in the repository (read at the last trusted commit, so only an already allowed key
    can change it) or, absolute or starting with `~`, a file on the daemon's machine."""

    allowed_signers: str | None = Field(
        default=None, description="SSH keys allowed to sign, in git's allowed-signers format")
    gpg_keys: str | None = Field(default=None, description="ASCII-armored OpenPGP public keys allowed to sign")

    @field_validator("allowed_signers", "gpg_keys")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.strip() or any(ord(c) < 32 or ord(c) == 127 for c in v):
            raise ValueError(f"{v!r} is not a file path")
        if not v.startswith(("/", "~")) and ".." in v.split("/"):
            raise ValueError(f"{v!r} leaves the repository; name a file inside it or an absolute path")
        return v

    @model_validator(mode="after")
    def _some_keys(self) -> SignaturePolicy:
        if self.allowed_signers is None and self.gpg_keys is None:
            raise ValueError("name allowed_signers (SSH keys) or gpg_keys (OpenPGP keys), or remove `signatures:`")
        return self


# A git branch name the reconciler may write: no option-like start, no '..', no empty component.
BRANCH_NAME = re.compile(r"(?!/|-|.*//|.*/$|.*\.\.|.*\.lock$|.*@\{)[A-Za-z0-9._/-]{1,200}")


# Run data of a repository that sets no `storage:`: a folder of its own, named by its identity, so
# that two repositories on one machine whose jobs have the same name and command never share a run.
REPOSITORY_STORAGE = "file://~/.reconciler/repos/{key}/runs"


class Settings(Strict):
    """Reconciler settings, from `reconciler.yaml` at the repository root; all have safe defaults."""

    storage: str = Field(
        default="", description="fsspec URL of run data (checkpoints, progress, leases); unset: "
                                f"{REPOSITORY_STORAGE.format(key='<identity>')}, a folder of this repository's own "
                                "on the daemon's machine")
    tick_seconds: float = Field(default=30.0, gt=0, description="seconds between ticks of the daemon")
    deadline_policy: Literal["rules", "lookahead"] = Field(
        default="rules",
        description="how a job with a deadline chooses between spot, its reliable fallback and a wait: `rules` "
                    "keeps a cover for the next interruption; `lookahead` picks what it expects to finish for "
                    "least from the measured rates (docs/guides/deadlines-budgets.md)")
    provider_deadline_seconds: float = Field(
        default=20.0, gt=0, le=600,
        description="how long a tick waits for each provider's answer (all are asked at once); one that takes "
                    "longer cannot be asked this tick: its jobs keep their last view, the others go on")
    commit_name: str = Field(default="reconciler", description="author name of status commits")
    commit_email: str = Field(default="reconciler@localhost", description="author e-mail of status commits")
    remote: str | None = Field(default=None, description="git remote to fetch from and push to")
    storage_options: dict[str, str] = Field(default_factory=dict,
        description="options for the storage backend (fsspec), e.g. endpoint_url for S3")
    identity: str | None = Field(
        default=None, pattern=r"^[a-z0-9][a-z0-9-]{2,39}$",
        description="this state repository's identity, put on every worker it launches (made by "
                    "`reconciler init`; unset = derived from the repository's first commit)",
    )
    notifications: Notifications = Field(
        default_factory=Notifications,
        description="where to send notifications of job events (see docs/operations/notifications.md)")

    @field_validator("storage", "commit_name", "commit_email", "remote")
    @classmethod
    def _one_printable_line(cls, v: str | None) -> str | None:
        """These reach git and fsspec as arguments and environment values: no newline or escape."""
        if v is not None and any(ord(c) < 32 or ord(c) == 127 for c in v):
            raise ValueError(f"{v!r} contains a control character")
        return v

    def for_repository(self, key: str) -> Settings:
        """These settings with `storage` resolved for the repository `key` names (its identity)."""
        return self if self.storage else self.model_copy(update={"storage": REPOSITORY_STORAGE.format(key=key)})

    @field_validator("identity", mode="before")
    @classmethod
    def _identity_is_text(cls, v: object) -> object:
        """YAML reads an unquoted all-digit identity (as early `reconciler init`s wrote) as a number."""
        if isinstance(v, int | float) and not isinstance(v, bool):
            raise ValueError("YAML read the identity as a number: put it in quotes as written, "
                             "e.g. identity: \"012345678901\"")
        return v

    @field_validator("identity")
    @classmethod
    def _identity(cls, v: str | None) -> str | None:
        if v is not None and not IDENTITY.fullmatch(v):
            raise ValueError(f"{v!r} is not a valid identity: 3-40 lowercase letters, digits and '-'")
        return v

    signatures: SignaturePolicy | None = Field(
        default=None, description="act only on changes signed by these keys (unset: every commit is acted on)")

    status_branch: str | None = Field(
        default=None,
        description="the branch status commits go to, each naming the desired commit it was computed from; "
                    "unset = `reconciler/status` when `remote` is set (a person's push is never rejected "
                    "because of the reconciler), else the reconciled branch itself; \"\" = always the "
                    "reconciled branch itself",
    )

    @field_validator("status_branch")
    @classmethod
    def _status_branch(cls, v: str | None) -> str | None:
        """A name git takes as a branch, and never an option or a path out of refs/heads/."""
        if v and not BRANCH_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not a usable branch name: letters, digits, '.', '_', '-' and '/' "
                             "(not leading '-' or '/', no '..' or '//')")
        return v


def default_local_provider() -> Provider:
    """Used when the repository declares no provider, so one Job alone already works."""
    return Provider(
        kind="Provider",
        metadata=Metadata(name="local"),
        spec=ProviderSpec(settings=LocalSettings(), concurrency=2),
    )
