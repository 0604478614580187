"""A plain torchrun training script: nothing here knows about Monarch or monarch-operator.

It runs the same under ``torchrun --nnodes 2 --nproc-per-node 2 -m torchrun_demo.train`` and
under ``monarch-torchrun`` (or a MonarchJob's ``spec.spmd``): env:// rendezvous from the
variables torchrun sets, a few data-parallel SGD steps with gloo all-reduce, one line per rank.
Rank 0 also prints a ``MONARCH_PROGRESS`` line per step (plain JSON): under a MonarchJob it
becomes ``status.progress``; anywhere else it is one more line.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, args.steps + 1):
        generator = torch.Generator().manual_seed(step * 100 + rank)
        inputs = torch.randn(8, 4, generator=generator)
        loss = ((model(inputs) - inputs.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
        optimizer.step()
        total = torch.tensor([loss.item()])
        dist.all_reduce(total)
        if rank == 0:
            print(f"step {step}/{args.steps} mean_loss={total.item() / world:.4f}", flush=True)
            # Progress for the MonarchJob's status: one line, no import (harmless elsewhere).
            print("MONARCH_PROGRESS " + json.dumps({
                "step": step, "totalSteps": args.steps,
                "metrics": {"mean_loss": round(total.item() / world, 6)}}), flush=True)
    print(
        f"rank {rank}/{world} local_rank={os.environ['LOCAL_RANK']} "
        f"master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
        f"NCCL_SOCKET_IFNAME={os.environ.get('NCCL_SOCKET_IFNAME', '-')} "
        f"FOO={os.environ.get('FOO', '-')}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
