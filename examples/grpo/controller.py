"""The GRPO example's controller: one RL post-training loop over four named roles.

Run it

- in a MonarchJob with four worker groups (``examples/grpo/monarchjob.yaml``):
  ``spec.launcher.program: grpo.controller:main``;
- over any hostfile: ``monarch-launch run --hostfile hosts --role generator=2 --role trainer=1
  --role reference=1 --role reward=1,gpus=0 --ssh-key KEY grpo.controller:main --steps 5``
  (docs/roles.md has the flags).

Each step: the generator samples ``--group-size`` completions for each of ``--prompts``
prompts; the reward model and the reference score them; the trainer takes a GRPO step (group-
relative advantages, KL penalty against the reference) and the generator takes the new weights,
so the next step samples from the updated policy. The controller prints ``step k/n reward=...
loss=... kl=...`` and reports progress (``kubectl get monarchjobs`` STEP and PROGRESS).
With ``--min-reward R`` the program fails (exit 1) if the last step's mean reward is below R:
the loop must learn, not only run.
"""

from __future__ import annotations

import argparse
import sys

import torch

from grpo.actors import VOCAB, Generator, Reference, Reward, Trainer
from monarch_operator.job import Job, report

ROLES = ("generator", "trainer", "reference", "reward")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="grpo.controller")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    parser.add_argument("--beta", type=float, default=0.02, help="weight of the KL penalty")
    parser.add_argument("--min-reward", type=float, default=0.0,
                        help="fail if the last step's mean reward is below this")
    return parser.parse_args(argv)


def by_rank(values: object) -> list[object]:
    """A ValueMesh's values in rank order."""
    return [value for _, value in sorted(values.items(), key=lambda item: item[0].rank)]


def gather_rows(shards: list[dict[str, torch.Tensor]], key: str, rows: int) -> torch.Tensor:
    """One ``[rows, ...]`` tensor from per-rank shards that each say which rows they hold."""
    first = shards[0][key]
    whole = torch.empty((rows, *first.shape[1:]), dtype=first.dtype)
    for shard in shards:
        whole[shard["rows"]] = shard[key]
    return whole


def main(job: Job) -> None:
    """Run ``--steps`` GRPO steps over the generator, trainer, reference and reward roles."""
    args = parse_args(sys.argv[1:])
    missing = [role for role in ROLES if role not in job.roles]
    if missing:
        raise SystemExit(f"grpo: the job has no role {', '.join(missing)}; it needs "
                         f"{', '.join(ROLES)} (roles: {', '.join(job.roles)})")
    generator = job.roles["generator"].spawn("generator", Generator)
    trainer = job.roles["trainer"].spawn("trainer", Trainer, args.beta)
    reference = job.roles["reference"].spawn("reference", Reference)
    reward = job.roles["reward"].spawn("reward", Reward)
    for mesh in (generator, trainer, reference, reward):
        for where in by_rank(job.get(mesh.where.call())):
            print(f"placement {where['role']} rank={where['rank']} host={where['host']} "
                  f"gpus={where['gpus']} world={where['world']}", flush=True)

    mean_reward = 0.0
    for step in range(1, args.steps + 1):
        prompts = torch.randint(0, VOCAB, (args.prompts,),
                                generator=torch.Generator().manual_seed(step))
        samples = by_rank(job.get(generator.generate.call(step, prompts, args.group_size)))
        versions = {sample["version"] for sample in samples}
        if versions != {step - 1}:
            raise RuntimeError(f"step {step}: generator served weights {sorted(versions)}, "
                               f"expected version {step - 1}")
        completions = gather_rows(samples, "completions", args.prompts)
        rewards = job.get(reward.slice(hosts=0, gpus=0).score.call_one(prompts, completions))
        ref_logprobs = gather_rows(by_rank(job.get(reference.logprobs.call(prompts, completions))),
                                   "logprobs", args.prompts)
        results = by_rank(job.get(trainer.train.call(prompts, completions, rewards, ref_logprobs)))
        weights = job.get(trainer.slice(hosts=0, gpus=0).weights.call_one())
        job.get(generator.update_weights.call(step, weights))  # push weights every step
        rows = sum(result["rows"] for result in results)
        loss = sum(result["loss"] * result["rows"] for result in results) / rows
        kl = sum(result["kl"] * result["rows"] for result in results) / rows
        mean_reward = float(rewards.mean())
        print(f"step {step}/{args.steps} reward={mean_reward:.3f} loss={loss:.4f} kl={kl:.5f}",
              flush=True)
        report(step, total_steps=args.steps,
               metrics={"reward": mean_reward, "loss": loss, "kl": kl})
    if mean_reward < args.min_reward:
        raise SystemExit(f"grpo: mean reward {mean_reward:.3f} after {args.steps} steps is "
                         f"below --min-reward {args.min_reward}")
    print("grpo: done", flush=True)


if __name__ == "__main__":
    with Job.from_env() as entered:
        main(entered)
