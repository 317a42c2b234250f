"""Builds the compute adapter for a Provider manifest; the only place that knows every type."""

from __future__ import annotations

import importlib

from adapters.compute import ComputeAdapter, ProviderConfigError
from desired.models import Provider

# provider type -> (module, class); imported lazily so a missing optional dependency of one
# provider never stops the others.
ADAPTERS: dict[str, tuple[str, str]] = {
    "local": ("adapters.local", "LocalAdapter"),
    "ssh": ("adapters.ssh", "SshAdapter"),
    "slurm": ("adapters.slurm", "SlurmAdapter"),
    "sim": ("adapters.sim", "SimAdapter"),
    "kaggle": ("adapters.kaggle", "KaggleAdapter"),
    "lightning": ("adapters.lightning", "LightningAdapter"),
    "vast": ("adapters.vast", "VastAdapter"),
    "runpod": ("adapters.runpod", "RunpodAdapter"),
}


def make_adapter(provider: Provider, owner: str) -> ComputeAdapter:
    """Every adapter class takes `(name, settings, owner=identity)`; settings is the provider's typed
    settings, owner the state repository's identity (put on every worker it launches)."""
    kind = provider.spec.type
    if kind not in ADAPTERS:
        raise ProviderConfigError(f"provider {provider.name!r}: unknown type {kind!r}")
    module_name, class_name = ADAPTERS[kind]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ProviderConfigError(
            f"provider {provider.name!r}: the {kind} adapter cannot be loaded ({exc})"
        ) from exc
    cls = getattr(module, class_name)
    adapter: ComputeAdapter = cls(provider.name, provider.spec.settings, owner=owner)
    return adapter
