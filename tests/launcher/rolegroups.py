"""A user program for test_role_groups: every proc of both roles joins its role's
torch.distributed group (``monarch_operator.job.init_process_group``) and all-reduces, both roles
at the same time. Prints one ``group ...`` line per rank and one ``groups ...`` line per role."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from monarch.actor import Actor, endpoint

from monarch_operator.job import Job, init_process_group

VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "GLOO_SOCKET_IFNAME")


class GroupMember(Actor):
    """Joins the role's group and reports what its collectives return."""

    @endpoint
    def check(self) -> dict[str, object]:
        init_process_group(timeout_s=60)
        init_process_group()  # a second call does nothing
        ones = torch.ones(1)
        dist.all_reduce(ones)  # the role's world size
        ranks = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(ranks)  # 0 + 1 + ... + world - 1
        return {**{name: os.environ.get(name, "-") for name in VARIABLES},
                "sum": int(ones.item()), "rank_sum": int(ranks.item()),
                "backend": dist.get_backend()}


def main(job: Job) -> None:
    members = {role: job.procs(role).spawn(f"{role}_member", GroupMember)
               for role in ("trainer", "ref")}
    futures = {role: mesh.check.call() for role, mesh in members.items()}  # both at once
    for role, future in futures.items():
        values = sorted(job.get(future, timeout=120).items(), key=lambda item: item[0].rank)
        for _, got in values:
            print(f"group {role} rank={got['RANK']} local_rank={got['LOCAL_RANK']} "
                  f"world={got['WORLD_SIZE']} local_world={got['LOCAL_WORLD_SIZE']} "
                  f"master={got['MASTER_ADDR']}:{got['MASTER_PORT']} sum={got['sum']} "
                  f"rank_sum={got['rank_sum']} ifname={got['GLOO_SOCKET_IFNAME']} "
                  f"backend={got['backend']}", flush=True)
    for role, group in job.groups.items():
        print(f"groups {role} {group.master_addr}:{group.master_port} world={group.world_size} "
              f"local_world={group.local_world_size}", flush=True)
