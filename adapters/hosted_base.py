"""What every hosted compute adapter (Kaggle, Lightning AI, Vast.ai, RunPod) shares, so that each
provider's module keeps only what is its own: endpoints, payloads, credentials' places and the
state table.

Shared here: the adapter's name, settings and owner; the one HTTP client (`adapters.http.HostedApi`:
auth header, timeouts, Retry-After, error mapping, strict JSON), built on first use from the
provider's credentials (`connect`) and closed with the adapter; the number checks of its answers
(`adapters.wire.Numbers`); and the ownership rules every hosted adapter applies the same way:
the operator's view (owner '*') sees every owner's workers and launches nothing, and a launch's
job and run id must be safe labels before anything is sent.
"""

from __future__ import annotations

import hashlib
from typing import Any, ClassVar

from adapters.compute import ANY_OWNER, LaunchSpec, ProviderConfigError, check_label, check_owner
from adapters.http import HostedApi
from adapters.wire import Numbers


def worker_name(owner: str, job: str, run_id: str, epoch: int, limit: int, *, keep_epoch: bool = False) -> str:
    """`rc-<owner>-<job>-<run_id>-e<epoch>`, one name per worker; past `limit` characters it is cut
    and suffixed with a hash of the whole name (then `-e<epoch>` again, with `keep_epoch`)."""
    name = f"rc-{owner}-{job}-{run_id}-e{epoch}"
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    tail = f"-e{epoch}" if keep_epoch else ""
    return f"{name[:limit - 11 - len(tail)]}-{digest}{tail}"


class HostedAdapter:
    """The common part of a hosted adapter; `kind` names the provider in messages
    ("kaggle provider 'kaggle-free'"), `connect` builds its HTTP client."""

    kind: ClassVar[str] = "hosted"
    secrets_at_provider: bool = True

    def __init__(self, name: str, settings: Any, owner: str = ANY_OWNER) -> None:
        self.name = name
        self.settings = settings
        self.owner = check_owner(owner)
        self.foreign_workers = 0
        self.who = f"{self.kind} provider {name!r}"
        self.numbers = Numbers(self.who)
        self._api: HostedApi | None = None

    # ---- the HTTP client ----------------------------------------------------------------------
    @property
    def api(self) -> HostedApi:
        if self._api is None:
            self._api = self.connect()
        return self._api

    def connect(self) -> HostedApi:
        """The provider's client, with its credentials (ProviderConfigError when there are none)."""
        raise NotImplementedError

    def client(self, base_url: str, authorization: str, credentials_hint: str, **options: Any) -> HostedApi:
        """A HostedApi for this adapter: its name in every message, the settings' request timeout."""
        headers = {"Authorization": authorization, **options.pop("headers", {})}
        return HostedApi(self.who, base_url, headers=headers, credentials_hint=credentials_hint,
                         timeout=self.settings.request_timeout_seconds, **options)

    def close(self) -> None:
        if self._api is not None:
            self._api.close()

    # ---- whose workers ------------------------------------------------------------------------
    @property
    def operator(self) -> bool:
        """The operator's view (owner '*'): every owner's workers are seen; nothing is launched."""
        return self.owner == ANY_OWNER

    def owns(self, owner: Any) -> bool:
        """Whether a worker launched for `owner` is this adapter's own (the operator's view owns all)."""
        return self.operator or owner == self.owner

    def launch_labels(self, spec: LaunchSpec) -> dict[str, Any]:
        """The labels a launch gives its worker, once the launch may be made at all: refused in the
        operator's view, and for a job name or run id that cannot be a label."""
        if self.operator:
            raise ProviderConfigError(f"{self.who}: the operator's view (owner '*') launches nothing")
        check_label(spec.job, "job name")
        check_label(spec.run_id, "run id")
        return {"provider": self.name, "owner": self.owner, "job": spec.job, "run_id": spec.run_id,
                "epoch": spec.epoch}

    def free_slots(self) -> int | None:
        return None  # a hosted provider rents machines on demand: no fixed number of slots
