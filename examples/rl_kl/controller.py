"""The example's controller: a KL-penalised training loop over the job's two meshes.

Run it

- in a MonarchJob: ``spec.launcher.program: rl_kl.controller:main`` (the launcher pod runs
  ``monarch-launch run rl_kl.controller:main``, which enters the job and calls :func:`main`);
- over any hostfile: ``monarch-launch run --hostfile hosts --trainer-hosts 2 --ref-hosts 1
  --ssh-key KEY rl_kl.controller:main --steps 5``;
- as a plain script: ``python -m rl_kl.controller --steps 5`` in a launcher pod, where
  ``Job.from_env()`` reads the operator's ``MONARCH_*`` variables.

Per step it prints ``step k/n loss=... kl=...``. ``--raise-at-step K`` makes the last policy rank
raise at step K; with ``--catch`` the controller catches that as a RankFailure, reports it and
skips the step, without it the failure ends the job. ``--exit-at-step K --exit-code N`` makes
every policy rank's process exit with N at step K.
"""

from __future__ import annotations

import argparse
import sys

import torch

from monarch_operator.job import Job, RankFailure
from rl_kl.actors import VOCAB, Policy, Reference

BATCH = 32


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rl_kl.controller")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--beta", type=float, default=0.1, help="weight of the KL penalty")
    parser.add_argument("--raise-at-step", type=int, default=0)
    parser.add_argument("--catch", action="store_true", help="catch a rank's failure and go on")
    parser.add_argument("--exit-at-step", type=int, default=0)
    parser.add_argument("--exit-code", type=int, default=1)
    return parser.parse_args(argv)


def make_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts and the tokens that should follow them (a fixed hidden rule)."""
    generator = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (BATCH,), generator=generator)
    return tokens, (tokens * 3 + 1) % VOCAB


def by_rank(values: object) -> list[object]:
    """A ValueMesh's values in rank order."""
    return [value for _, value in sorted(values.items(), key=lambda item: item[0].rank)]


def main(job: Job) -> None:
    """Train the policy for ``--steps`` steps with a KL penalty against the reference model."""
    args = parse_args(sys.argv[1:])
    policy = job.trainer.spawn(
        "policy", Policy, args.beta, args.raise_at_step, args.exit_at_step, args.exit_code
    )
    reference = job.ref.spawn("reference", Reference)
    for role, mesh in (("trainer", policy), ("ref", reference)):
        for where in by_rank(job.get(mesh.where.call())):
            print(f"placement {role} rank={where['rank']} host={where['host']} "
                  f"ssh={where['ssh']} gpus={where['gpus']}", flush=True)
    job.get(reference.load.call(job.get(policy.slice(hosts=0, gpus=0).weights.call_one())))

    for step in range(1, args.steps + 1):
        tokens, targets = make_batch(step)
        shards = by_rank(job.get(reference.logprobs.call(tokens)))
        ref_logprobs = torch.empty(BATCH, VOCAB)
        for rank, shard in enumerate(shards):
            ref_logprobs[rank :: len(shards)] = shard
        try:
            results = by_rank(job.get(policy.gradients.call(step, tokens, targets, ref_logprobs)))
        except RankFailure as failure:
            if not args.catch:
                raise
            print(f"caught: {failure.summary}", flush=True)
            continue
        rows = sum(result["rows"] for result in results)
        averaged = [
            sum(result["grads"][index] * result["rows"] for result in results) / rows
            for index in range(len(results[0]["grads"]))
        ]
        job.get(policy.apply.call(averaged))
        loss = sum(result["loss"] * result["rows"] for result in results) / rows
        kl = sum(result["kl"] * result["rows"] for result in results) / rows
        print(f"step {step}/{args.steps} loss={loss:.4f} kl={kl:.6f}", flush=True)
    print("rl_kl: done", flush=True)


if __name__ == "__main__":
    with Job.from_env() as entered:
        main(entered)
