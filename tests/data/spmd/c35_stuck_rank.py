"""Field case C35: rank 2 blocks in native code (``time.sleep``) before a collective while the
other ranks wait in ``all_reduce``; every rank reports progress until then."""

import json
import os
import time

import torch
import torch.distributed as dist

STUCK_RANK = 2


def load_batch() -> None:
    time.sleep(3600)  # the stuck rank: native code, outside any collective


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.ones(2)
    for step in (1, 2):
        dist.all_reduce(tensor)
        print("MONARCH_PROGRESS " + json.dumps({"step": step}), flush=True)
    print(f"rank {rank} pid {os.getpid()} entering step 3", flush=True)
    if rank == STUCK_RANK:
        load_batch()
    dist.all_reduce(tensor)  # all_reduce #3: the others wait here forever
    print("MONARCH_PROGRESS " + json.dumps({"step": 3}), flush=True)
    # Without it a rank may exit while gloo still talks to it, and a peer aborts (exit 134).
    dist.destroy_process_group()


main()
