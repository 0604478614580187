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
PASSED_THROUGH = ("NCCL_DEBUG", "EXTRA_FLAG", "NOT_ALLOWED_SECRET", "HF_TOKEN")


def command_lines_showing(value: str) -> list[str]:
    """Command lines of every process on this machine that contain ``value`` (as ps shows)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                text = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if value in text:
            found.append(text[:200])
    return found


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
    "token_in_command_lines": command_lines_showing(os.environ.get("HF_TOKEN") or "<unset>"),
}
print("REPORT " + json.dumps(report), flush=True)
dist.destroy_process_group()
