"""``kubectl monarch SUBCOMMAND JOB [-n NAMESPACE]``: one MonarchJob as a user asks about it.

- ``status JOB``: phase and message, workers Ready, restarts, queue, last checkpoint, and the
  attempts table (class, reason, exit code, failing role/rank/host, times, checkpoint).
- ``logs JOB [--attempt K] [--role R] [--rank N] [-f]``: the launcher's output of attempt K
  (default the current one), filtered to a role's or a rank's lines.
- ``hosts JOB``: rank -> host -> pod -> node -> GPU, as the launcher places ranks.
- ``exec JOB --rank N [--role R] -- CMD...``: CMD in the worker pod that hosts that rank.
- ``describe JOB``: status, attempts, hosts and the job's recent Events.
- ``stacks JOB [--wait S]``: every rank's stack of a running job, without stopping it; of
  a finished one, the last dump kept (see :mod:`.stacks`).

It runs ``kubectl`` (the one on PATH, or ``$KUBECTL``) with the same context, kubeconfig and
namespace rules, so it works wherever kubectl does (``kubectl`` finds ``kubectl-monarch`` on
PATH and passes the rest of the command line). Exit status: kubectl's on a kubectl failure, 2
for bad arguments, 1 for a job or rank that does not exist.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from monarch_operator import constants, names
from monarch_operator.controller.spec.spec import JobSpec
from monarch_operator.plugin import stacks as stackviews
from monarch_operator.plugin import views

RESOURCE = "monarchjobs.monarch-operator.dev"
LAUNCHER_CONTAINER = "launcher"  # controller/builders/launcher.py's (a unit test keeps them equal)


class KubectlError(RuntimeError):
    """kubectl failed; ``code`` is its exit status and the message its stderr."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Kube:
    """Runs kubectl for one namespace (None: kubectl's own default)."""

    def __init__(self, namespace: str | None) -> None:
        self.binary = os.environ.get("KUBECTL", "kubectl")
        self.namespace_args = ["-n", namespace] if namespace else []

    def json(self, *args: str) -> Any:
        """``kubectl get ARGS -o json``, parsed.

        Raises:
            KubectlError: kubectl failed (the job does not exist, no cluster ...).
        """
        result = subprocess.run([self.binary, "get", *args, *self.namespace_args, "-o", "json"],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise KubectlError(result.stderr.strip(), result.returncode)
        return json.loads(result.stdout)

    def capture(self, *args: str) -> subprocess.CompletedProcess[str]:
        """kubectl ARGS in this namespace, its output kept."""
        return subprocess.run([self.binary, *self.namespace_args, *args], capture_output=True,
                              text=True, check=False)

    def run(self, *args: str) -> int:
        """kubectl ARGS in this namespace (given first: ARGS may end with a command after
        ``--``), its output straight to ours; its exit status."""
        return subprocess.run([self.binary, *self.namespace_args, *args],
                              check=False).returncode



def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module doc)."""
    parser = argparse.ArgumentParser(prog="kubectl monarch",
                                     description="Inspect a MonarchJob: status, logs, hosts, "
                                                 "exec, describe, stacks.")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("job", metavar="JOB", help="the MonarchJob's name")
        sub.add_argument("-n", "--namespace", help="its namespace (default: kubectl's)")
        return sub

    command("status", "phase, workers, restarts, queue and the attempts table")
    logs = command("logs", "the launcher's output of one attempt, optionally one role or rank")
    logs.add_argument("--attempt", type=int, help="attempt number (default: the current one)")
    logs.add_argument("--role", help="only this role's lines (trainer, ref, or spmd's role)")
    logs.add_argument("--rank", type=int, help="only this rank's lines")
    logs.add_argument("-f", "--follow", action="store_true", help="stream new output")
    command("hosts", "rank -> host -> pod -> node -> GPU")
    run = command("exec", "run a command in the worker pod that hosts a rank")
    run.add_argument("--rank", type=int, required=True, help="the rank")
    run.add_argument("--role", help="its role (default: trainer, or the SPMD ranks)")
    run.epilog = "Give the command after --: kubectl monarch exec JOB --rank 3 -- nvidia-smi"
    dump = command("stacks", "every rank's stack of a running job (it goes on), or the last "
                             "dump kept of a finished one")
    dump.add_argument("--wait", type=float, default=30.0, metavar="S",
                      help="seconds to wait for the running job's dump (default 30)")
    command("describe", "status, attempts, hosts and recent Events")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (see the module doc)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # exec's command is everything after the first "--" (its own flags may look like ours).
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:cut])
    args.cmd = argv[cut + 1:]
    kube = Kube(args.namespace)
    try:
        body = kube.json(RESOURCE, args.job)
        return int(COMMANDS[args.command](kube, body, args))
    except KubectlError as error:
        print(f"kubectl monarch: {error}", file=sys.stderr)
        return error.code or 1
    except LookupError as error:
        print(f"kubectl monarch: {error.args[0]}", file=sys.stderr)
        return 1


def _pods(kube: Kube, body: dict[str, Any], role: str) -> list[dict[str, Any]]:
    selector = (f"{constants.LABEL_JOB}={body['metadata']['name']},"
                f"{constants.LABEL_ROLE}={role}")
    return list(kube.json("pods", "-l", selector)["items"])


def status(kube: Kube, body: dict[str, Any], args: argparse.Namespace) -> int:
    print("\n".join(views.status_lines(body)))
    rows = views.attempts_table(body.get("status") or {})
    if len(rows) > 1:
        print()
        print(views.table(rows))
    return 0


def logs(kube: Kube, body: dict[str, Any], args: argparse.Namespace) -> int:
    pod = views.launcher_pod_name(body, args.attempt)
    try:
        kube.json("pod", pod)
    except KubectlError as error:  # say why there is none, not kubectl's NotFound
        if "NotFound" not in str(error) and "not found" not in str(error):
            raise
        print(f"kubectl monarch logs: {views.no_launcher_message(body, args.attempt, pod)}",
              file=sys.stderr)
        return 1
    if args.role is None and args.rank is None:
        return kube.run("logs", pod, *(["-f"] if args.follow else []))
    command = [kube.binary, *kube.namespace_args, "logs", pod, *(["-f"] if args.follow else [])]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        for line in views.filter_lines(process.stdout, args.role, args.rank):
            print(line, end="", flush=True)
    return process.returncode


def hosts(kube: Kube, body: dict[str, Any], args: argparse.Namespace) -> int:
    print(views.table(views.hosts_table(body, _pods(kube, body, constants.ROLE_WORKER))))
    return 0


def exec_rank(kube: Kube, body: dict[str, Any], args: argparse.Namespace) -> int:
    cmd = args.cmd
    if not cmd:
        print("kubectl monarch exec: give the command after --", file=sys.stderr)
        return 2
    place = views.find_rank(views.rank_places(body), args.rank, args.role)
    pod = JobSpec.from_body(body).worker_pod_names()[place.ordinal]
    if views.finished(body) and not _exists(kube, "pod", pod):  # kept with KeepAll
        phase = body["status"]["phase"]
        print(f"kubectl monarch exec: {body['metadata']['name']} is {phase}: its workers were "
              f"released ({pod} hosted {place.role} rank {place.rank}); `kubectl monarch logs` "
              "shows what the ranks printed", file=sys.stderr)
        return 1
    return kube.run("exec", pod, "-c", "worker", "--", *cmd)


def _exists(kube: Kube, *what: str) -> bool:
    try:
        kube.json(*what)
    except KubectlError:
        return False
    return True


def describe(kube: Kube, body: dict[str, Any], args: argparse.Namespace) -> int:
    status(kube, body, args)
    print()
    hosts(kube, body, args)
    events = kube.json("events", "--field-selector",
                       f"involvedObject.name={body['metadata']['name']},"
                       f"involvedObject.kind=MonarchJob")["items"]
    events.sort(key=lambda event: str(event.get("lastTimestamp") or event.get("eventTime")
                                      or ""))
    if events:
        print()
        print(views.table([["LAST SEEN", "TYPE", "REASON", "MESSAGE"]] + [
            [str(event.get("lastTimestamp") or event.get("eventTime") or ""),
             str(event.get("type") or ""), str(event.get("reason") or ""),
             " ".join(str(event.get("message") or "").split())[:160]]
            for event in events[-15:]]))
    return 0


def stacks(kube: Kube, body: dict[str, Any], args: argparse.Namespace) -> int:
    """Ask a running job's launcher for every rank's stack and print it once it is in the
    ConfigMap; else print the last dump kept, or the attempts' per-rank lines."""
    configmap = names.progress_configmap(body["metadata"]["name"])
    before = stackviews.stored_dump(_json_or_none(kube, "configmap", configmap))
    pod = views.launcher_pod_name(body, None)
    if not views.finished(body) and _exists(kube, "pod", pod):
        asked = kube.capture("exec", pod, "-c", LAUNCHER_CONTAINER, "--",
                             *stackviews.REQUEST_COMMAND)
        if asked.returncode == 0:
            deadline = time.monotonic() + args.wait
            while time.monotonic() < deadline:
                now = stackviews.stored_dump(_json_or_none(kube, "configmap", configmap))
                if now and stackviews.dump_header(now) != stackviews.dump_header(before):
                    print(now, end="")
                    return 0
                time.sleep(1.0)
            print(f"kubectl monarch stacks: no dump from launcher pod {pod} within "
                  f"{args.wait:g}s; showing the last one kept", file=sys.stderr)
        else:
            print(f"kubectl monarch stacks: could not ask launcher pod {pod}: "
                  f"{asked.stderr.strip()}", file=sys.stderr)
    if before:
        print(before, end="")
        return 0
    lines = stackviews.recorded_lines(body)
    if lines:
        print("\n".join(lines))
        return 0
    print(f"kubectl monarch stacks: no stack dump of job {body['metadata']['name']} (a dump "
          "is kept once a stall, a stop or a request took one; attach mode and "
          "launcher.command take none)", file=sys.stderr)
    return 1


def _json_or_none(kube: Kube, *what: str) -> Any:
    try:
        return kube.json(*what)
    except KubectlError:
        return None


COMMANDS = {"status": status, "logs": logs, "hosts": hosts, "exec": exec_rank,
            "describe": describe, "stacks": stacks}
