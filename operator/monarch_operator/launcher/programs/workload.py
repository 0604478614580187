"""The built-in example workload: a data-parallel trainer and a frozen reference model.

The actor classes live in this installed module (not in the launcher's ``__main__``) so that the
Monarch procs on every host unpickle them by reference: each host runs the same venv, which has
``monarch_operator`` installed.

- :class:`Trainer` holds a small ``nn.Linear`` classifier. Each step every rank builds the step's
  batch from the seed (:func:`make_batch`: the same on every rank), takes its shard of it,
  computes gradients, averages them across all trainer ranks with a gloo all-reduce and takes an
  SGD step, so every replica stays identical.
- :class:`Reference` holds a frozen copy (the trainer's initial weights, sent by the launcher)
  and returns log-probabilities for its shard of the same batch.
- :func:`run_steps` drives both from the launcher and yields per-step loss and
  KL(trainer || ref), computed in the launcher from the two sets of log-probabilities.

Only the ranks import torch: what crosses to the launcher (weights, log-probabilities) is plain
Python lists, so the launcher's process never loads it (2-3 CPU-s, and seconds before the first
step, on a loaded 2-core machine; docs/performance.md). Monarch's pickling loads torch in a
receiver only for tensors (``monarch._src.actor.pickle``).
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from monarch.actor import Actor, current_rank, current_size, endpoint

from monarch_operator.launcher.session import waiting

if TYPE_CHECKING:
    import torch

    # Not exported from monarch.actor in torchmonarch 0.7.0; used for annotations only.
    from monarch_operator.launcher.session.monarch_compat import ActorMesh

# Log-probabilities as plain floats, ``[rows][CLASSES]``; weights by parameter name, as nested
# lists of the tensor's shape.
Rows = list[list[float]]
Weights = dict[str, Any]

FEATURES = 8
CLASSES = 4
BATCH = 32
LEARNING_RATE = 0.5
# Seed for the initial weights (same on every trainer rank) and for each step's batch.
SEED = 1234
# How long gloo waits for peers during setup and collectives, seconds.
GLOO_TIMEOUT_S = 60
# Trainer replicas agree when every log-probability is within these of rank 0's (the
# tolerances of torch.allclose, applied as math.isclose does).
REPLICA_REL_TOL = 1e-5
REPLICA_ABS_TOL = 1e-6


@dataclass(frozen=True)
class TrainerStep:
    """One trainer rank's step: mean loss over its rows, their count, and the whole batch's
    log-probabilities ``[BATCH][CLASSES]`` after the step (equal on every rank when gradients
    are averaged correctly)."""

    loss: float
    rows: int
    logprobs: Rows


@dataclass(frozen=True)
class StepResult:
    """One step's outcome, as printed by the launcher: mean trainer loss and KL(trainer || ref)."""

    step: int
    loss: float
    kl: float


def new_model() -> torch.nn.Linear:
    """Return the workload's initial model; the same weights on every call and every host.

    Imports torch: call it on a rank (or in a test), not in the launcher.
    """
    import torch

    torch.manual_seed(SEED)
    return torch.nn.Linear(FEATURES, CLASSES)


def make_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return step ``step``'s batch: inputs ``[BATCH, FEATURES]`` drawn from the seed and labels
    ``[BATCH]`` from a fixed hidden linear rule; the same on every rank and every host.

    Imports torch: call it on a rank (or in a test), not in the launcher.
    """
    import torch

    generator = torch.Generator().manual_seed(SEED + step)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    rule = torch.randn(FEATURES, CLASSES, generator=torch.Generator().manual_seed(SEED))
    return inputs, (inputs @ rule).argmax(dim=-1)


class Trainer(Actor):
    """One data-parallel trainer rank; gradients are averaged over all ranks of its mesh."""

    def __init__(self, fail_at_step: int = 0, fail_exit_code: int = 1) -> None:
        import torch

        self._model = new_model()
        self._optimizer = torch.optim.SGD(self._model.parameters(), lr=LEARNING_RATE)
        self._group: Any = None  # torch.distributed.ProcessGroupGloo once init_group ran
        self._fail_at_step = fail_at_step
        self._fail_exit_code = fail_exit_code

    @endpoint
    def state_dict(self) -> Weights:
        """Return the current weights as nested lists by parameter name (used to initialise
        the reference model; lists, so that the launcher needs no torch to pass them on)."""
        return {name: tensor.tolist() for name, tensor in self._model.state_dict().items()}

    @endpoint
    def free_port(self, address: str) -> int:
        """Return a TCP port that is free on ``address`` now (for the gloo rendezvous store)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
            return int(probe.getsockname()[1])

    @endpoint
    def init_group(self, host_addresses: list[str], master_port: int) -> None:
        """Join the trainer's gloo process group.

        Args:
            host_addresses: the address of every trainer host, by host index; host 0 serves
                the rendezvous store.
            master_port: the store's port on host 0.
        """
        import torch.distributed as dist

        point = current_rank()
        world_size = math.prod(current_size().values())
        my_address = host_addresses[point["hosts"]]
        store = dist.TCPStore(  # type: ignore[attr-defined]  # re-exported without __all__
            host_addresses[0],
            master_port,
            world_size,
            is_master=point.rank == 0,
            timeout=timedelta(seconds=GLOO_TIMEOUT_S),
        )
        # Bind gloo to the address the launcher chose for this host, instead of gloo's default
        # (the address gethostname() resolves to, which can be loopback: field case C3).
        # Private in torch 2.13, but the only way to choose gloo's device without an interface
        # name; init_process_group ignores options for gloo.
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=my_address)]
        options._timeout = timedelta(seconds=GLOO_TIMEOUT_S)
        self._group = dist.ProcessGroupGloo(store, point.rank, world_size, options)

    @endpoint
    def step(self, step: int) -> TrainerStep:
        """Take one optimizer step on this rank's shard of step ``step``'s batch.

        Args:
            step: 1-based step number: selects the batch (:func:`make_batch`) and is checked
                against the fault injection's step. This rank uses rows ``rank::world``.

        Returns:
            This rank's :class:`TrainerStep`.
        """
        import torch
        import torch.nn.functional as functional

        if self._group is None:
            raise RuntimeError("init_group must be called before step")
        if step == self._fail_at_step:
            os._exit(self._fail_exit_code)  # fault injection: a worker process dies with a code
        inputs, labels = make_batch(step)
        point = current_rank()
        world_size = self._group.size()
        shard_inputs, shard_labels = (
            inputs[point.rank :: world_size],
            labels[point.rank :: world_size],
        )
        self._optimizer.zero_grad()
        loss = functional.cross_entropy(self._model(shard_inputs), shard_labels)
        loss.backward()  # type: ignore[no-untyped-call]
        for parameter in self._model.parameters():
            assert parameter.grad is not None
            self._group.allreduce([parameter.grad]).wait()
            parameter.grad /= world_size
        self._optimizer.step()
        with torch.no_grad():
            logprobs = functional.log_softmax(self._model(inputs), dim=-1)
        return TrainerStep(loss=loss.item(), rows=len(shard_labels), logprobs=logprobs.tolist())


class Reference(Actor):
    """One rank of the frozen reference model; scores its shard of each batch."""

    def __init__(self) -> None:
        self._model = new_model()
        self._model.requires_grad_(False)

    @endpoint
    def load(self, weights: Weights) -> None:
        """Replace the weights with ``weights`` (the trainer's initial ones, as nested lists by
        parameter name: :meth:`Trainer.state_dict`)."""
        import torch

        self._model.load_state_dict({name: torch.tensor(value) for name, value in weights.items()})

    @endpoint
    def logprobs(self, step: int) -> Rows:
        """Return log-probabilities ``[rows][CLASSES]`` for rows ``rank::world`` of step
        ``step``'s batch."""
        import torch.nn.functional as functional

        inputs, _ = make_batch(step)
        point = current_rank()
        world_size = math.prod(current_size().values())
        shard = functional.log_softmax(self._model(inputs[point.rank :: world_size]), dim=-1)
        return shard.tolist()  # type: ignore[no-any-return]


def kl_divergence(logprobs_p: Sequence[Sequence[float]], logprobs_q: Sequence[Sequence[float]]
                  ) -> float:
    """Mean over rows of KL(p || q), given log-probabilities ``[rows][classes]`` of both.

    Raises:
        ValueError: the two have different shapes, or no rows.
    """
    if not logprobs_p or len(logprobs_p) != len(logprobs_q):
        raise ValueError(f"KL needs rows of equal count: {len(logprobs_p)} and {len(logprobs_q)}")
    total = 0.0
    for row_p, row_q in zip(logprobs_p, logprobs_q, strict=True):
        total += math.fsum(math.exp(p) * (p - q) for p, q in zip(row_p, row_q, strict=True))
    return total / len(logprobs_p)


def replicas_agree(first: Rows, other: Rows) -> bool:
    """True when two trainer replicas' log-probabilities ``[rows][classes]`` are equal within
    ``REPLICA_REL_TOL`` / ``REPLICA_ABS_TOL`` everywhere (and of the same shape)."""
    return len(first) == len(other) and all(
        len(row_a) == len(row_b)
        and all(math.isclose(a, b, rel_tol=REPLICA_REL_TOL, abs_tol=REPLICA_ABS_TOL)
                for a, b in zip(row_a, row_b, strict=True))
        for row_a, row_b in zip(first, other, strict=True))


def interleave(shards: Sequence[Rows]) -> Rows:
    """Rows of the whole batch from the shards of ranks that each took rows ``rank::world``."""
    world = len(shards)
    whole: Rows = [[] for _ in range(sum(len(shard) for shard in shards))]
    for rank, shard in enumerate(shards):
        for index, row in enumerate(shard):
            whole[rank + index * world] = list(row)
    return whole


def prepare(
    trainer: ActorMesh[Trainer],
    ref: ActorMesh[Reference],
    trainer_addresses: list[str],
    timeout_s: float,
) -> None:
    """Form the trainer's gloo group and give the reference model the trainer's initial weights.

    Args:
        trainer, ref: the two actor meshes.
        trainer_addresses: the address of every trainer host, by host index.
        timeout_s: limit for each call, seconds.
    """
    rank0 = trainer.slice(hosts=0, gpus=0)
    port = waiting.get(rank0.free_port.call_one(trainer_addresses[0]), timeout_s)
    waiting.get(trainer.init_group.call(trainer_addresses, port), timeout_s)
    waiting.get(ref.load.call(waiting.get(rank0.state_dict.call_one(), timeout_s)), timeout_s)


def _by_rank(values: Any) -> list[Any]:
    """Return a ValueMesh's values ordered by flat rank."""
    return [value for _, value in sorted(values.items(), key=lambda item: item[0].rank)]


def run_steps(
    trainer: ActorMesh[Trainer], ref: ActorMesh[Reference], steps: int, timeout_s: float
) -> Iterator[StepResult]:
    """Train for ``steps`` steps, yielding each step's result as soon as it is known.

    Raises:
        RuntimeError: the trainer replicas disagree after a step (gradient averaging broken).
        monarch.actor.ActorError, SupervisionError, TimeoutError: from the Monarch calls.
    """
    for step in range(1, steps + 1):
        trainer_results = _by_rank(waiting.get(trainer.step.call(step), timeout_s))
        ref_shards = _by_rank(waiting.get(ref.logprobs.call(step), timeout_s))
        policy = trainer_results[0].logprobs
        for other in trainer_results[1:]:
            if not replicas_agree(policy, other.logprobs):
                raise RuntimeError(f"trainer replicas diverged at step {step}")
        rows = sum(result.rows for result in trainer_results)
        loss = sum(result.loss * result.rows for result in trainer_results) / rows
        yield StepResult(step=step, loss=loss, kl=kl_divergence(policy, interleave(ref_shards)))
