"""The GRPO example's actors, one class per role, written as a user writes Monarch actors.

The task is tiny on purpose (it runs on CPU in CI): a prompt is one token of a small vocabulary,
a completion is one token, and the reward says whether the completion follows a hidden rule.
The shapes are those of a real GRPO post-training run (torchforge's ``apps/grpo``):

- :class:`Generator` samples ``group_size`` completions per prompt from its copy of the policy
  (vLLM with tensor parallelism in a real run; here each rank samples its shard of the prompts)
  and takes new weights from the trainer every step.
- :class:`Reference` scores completions with the frozen initial policy (log-probabilities for
  the KL penalty).
- :class:`Reward` scores completions by the rule; it needs no GPU.
- :class:`Trainer` takes a GRPO step: group-relative advantages, a policy-gradient loss and a KL
  penalty against the reference, data-parallel with ``DistributedDataParallel`` over the trainer
  role's torch.distributed group (the job gives each role its own ``RANK``/``WORLD_SIZE``/
  ``MASTER_ADDR``/``MASTER_PORT``).
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
SEED = 11
LEARNING_RATE = 4.0


def new_policy() -> torch.nn.Module:
    """The initial policy; identical weights on every call and every host."""
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, VOCAB))


def target_of(prompts: torch.Tensor) -> torch.Tensor:
    """The hidden rule a good completion follows."""
    return (prompts * 3 + 1) % VOCAB


def where_am_i(role: str) -> dict[str, object]:
    """This proc's role, rank, host and GPUs, for the controller's placement report."""
    return {"role": role, "rank": current_rank().rank, "host": socket.gethostname(),
            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "-"),
            "world": os.environ.get("WORLD_SIZE", "-")}


def my_shard(rows: int) -> slice:
    """Rows ``rank::world`` of a batch, for this proc of its role's mesh."""
    world = 1
    for size in current_size().values():
        world *= size
    return slice(current_rank().rank, rows, world)


class Generator(Actor):
    """One generator rank: samples completions for its shard of the prompts."""

    def __init__(self) -> None:
        self.model = new_policy()
        self.model.requires_grad_(False)
        self.version = 0

    @endpoint
    def where(self) -> dict[str, object]:
        """Where this rank runs."""
        return {**where_am_i("generator"), "version": self.version}

    @endpoint
    def update_weights(self, version: int, weights: dict[str, torch.Tensor]) -> int:
        """Take the trainer's weights of ``version``; returns the version now served."""
        self.model.load_state_dict(weights)
        self.version = version
        return self.version

    @endpoint
    def generate(self, step: int, prompts: torch.Tensor, group_size: int) -> dict[str, object]:
        """``group_size`` sampled completions per prompt of this rank's shard.

        Returns the shard's row indices, the completions ``[rows, group_size]`` and the
        weights version that produced them (an off-policy check for the trainer).
        """
        rows = torch.arange(len(prompts))[my_shard(len(prompts))]
        generator = torch.Generator().manual_seed(step * 1000 + current_rank().rank)
        probs = functional.softmax(self.model(prompts[rows]), dim=-1)
        completions = torch.multinomial(probs, group_size, replacement=True, generator=generator)
        return {"rows": rows, "completions": completions, "version": self.version}


class Reference(Actor):
    """One reference rank: log-probabilities of completions under the frozen initial policy."""

    def __init__(self) -> None:
        self.model = new_policy()
        self.model.requires_grad_(False)

    @endpoint
    def where(self) -> dict[str, object]:
        """Where this rank runs."""
        return where_am_i("reference")

    @endpoint
    def logprobs(self, prompts: torch.Tensor, completions: torch.Tensor) -> dict[str, object]:
        """Log-probabilities ``[rows, group_size]`` of the completions of this rank's shard."""
        rows = torch.arange(len(prompts))[my_shard(len(prompts))]
        logprobs = functional.log_softmax(self.model(prompts[rows]), dim=-1)
        return {"rows": rows, "logprobs": logprobs.gather(1, completions[rows])}


class Reward(Actor):
    """The reward model: 1 for a completion that follows the rule, else 0 (CPU only)."""

    @endpoint
    def where(self) -> dict[str, object]:
        """Where this rank runs."""
        return where_am_i("reward")

    @endpoint
    def score(self, prompts: torch.Tensor, completions: torch.Tensor) -> torch.Tensor:
        """Rewards ``[prompts, group_size]`` in {0, 1}."""
        return (completions == target_of(prompts)[:, None]).float()


class Trainer(Actor):
    """One data-parallel trainer rank; DDP averages the gradients over the trainer role."""

    def __init__(self, beta: float) -> None:
        gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if gpu else \
            torch.device("cpu")
        if gpu:
            torch.cuda.set_device(self.device)
        dist.init_process_group("nccl" if gpu else "gloo")
        self.model = DistributedDataParallel(new_policy().to(self.device))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LEARNING_RATE)
        self.beta = beta

    @endpoint
    def where(self) -> dict[str, object]:
        """Where this rank runs, and its place in the trainer's group."""
        return {**where_am_i("trainer"), "backend": dist.get_backend(),
                "group_size": dist.get_world_size()}

    @endpoint
    def weights(self) -> dict[str, torch.Tensor]:
        """A copy of the current weights, for the generator."""
        return {name: tensor.detach().cpu().clone()
                for name, tensor in self.model.module.state_dict().items()}

    @endpoint
    def train(self, prompts: torch.Tensor, completions: torch.Tensor, rewards: torch.Tensor,
              ref_logprobs: torch.Tensor) -> dict[str, float]:
        """One GRPO step on this rank's shard of the prompts.

        Advantages are group-relative (each completion's reward minus its prompt group's mean,
        over the group's standard deviation); the loss is ``-advantage * logprob`` plus
        ``beta`` times the k3 estimate of KL(policy || reference). Returns the shard's loss, KL
        and row count.
        """
        rank, world = dist.get_rank(), dist.get_world_size()
        rows = slice(rank, None, world)
        prompts, completions = prompts[rows].to(self.device), completions[rows].to(self.device)
        rewards, ref_logprobs = rewards[rows].to(self.device), ref_logprobs[rows].to(self.device)
        advantages = (rewards - rewards.mean(dim=1, keepdim=True)) / (
            rewards.std(dim=1, keepdim=True) + 1e-4)
        self.optimizer.zero_grad()
        logprobs = functional.log_softmax(self.model(prompts), dim=-1).gather(1, completions)
        log_ratio = ref_logprobs - logprobs
        kl = (log_ratio.exp() - log_ratio - 1).mean()
        loss = -(advantages * logprobs).mean() + self.beta * kl
        loss.backward()  # DDP: gradients averaged over the trainer ranks
        self.optimizer.step()
        return {"loss": float(loss.detach()), "kl": float(kl.detach()), "rows": len(prompts)}
