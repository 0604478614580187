"""The in-code SPMD API as a notebook would use it: run ``train`` on every rank, then catch the
exception one rank raises. argv: hosts (a,b), sshd port, key file, Monarch port, known_hosts
file. Prints one JSON line with what the controller saw."""

import json
import os
import sys
import threading

from monarch_operator.launcher import SpmdRunError, spmd_launcher


def train(config: dict) -> float:
    rank = int(os.environ["RANK"])
    if rank == config["failing_rank"]:
        raise ValueError(f"loss is NaN at step 7 on rank {rank}")
    return rank * config["scale"] + int(os.environ["WORLD_SIZE"]) / 100


def exits(config: dict) -> None:
    if os.environ["RANK"] == "0":
        sys.exit(4)


def returns_a_lock(config: dict) -> object:
    return threading.Lock()


def dies(config: dict) -> None:
    if os.environ["RANK"] == "1":
        os._exit(9)


def attempt(function, name: str) -> None:
    try:
        launcher.run(function, {})
        seen[name] = "no error"
    except SpmdRunError as error:
        seen[name] = {
            "message": str(error).splitlines()[0],
            "cause": repr(error.__cause__),
            "code": error.exit_code,
        }
    except RuntimeError as error:
        seen[name] = {"runtime_error": str(error)}


hosts, ssh_port, key, monarch_port, known_hosts = sys.argv[1:6]
seen: dict = {}
with spmd_launcher(
    hosts=hosts,
    nproc_per_node=1,
    ssh_key=key,
    known_hosts=known_hosts,
    ssh_port=int(ssh_port),
    ssh_user="root",
    monarch_port=int(monarch_port),
    quiet=True,
    attach_timeout_s=20.0,
) as launcher:
    seen["values"] = launcher.run(train, {"failing_rank": -1, "scale": 10})
    try:
        launcher.run(train, {"failing_rank": 1, "scale": 10})
    except SpmdRunError as error:
        first = error.failures[0]
        seen["caught"] = {
            "ranks": [failure.rank for failure in error.failures],
            "host": first.host,
            "cause_type": type(error.__cause__).__name__,
            "cause": str(error.__cause__),
            "message": str(error).splitlines()[0],
            "traceback": first.error,
        }
    attempt(exits, "exits")
    attempt(returns_a_lock, "lock")
    attempt(dies, "dies")
    attempt(exits, "after_death")
print("RESULT " + json.dumps(seen), flush=True)
