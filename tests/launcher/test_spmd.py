"""SPMD mode over real ssh: torchrun scripts unchanged, exit codes (field case C9), the in-code API.

Hosts are the loopback sshd daemons of tests/launcher/conftest.py; every rank is a real process
started by a real Monarch proc. After each run no worker, ssh client or script may be left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from monarch_operator.testing.loopback_sshd import (
    SshCluster,
    free_port,
    processes_mentioning,
    reap_processes_mentioning,
)
from tests.launcher.launching import Launch, run_launch

pytestmark = pytest.mark.ssh

DATA = Path(__file__).parent.parent / "data" / "spmd"
C9_RUNS = 50
C9_AT_ONCE = 3


def reports(launch: Launch) -> dict[int, tuple[str, dict[str, Any]]]:
    """``{rank: (output prefix, report)}`` from the ``REPORT {...}`` lines of every rank."""
    found = {}
    for line in launch.lines:
        prefix, marker, payload = line.partition("REPORT ")
        if marker:
            report = json.loads(payload)
            found[int(report["env"]["RANK"])] = (prefix.strip(), report)
    return found


def assert_no_script_left(tmp_path: Path) -> None:
    """No process started from this test's directory (a rank script) may outlive the run."""
    deadline = time.monotonic() + 5
    while (left := processes_mentioning(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"rank processes left behind: {left}"


def env_files_of(run_id: str) -> list[Path]:
    """The private env files (tokens) of run ``run_id`` (``--rdzv-id``) still on disk. Only
    that run's: the loopback hosts share this home with the launches of the other test worker,
    whose files live for a moment (one of them was taken for this run's, 2026-12-06)."""
    folder = Path.home() / ".cache" / "monarch-launch"
    return sorted(folder.glob(f"env-{run_id}-*.json")) if folder.is_dir() else []


def copy_script(tmp_path: Path, name: str) -> Path:
    """Put a data script in the test's directory, so stray ranks can be found by path."""
    target = tmp_path / name
    target.write_text((DATA / name).read_text())
    return target


def spmd_on_two_hosts(
    tmp_path: Path, cluster: SshCluster, monarch_port: int, *flags: str, **options: Any
) -> Launch:
    """``monarch-launch spmd`` on the first two loopback hosts, one slot each; ``options`` go
    to :func:`run_launch`."""
    a, b, _ = cluster.hosts
    return run_launch(
        tmp_path,
        cluster,
        f"{a} slots=1\n{b} slots=1\n",
        monarch_port,
        *flags,
        spmd=True,
        **options,
    )


def test_torchrun_script_runs_unchanged_on_two_hosts_by_two_slots(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    script = copy_script(tmp_path, "torchrun_allreduce.py")

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=2\n{b} slots=2\n",
        monarch_port,
        "--nnodes",
        "2",
        "--nproc_per_node",  # torchrun's underscore spelling is accepted too
        "2",
        "--rdzv-id",
        "run-42",
        "--env",
        "EXTRA_FLAG=on",
        str(script),
        "--epochs",
        "3",
        spmd=True,
        extra_env={
            "NCCL_DEBUG": "INFO",
            "NOT_ALLOWED_SECRET": "hunter2",
            "HF_TOKEN": "hf_not_for_ps_eyes",
        },
    )

    assert launch.returncode == 0, launch.describe()
    assert launch.lines[-1] == "monarch-launch: succeeded", launch.describe()
    ranks = reports(launch)
    assert sorted(ranks) == [0, 1, 2, 3], launch.describe()
    master_ports = {report["env"]["MASTER_PORT"] for _, report in ranks.values()}
    assert len(master_ports) == 1 and master_ports.pop().isdigit()
    for rank, (prefix, report) in ranks.items():
        host = (a, b)[rank // 2]
        assert report["env"] | {"MASTER_PORT": "-"} == {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % 2),
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": str(rank // 2),
            "GROUP_WORLD_SIZE": "2",
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": "4",
            "ROLE_NAME": "default",
            "MASTER_ADDR": a,
            "MASTER_PORT": "-",
            "TORCHELASTIC_RUN_ID": "run-42",
            # Allow-listed and --env variables cross ssh; others do not.
            "NCCL_DEBUG": "INFO",
            "EXTRA_FLAG": "on",
            "NOT_ALLOWED_SECRET": None,
            "HF_TOKEN": "hf_not_for_ps_eyes",
        }, f"rank {rank}"
        # Tokens reach the ranks without ever being on a command line (visible to all in ps).
        assert report["token_in_command_lines"] == [], report["token_in_command_lines"]
        assert (report["dist_rank"], report["dist_world"], report["sum"]) == (rank, 4, 10.0)
        assert report["ssh_server"] == host, "rank runs on its host"
        assert prefix == f"[spmd/{host}/{rank}]", "output is prefixed role/host/rank"
        assert report["argv"] == ["--epochs", "3"]
        assert report["cwd"] == str(tmp_path), "ranks start in the launcher's directory"
    assert_no_script_left(tmp_path)
    assert env_files_of("run-42") == [], "the workers deleted their env files"


def test_no_env_file_is_left_when_another_host_fails_preflight(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, _, _ = ssh_cluster.hosts

    launch = run_launch(
        tmp_path,
        ssh_cluster,
        f"{a} slots=1\n127.0.0.9 slots=1\n",  # nothing listens on 127.0.0.9
        monarch_port,
        "--host-wait",
        "0",
        "--rdzv-id",
        "run-unreachable",
        "train.py",
        spmd=True,
        extra_env={"HF_TOKEN": "hf_must_not_stay_on_disk"},
    )

    assert launch.returncode == 1 and "127.0.0.9: SSHUnreachable" in launch.lines[-1], (
        launch.describe()
    )
    assert env_files_of("run-unreachable") == [], f"token file left on {a}"


def test_module_and_no_python_forms(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    (tmp_path / "rank_module.py").write_text(
        "import os\nprint('module rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n"
    )

    module_run = spmd_on_two_hosts(tmp_path, ssh_cluster, monarch_port, "-m", "rank_module")
    shell_run = spmd_on_two_hosts(
        tmp_path,
        ssh_cluster,
        monarch_port,
        "--no-python",
        "/bin/sh",
        "-c",
        'echo "shell rank $RANK local $LOCAL_RANK"',
    )

    assert module_run.returncode == 0, module_run.describe()
    assert sorted(line for line in module_run.lines if "module rank" in line) == [
        f"[spmd/{a}/0] module rank 0 of 2",
        f"[spmd/{b}/1] module rank 1 of 2",
    ]
    assert shell_run.returncode == 0, shell_run.describe()
    assert sorted(line for line in shell_run.lines if "shell rank" in line) == [
        f"[spmd/{a}/0] shell rank 0 local 0",
        f"[spmd/{b}/1] shell rank 1 local 0",
    ]


def test_c9_every_rank_exits_3_gives_3_in_50_of_50_runs(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    # Field case C9 (mpich #7057, ompi #1344): two hosts, every worker exits 3 at once.
    # C9_AT_ONCE launches go at a time, each with its own folder and Monarch port: a launch
    # mostly waits on ssh and process start, and a loaded machine is where the race shows.
    script = copy_script(tmp_path, "exit_with.py")
    ports = [monarch_port]
    while len(ports) < C9_AT_ONCE:
        if (port := free_port(ssh_cluster.hosts)) not in ports:
            ports.append(port)

    def one_run(index: int) -> Launch:
        folder = tmp_path / f"run{index}"
        folder.mkdir()
        port = ports[index % C9_AT_ONCE]
        return spmd_on_two_hosts(folder, ssh_cluster, port, "--quiet", str(script), "3")

    launches: list[Launch] = []
    with ThreadPoolExecutor(C9_AT_ONCE) as pool:
        for start in range(0, C9_RUNS, C9_AT_ONCE):  # a port is used by one launch at a time
            launches.extend(pool.map(one_run, range(start, min(start + C9_AT_ONCE, C9_RUNS))))
    codes = [launch.returncode for launch in launches]
    wrong = [(index + 1, launch) for index, launch in enumerate(launches) if launch.returncode != 3]
    if wrong:
        run, launch = wrong[0]
        pytest.fail(f"{len(wrong)} of {C9_RUNS} runs did not exit 3; run {run}: {launch.describe()}")
    assert codes == [3] * C9_RUNS
    assert all("exited with code 3" in launch.lines[-1] for launch in launches), \
        launches[0].describe()
    for port in ports[1:]:
        assert not reap_processes_mentioning(f":{port}"), f"processes left on port {port}"
    assert_no_script_left(tmp_path)


def test_all_ranks_exiting_0_gives_0(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    script = copy_script(tmp_path, "exit_with.py")

    launch = spmd_on_two_hosts(
        tmp_path,
        ssh_cluster,
        monarch_port,
        str(script),
        "0",
    )

    assert launch.returncode == 0, launch.describe()


def _is_running(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) ``sleep`` process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and cmdline.startswith(b"sleep")


def test_sigterm_stops_the_children_each_rank_script_started(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, _, _ = ssh_cluster.hosts
    script = copy_script(tmp_path, "child_sleeper.py")

    launch = spmd_on_two_hosts(
        tmp_path,
        ssh_cluster,
        monarch_port,
        str(script),
        str(tmp_path),
        sigterm_after=f"[spmd/{a}/0] children started",
    )

    children = [int(path.read_text()) for path in sorted(tmp_path.glob("child-*.pid"))]
    try:
        assert "monarch-launch: stacks of every rank (stopped: terminated by signal 15 " \
            "(SIGTERM))" in launch.lines, launch.describe()
        assert launch.returncode == 143, launch.describe()
        assert len(children) == 2, launch.describe()
        deadline = time.monotonic() + 10
        while (running := [pid for pid in children if _is_running(pid)]) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert not running, f"children of rank scripts still running: {running}"
    finally:
        for pid in children:
            if _is_running(pid):
                os.kill(pid, signal.SIGKILL)
    assert_no_script_left(tmp_path)


def test_rank_killed_by_sigkill_gives_137_and_the_others_are_stopped(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    _, b, _ = ssh_cluster.hosts
    script = copy_script(tmp_path, "exit_with.py")

    launch = spmd_on_two_hosts(
        tmp_path,
        ssh_cluster,
        monarch_port,
        str(script),
        "kill",
        "1",
    )

    assert launch.returncode == 137, launch.describe()
    failure = launch.lines[-1]
    assert failure.startswith(
        f"monarch-launch: failed: rank 1 of 2 (host {b}, local rank 0) "
        "was killed by signal 9 (exit 137)"
    ), launch.describe()
    # Rank 0 slept for 120 s; it was stopped at once, not waited for.
    assert launch.wall_s < 60, launch.describe()
    assert_no_script_left(tmp_path)


def test_in_code_api_catches_the_exception_raised_in_train(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    env = {key: value for key, value in os.environ.items() if not key.startswith("MONARCH_")}
    env["HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"] = "500ms"
    output = tmp_path / "api.log"
    with output.open("wb") as sink:
        result = subprocess.run(
            [
                sys.executable,
                str(DATA / "api_catch.py"),
                f"{a},{b}",
                str(ssh_cluster.port),
                str(ssh_cluster.key),
                str(monarch_port),
                str(ssh_cluster.known_hosts),
            ],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=150,
            check=False,
        )
    text = output.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, text
    seen = json.loads(lines[0].removeprefix("RESULT "))

    assert seen["values"] == [0.02, 10.02], "train's return values, by rank"
    caught = seen["caught"]
    assert caught["ranks"] == [1] and caught["host"] == b, text
    assert caught["cause_type"] == "ValueError"
    assert caught["cause"] == "loss is NaN at step 7 on rank 1"
    assert caught["message"] == (
        f"rank 1 of 2 (host {b}, local rank 0) raised ValueError: loss is NaN at step 7 on rank 1"
    )
    assert "in train" in caught["traceback"] and "Traceback" in caught["traceback"]
    assert seen["exits"] == {
        "message": f"rank 0 of 2 (host {a}, local rank 0) exited with code 4: SystemExit(4)",
        "cause": "SystemExit(4)",
        "code": 4,
    }
    assert "is not picklable" in seen["lock"]["message"], seen["lock"]
    assert seen["dies"]["code"] == 9 and f"rank 1 of 2 (host {b}" in seen["dies"]["message"]
    assert seen["after_death"] == {
        "runtime_error": f"this launcher cannot run again: the process of rank 1 on {b} died; "
        "close() it and make a new one"
    }


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--node-rank", "1"], "--node-rank is not needed"),
        (["--nnodes", "1:4"], "elastic ranges are not supported"),
        (["--nnodes", "3"], "--nnodes 3 asks for more hosts than the 2 given"),
        (["--nproc-per-node", "2"], "--nproc-per-node 2 exceeds the slots of"),
        (["--max-restarts", "3"], "restarts are not supported"),
    ],
)
def test_unsupported_torchrun_flags_are_refused_before_any_ssh(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int, flags: list[str], message: str
) -> None:

    launch = spmd_on_two_hosts(
        tmp_path,
        ssh_cluster,
        monarch_port,
        *flags,
        "train.py",
    )

    assert launch.returncode == 2, launch.describe()
    assert message in launch.lines[-1], launch.describe()
    assert not any("hosts ready" in line for line in launch.lines), "nothing was contacted"


def test_json_output_reports_plan_progress_and_the_failing_rank(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    a, b, _ = ssh_cluster.hosts
    script = copy_script(tmp_path, "exit_with.py")

    launch = spmd_on_two_hosts(
        tmp_path,
        ssh_cluster,
        monarch_port,
        "--json",
        str(script),
        "5",
    )

    records = [json.loads(line) for line in launch.lines if line.startswith("{")]
    events = [record["event"] for record in records]
    assert launch.returncode == 5, launch.describe()
    assert events[0] == "progress" and "plan" in events and events[-1] == "result", events
    assert {"event": "hosts_ready", "ready": 2, "total": 2} in [
        {key: value for key, value in record.items() if key != "t"} for record in records
    ]
    plan = next(record["plan"] for record in records if record["event"] == "plan")
    assert plan == {"mode": "spmd", "hosts": [a, b], "nproc_per_node": 1, "world_size": 2}
    result = records[-1]
    assert (result["status"], result["exit_code"]) == ("failed", 5)
    assert sorted(failure["rank"] for failure in result["failures"]) == [0, 1]
    # The first failure decides; the other rank exited 5 too, unless the launcher's stop
    # (SIGTERM, 143) reached it while its Python was still starting.
    assert result["failures"][0]["exit_code"] == 5
    assert result["failures"][1]["exit_code"] in (5, 143)


def wait_for_rank_stack_taker(script: str, rank: int, timeout_s: float = 60.0) -> None:
    """Wait until the rank ``rank`` running ``script`` has written its pid file in its stacks
    folder (:mod:`launcher.session.rankstacks`: the bootstrap writes it once SIGUSR2 dumps its
    stack); AssertionError after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid, _ in processes_mentioning(script):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            env = dict(item.decode(errors="replace").partition("=")[::2] for item in environ)
            folder = env.get("MONARCH_STACKS_DIR")
            if env.get("RANK") == str(rank) and folder and Path(
                    folder, f"rank-{rank}.pid").exists():
                return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} of {script} did not start within {timeout_s}s")


def test_worker_lost_mid_run_fails_the_ranks_of_that_host(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    _, b, _ = ssh_cluster.hosts
    script = copy_script(tmp_path, "exit_with.py")

    def kill_worker_on_b() -> None:
        # "2 ranks ready" means the rank actors are up; their scripts may still be starting.
        # Wait until rank 0 (on the host that stays) has registered its stack taker, or the
        # stacks taken after the loss truthfully find "no rank running" there.
        wait_for_rank_stack_taker(str(script), rank=0)
        for pid, args in processes_mentioning(f"tcp://{b}:{monarch_port}"):
            # The worker itself: not the launcher's ssh client, not the session guard above it.
            worker = "run_worker_loop_forever" in args and "monarch-session-guard" not in args
            if worker and not args.startswith("ssh "):
                os.kill(pid, signal.SIGKILL)

    launch = spmd_on_two_hosts(
        tmp_path,
        ssh_cluster,
        monarch_port,
        str(script),
        "kill",
        "99",  # no such rank: every rank sleeps until stopped
        sigterm_after="monarch-launch: 2 ranks ready",
        then=kill_worker_on_b,
    )

    # Every rank's stack from the host still there, before its rank is stopped (issue 35).
    a = ssh_cluster.hosts[0]
    assert f"monarch-launch: stacks of every rank (host {b} lost)" in launch.lines, (
        launch.describe())
    assert f"monarch-launch:   rank 0 on {a}: no collective known at exit_with.py:12 <module>" \
        in launch.lines, launch.describe()
    assert launch.returncode == 1, launch.describe()
    assert launch.lines[-1] == (
        f"monarch-launch: failed: rank 1 of 2 (host {b}, local rank 0) was lost: the Monarch "
        f"worker on {b} was killed by signal SIGKILL (9)"
    ), launch.describe()
    assert_no_script_left(tmp_path)
