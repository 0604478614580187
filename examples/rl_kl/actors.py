"""The example's own actors: a policy being trained and a frozen reference model.

Written the way a user writes Monarch actors: plain ``monarch.actor`` and torch, nothing from
monarch_operator. The policy is a tiny next-token model (embedding + linear head over a small
vocabulary) trained data-parallel with ``DistributedDataParallel`` over the trainer role's
torch.distributed group: the job gives every trainer proc ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` etc. of that role, so torch's own ``init_process_group`` forms
it (gloo on CPU, NCCL on GPUs) and DDP averages the gradients in ``backward()``. The reference
model starts from the same weights and never changes, as in RL post-training where a KL penalty
keeps the policy close to where it started.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as functional
from monarch.actor import Actor, current_rank, current_size, endpoint
from torch.nn.parallel import DistributedDataParallel

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
    """One data-parallel rank of the policy; DDP averages the gradients over the trainer role."""

    def __init__(self, beta: float, raise_at_step: int = 0, exit_at_step: int = 0,
                 exit_code: int = 1) -> None:
        # The trainer role's group, from the variables the job put in this proc's environment.
        gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if gpu else \
            torch.device("cpu")
        if gpu:
            torch.cuda.set_device(self.device)
        dist.init_process_group("nccl" if gpu else "gloo")
        self.model = DistributedDataParallel(new_model().to(self.device))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)
        self.beta = beta
        self.raise_at_step, self.exit_at_step, self.exit_code = (
            raise_at_step, exit_at_step, exit_code,
        )

    @endpoint
    def where(self) -> dict[str, object]:
        """Where this rank runs, and its place in the trainer's group."""
        return {**where_am_i(), "backend": dist.get_backend(), "group_rank": dist.get_rank(),
                "group_size": dist.get_world_size()}

    @endpoint
    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the current weights (the reference model starts from these)."""
        return {name: tensor.detach().cpu().clone()
                for name, tensor in self.model.module.state_dict().items()}

    @endpoint
    def train(self, step: int, tokens: torch.Tensor, targets: torch.Tensor,
              ref_logprobs: torch.Tensor) -> dict[str, object] | None:
        """One step on this rank's shard: loss = cross-entropy + beta * KL(policy || reference).

        DDP averages the gradients over every trainer rank during ``backward()``, so every
        replica takes the same SGD step. Returns the shard's loss, KL and row count; None when
        another rank refused the batch (then no rank steps).
        """
        rank, world = dist.get_rank(), dist.get_world_size()
        if step == self.exit_at_step:
            os._exit(self.exit_code)  # a crash of the rank's process, e.g. a CUDA abort
        if self.raise_at_step:
            # Agree first: a rank that raised before backward() would leave the others waiting
            # in DDP's all-reduce. Every rank takes part in this one, then all skip the batch.
            refuses = step == self.raise_at_step and rank == world - 1
            refused = torch.tensor([float(refuses)], device=self.device)
            dist.all_reduce(refused)
            if refuses:
                raise ValueError(f"bad batch at step {step}")
            if refused.item():
                return None
        rows = slice(rank, None, world)
        tokens, targets, ref_logprobs = (
            tokens[rows].to(self.device), targets[rows].to(self.device),
            ref_logprobs[rows].to(self.device),
        )
        self.optimizer.zero_grad()
        logprobs = functional.log_softmax(self.model(tokens), dim=-1)
        cross_entropy = functional.nll_loss(logprobs, targets)
        kl = (logprobs.exp() * (logprobs - ref_logprobs)).sum(dim=-1).mean()
        (cross_entropy + self.beta * kl).backward()  # DDP: gradients averaged over the ranks
        self.optimizer.step()
        return {"loss": float(cross_entropy.detach()), "kl": float(kl.detach()),
                "rows": len(targets)}

    @endpoint
    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """Resume from a checkpoint's weights (the same on every rank)."""
        self.model.module.load_state_dict(weights)


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
