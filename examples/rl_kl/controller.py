"""The example's controller: a KL-penalised training loop over the job's two meshes.

Run it

- in a MonarchJob: ``spec.launcher.program: rl_kl.controller:main`` (the launcher pod runs
  ``monarch-launch run rl_kl.controller:main``, which enters the job and calls :func:`main`);
- over any hostfile: ``monarch-launch run --hostfile hosts --trainer-hosts 2 --ref-hosts 1
  --ssh-key KEY rl_kl.controller:main --steps 5``;
- as a plain script: ``python -m rl_kl.controller --steps 5`` in a launcher pod, where
  ``Job.from_env()`` reads the operator's ``MONARCH_*`` variables.

The policy trains with DDP across the trainer hosts (:mod:`rl_kl.actors`): each rank steps on
its shard and DDP averages the gradients; the controller only sends the batch and the
reference's log-probabilities and reports. Per step it prints ``step k/n loss=... kl=...``.
``--raise-at-step K`` makes the last policy rank raise at step K (after telling the other ranks,
which skip the batch); with ``--catch`` the controller catches that as a RankFailure, reports
it and skips the step, without it the failure ends the job. ``--exit-at-step K --exit-code N`` makes
every policy rank's process exit with N at step K.

``--checkpoint-dir DIR`` (storage that outlives the launcher pod: a volume of
``spec.launcher.template``, or a shared filesystem) turns on checkpoint before a stop: when the
job is suspended or evicted while it runs (``runPolicy.checkpointGracePeriodSeconds``), the
controller saves the step, the policy's and the reference's weights to ``DIR/step-K.pt``,
names it (``checkpoint_saved``) and returns; the next attempt resumes from it
(``resume_checkpoint``, ``MONARCH_CHECKPOINT``) and prints ``resumed from ... at step K``.
``--step-seconds S`` sleeps S seconds per step (a stand-in for a long step).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from monarch_operator.job import (
    Job,
    RankFailure,
    checkpoint_saved,
    on_stop,
    report,
    resume_checkpoint,
    stop_requested,
)
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
    parser.add_argument("--checkpoint-dir", default="",
                        help="save to DIR/step-K.pt when asked to stop, resume from it after")
    parser.add_argument("--step-seconds", type=float, default=0.0)
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
            if role == "trainer" and where["rank"] == 0:
                print(f"policy: DistributedDataParallel over {where['group_size']} trainer "
                      f"ranks ({where['backend']})", flush=True)
    initial = job.get(policy.slice(hosts=0, gpus=0).weights.call_one())
    first = 1
    if args.checkpoint_dir:
        on_stop()  # a suspend or an eviction gives this program its grace period to save
        if resume_checkpoint():
            saved = torch.load(resume_checkpoint(), weights_only=True)
            initial, first = saved["reference"], saved["step"] + 1
            job.get(policy.load.call(saved["policy"]))
            print(f"resumed from {resume_checkpoint()} at step {first}", flush=True)
    job.get(reference.load.call(initial))

    for step in range(first, args.steps + 1):
        if args.checkpoint_dir and stop_requested():
            path = os.path.join(args.checkpoint_dir, f"step-{step - 1}.pt")
            torch.save({"step": step - 1, "reference": initial,
                        "policy": job.get(policy.slice(hosts=0, gpus=0).weights.call_one())},
                       path)
            checkpoint_saved(path)
            print(f"asked to stop: saved {path}", flush=True)
            return
        time.sleep(args.step_seconds)
        tokens, targets = make_batch(step)
        shards = by_rank(job.get(reference.logprobs.call(tokens)))
        ref_logprobs = torch.empty(BATCH, VOCAB)
        for rank, shard in enumerate(shards):
            ref_logprobs[rank :: len(shards)] = shard
        try:
            results = by_rank(job.get(policy.train.call(step, tokens, targets, ref_logprobs)))
        except RankFailure as failure:
            if not args.catch:
                raise
            print(f"caught: {failure.summary}", flush=True)
            continue
        rows = sum(result["rows"] for result in results)
        loss = sum(result["loss"] * result["rows"] for result in results) / rows
        kl = sum(result["kl"] * result["rows"] for result in results) / rows
        print(f"step {step}/{args.steps} loss={loss:.4f} kl={kl:.6f}", flush=True)
        report(step, total_steps=args.steps, metrics={"loss": loss, "kl": kl})
    print("rl_kl: done", flush=True)


if __name__ == "__main__":
    with Job.from_env() as entered:
        main(entered)
