"""A user program for test_named_roles: every proc of every role (whatever their names) joins
its role's torch.distributed group and all-reduces, all roles at the same time, then reports
what it sees. Prints one ``role ...`` line per rank and one ``group ...`` line per role."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from monarch.actor import Actor, endpoint

from monarch_operator.job import Job, init_process_group

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class RoleMember(Actor):
    """Joins the role's group and reports its variables and what the all-reduce saw."""

    def __init__(self, role: str) -> None:
        self.role = role

    @endpoint
    def report(self) -> dict[str, object]:
        init_process_group(timeout_s=60)
        ones = torch.ones(1)
        dist.all_reduce(ones)  # the role's world size: the group holds this role alone
        return {**{name: os.environ.get(name, "-") for name in VARIABLES},
                "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
                "role": self.role, "sum": int(ones.item()), "backend": dist.get_backend()}


def main(job: Job) -> None:
    members = {role: mesh.spawn(f"{role}member", RoleMember, role)
               for role, mesh in job.roles.items()}
    futures = {role: member.report.call() for role, member in members.items()}  # all at once
    for future in futures.values():
        values = sorted(job.get(future, timeout=120).items(), key=lambda item: item[0].rank)
        for _, got in values:
            print(f"role {got['role']} rank={got['RANK']} world={got['WORLD_SIZE']} "
                  f"local_rank={got['LOCAL_RANK']} "
                  f"cuda={got['CUDA_VISIBLE_DEVICES'] or 'empty'} "
                  f"master={got['MASTER_ADDR']}:{got['MASTER_PORT']} sum={got['sum']} "
                  f"backend={got['backend']}", flush=True)
    for role, group in job.groups.items():
        print(f"group {role} {group.master_addr}:{group.master_port} world={group.world_size}",
              flush=True)
    print(f"roles in order: {','.join(job.roles)}", flush=True)
