"""Test program of issue 35 (role mode, the job API): trainer rank ``--stuck-rank`` sleeps in
native code (``time.sleep``) in ``load_batch`` before ``all_reduce`` #3 while the other trainer
ranks wait in it; the ref role answers every step. The controller reports every step.

``monarch-launch run stuckrole:main [--steps N] [--stuck-rank R] [--stuck-attempt A]``; the
workers must import this module (put its folder on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from monarch.actor import Actor, endpoint

from monarch_operator.job import init_process_group, report

# A test that makes this folder beside the program learns from it when each trainer rank has
# entered a step: each touches attempt<A>-step<N>-rank<R> there first.
MARKS = Path(__file__).with_name("stuckrole-marks")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="stuckrole")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--stuck-rank", type=int, default=2)
    parser.add_argument("--stuck-attempt", help="get stuck only in this MONARCH_ATTEMPT")
    return parser.parse_args(list(argv))


def load_batch() -> None:
    time.sleep(3600)  # the stuck rank: native code, outside any collective


class Trainer(Actor):
    def __init__(self, stuck_rank: int, stuck_attempt: str | None) -> None:
        import torch

        init_process_group("gloo")
        self.rank = int(os.environ["RANK"])
        attempt = os.environ.get("MONARCH_ATTEMPT")
        self.stuck = self.rank == stuck_rank and stuck_attempt in (None, attempt)
        self.tensor = torch.ones(2)

    @endpoint
    def step(self, number: int) -> float:
        import torch.distributed as dist

        if MARKS.is_dir():
            attempt = os.environ.get("MONARCH_ATTEMPT", "0")
            (MARKS / f"attempt{attempt}-step{number}-rank{self.rank}").touch()
        if number == 3 and self.stuck:
            load_batch()
        dist.all_reduce(self.tensor)  # all_reduce #number: the others wait here at step 3
        return float(self.tensor[0])


class Reference(Actor):
    @endpoint
    def score(self, number: int) -> int:
        return number


def main(job: Any) -> None:
    args = parse_args(sys.argv[1:])
    trainer = job.trainer.spawn("trainer", Trainer, args.stuck_rank, args.stuck_attempt)
    reference = job.ref.spawn("reference", Reference)
    for number in range(1, args.steps + 1):
        job.get(trainer.step.call(number))
        job.get(reference.score.call(number))
        report(number, total_steps=args.steps)
        print(f"step {number}/{args.steps} done", flush=True)
