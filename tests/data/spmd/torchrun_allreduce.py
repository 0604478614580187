"""A plain torchrun script, not aware of Monarch: env:// rendezvous, gloo all-reduce, one JSON line.

Used unchanged by tests/launcher/test_spmd.py (``monarch-launch spmd ... torchrun_allreduce.py``).
"""

import json
import os
import sys

import torch
import torch.distributed as dist

TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)
PASSED_THROUGH = ("NCCL_DEBUG", "EXTRA_FLAG", "NOT_ALLOWED_SECRET")

dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
report = {
    "env": {name: os.environ.get(name) for name in TORCHRUN_VARIABLES + PASSED_THROUGH},
    "sum": total.item(),
    "dist_rank": dist.get_rank(),
    "dist_world": dist.get_world_size(),
    "ssh_server": (os.environ.get("SSH_CONNECTION", "").split() or ["-"] * 3)[2],
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
}
print("REPORT " + json.dumps(report), flush=True)
dist.destroy_process_group()
