"""The example's own actors: a policy being trained and a frozen reference model.

Written the way a user writes Monarch actors: plain ``monarch.actor`` and torch, nothing from
monarch_operator. The policy is a tiny next-token model (embedding + linear head over a small
vocabulary); the reference model starts from the same weights and never changes, as in RL
post-training where a KL penalty keeps the policy close to where it started.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.nn.functional as functional
from monarch.actor import Actor, current_rank, current_size, endpoint

VOCAB = 16
HIDDEN = 32
SEED = 7
LEARNING_RATE = 0.3


def new_model() -> torch.nn.Module:
    """The initial model; identical weights on every call and every host."""
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, VOCAB))


def where_am_i() -> dict[str, object]:
    """This proc's rank, host and GPUs, for the controller's placement report."""
    point = current_rank()
    return {
        "rank": point.rank,
        "host": socket.gethostname(),
        "ssh": (os.environ.get("SSH_CONNECTION", "- - -").split() + ["-"])[2],
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "-"),
        "pid": os.getpid(),
    }


class Policy(Actor):
    """One data-parallel rank of the policy; the controller averages gradients across ranks."""

    def __init__(self, beta: float, raise_at_step: int = 0, exit_at_step: int = 0,
                 exit_code: int = 1) -> None:
        self.model = new_model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)
        self.beta = beta
        self.raise_at_step, self.exit_at_step, self.exit_code = (
            raise_at_step, exit_at_step, exit_code,
        )

    @endpoint
    def where(self) -> dict[str, object]:
        """Where this rank runs."""
        return where_am_i()

    @endpoint
    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the current weights (the reference model starts from these)."""
        return {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}

    @endpoint
    def gradients(self, step: int, tokens: torch.Tensor, targets: torch.Tensor,
                  ref_logprobs: torch.Tensor) -> dict[str, object]:
        """Loss = cross-entropy + beta * KL(policy || reference) on this rank's shard.

        Returns the shard's gradients, loss, KL and row count; the weights change only in
        :meth:`apply`, with the gradients averaged over every rank.
        """
        point = current_rank()
        world = 1
        for size in current_size().values():
            world *= size
        if step == self.exit_at_step:
            os._exit(self.exit_code)  # a crash of the rank's process, e.g. a CUDA abort
        if step == self.raise_at_step and point.rank == world - 1:
            raise ValueError(f"bad batch at step {step}")
        rows = slice(point.rank, None, world)
        tokens, targets, ref_logprobs = tokens[rows], targets[rows], ref_logprobs[rows]
        self.optimizer.zero_grad()
        logprobs = functional.log_softmax(self.model(tokens), dim=-1)
        cross_entropy = functional.nll_loss(logprobs, targets)
        kl = (logprobs.exp() * (logprobs - ref_logprobs)).sum(dim=-1).mean()
        (cross_entropy + self.beta * kl).backward()
        return {
            "grads": [p.grad.detach().clone() for p in self.model.parameters()],
            "loss": float(cross_entropy.detach()),
            "kl": float(kl.detach()),
            "rows": len(targets),
        }

    @endpoint
    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """Resume from a checkpoint's weights."""
        self.model.load_state_dict(weights)

    @endpoint
    def apply(self, grads: list[torch.Tensor]) -> None:
        """Take one SGD step with the averaged gradients (the same on every rank)."""
        for parameter, grad in zip(self.model.parameters(), grads, strict=True):
            parameter.grad = grad.clone()
        self.optimizer.step()


class Reference(Actor):
    """One rank of the frozen reference model: log-probabilities for its shard of a batch."""

    def __init__(self) -> None:
        self.model = new_model()
        self.model.requires_grad_(False)

    @endpoint
    def where(self) -> dict[str, object]:
        """Where this rank runs."""
        return where_am_i()

    @endpoint
    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """Start from the policy's initial weights."""
        self.model.load_state_dict(weights)

    @endpoint
    def logprobs(self, tokens: torch.Tensor) -> torch.Tensor:
        """Log-probabilities ``[rows, VOCAB]`` for rows ``rank::world`` of ``tokens``."""
        point = current_rank()
        world = 1
        for size in current_size().values():
            world *= size
        return functional.log_softmax(self.model(tokens[point.rank :: world]), dim=-1)
