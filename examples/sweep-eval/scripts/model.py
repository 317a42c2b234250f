"""The demo's model (reconciler/demo/train.py), shared by train.py and evaluate.py: a small
regression network fitting sin(x @ w) on synthetic batches. Tiny on purpose: it trains in seconds
on a CPU."""

from __future__ import annotations

import torch
from torch import nn

FEATURES = 16


def build(lr: float) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)  # every member starts from the same weights: only the learning rate differs
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 1))
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def batch(size: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets; from torch's global RNG (which the SDK restores) unless a generator is given."""
    x = torch.randn(size, FEATURES, generator=generator)
    w = torch.linspace(-1, 1, FEATURES).unsqueeze(1)
    return x, torch.sin(x @ w)


def held_out(seed: int, size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed set no training step sees: seed 1 validates (train.py), seed 2 tests (evaluate.py)."""
    return batch(size, torch.Generator().manual_seed(seed))


def loss_on(model: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    with torch.no_grad():
        return float(nn.functional.mse_loss(model(data[0]), data[1]))
