"""``kubectl logs`` and ``kubectl exec`` reach the node agent's kubelet API through the apiserver:
output, ``--tail``, ``-c``, ``-f`` (streaming, and ending with the container), ``--previous``
after a restart; exec inside the container (its /etc/hostname, volumes, env, working directory,
user), with stdin (``-i``) and the command's exit code as kubectl's."""

from __future__ import annotations

import os
import selectors
import subprocess
import time

import pytest

from tests.cluster.test_agent_kubelet import (
    MOUNT,
    SHARED,
    apply_pod,
    container,
    get_json,
    pod_in_phase,
    wait_until,
)

pytestmark = pytest.mark.cluster


def running_container(kubectl, namespace: str, pod: str, name: str, restarts: int = 0):
    """Wait until the container runs (after ``restarts`` restarts); returns the pod."""
    def ready():
        current = get_json(kubectl, "pod", pod, "-n", namespace)
        statuses = ((current or {}).get("status") or {}).get("containerStatuses") or []
        status = next((s for s in statuses if s["name"] == name), {})
        return current if "running" in (status.get("state") or {}) and (
            status.get("restartCount") == restarts) else None
    return wait_until(ready, 60, f"container {name} of {pod} running after {restarts} restarts")


def logs_containing(kubectl, namespace: str, text: str, *args: str) -> str:
    return wait_until(lambda: (out := kubectl("logs", "-n", namespace, *args, check=False))
                      and text in out and out, 30, f"kubectl logs {' '.join(args)} showing {text}")


def run_kubectl(kubectl, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True,
                          env=kubectl.env, check=False, timeout=60)


def read_lines(process: subprocess.Popen, count: int, timeout: float) -> list[str]:
    """``count`` lines of the process's stdout, or fail after ``timeout`` s (a hang guard)."""
    lines: list[str] = []
    buffered = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while len(lines) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"only {lines} after {timeout}s"
            if not selector.select(left):
                continue
            chunk = os.read(process.stdout.fileno(), 4096)
            assert chunk, f"kubectl logs -f ended after {lines}"
            buffered += chunk
            *complete, buffered = buffered.split(b"\n")
            lines += [line.decode() for line in complete]
    return lines[:count]


def test_logs_show_the_output_of_each_container_and_the_last_lines(kubectl, namespace):
    apply_pod(kubectl, namespace, "talker", "Never", containers=[
        container("main", "for i in 1 2 3 4 5; do echo main $i; done; echo oops >&2; sleep 300"),
        container("side", "echo side says hi; sleep 300")])
    running_container(kubectl, namespace, "talker", "main")
    out = logs_containing(kubectl, namespace, "oops", "talker", "-c", "main")
    assert out == "main 1\nmain 2\nmain 3\nmain 4\nmain 5\noops\n"
    assert kubectl("logs", "-n", namespace, "talker", "-c", "main", "--tail=2") == "main 5\noops\n"
    assert kubectl("logs", "-n", namespace, "talker", "-c", "main",
                   "--limit-bytes=13") == "main 1\nmain 2"
    assert logs_containing(kubectl, namespace, "hi", "talker", "-c", "side") == "side says hi\n"
    refused = run_kubectl(kubectl, "logs", "-n", namespace, "talker", "-c", "main",
                          "--timestamps")
    assert refused.returncode != 0 and "without timestamps" in refused.stderr


def test_logs_follow_streams_new_lines_and_ends_with_the_container(kubectl, namespace):
    apply_pod(kubectl, namespace, "ticker", "Never", containers=[
        container("main", "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo tick $i; "
                          "sleep 0.1; done")])
    running_container(kubectl, namespace, "ticker", "main")
    before = logs_containing(kubectl, namespace, "tick 2", "ticker")
    last_before = int(before.splitlines()[-1].split()[1])
    with subprocess.Popen(["kubectl", "logs", "-n", namespace, "-f", "ticker"],
                          stdout=subprocess.PIPE, env=kubectl.env) as follow:
        try:
            ticks = [int(line.split()[1]) for line in read_lines(follow, last_before + 5, 60)]
        finally:
            follow.kill()
    assert ticks == list(range(1, last_before + 6))  # the start, then lines written later

    apply_pod(kubectl, namespace, "short", "Never", containers=[
        container("main", "echo one; sleep 3; echo two")])
    running_container(kubectl, namespace, "short", "main")
    finished = run_kubectl(kubectl, "logs", "-n", namespace, "-f", "short")
    assert (finished.returncode, finished.stdout) == (0, "one\ntwo\n")


def test_logs_previous_show_the_instance_before_a_restart(kubectl, namespace):
    """Each instance prints its start count (kept in an emptyDir); the second one stays up."""
    script = ("n=$(($(cat /work/starts 2>/dev/null || echo 0) + 1)); echo $n > /work/starts; "
              'echo "start $n"; [ $n -ge 2 ] && exec sleep 300; exit 1')
    apply_pod(kubectl, namespace, "restarter", "Always", fast_backoff=True,
              containers=[container("main", script, **MOUNT)], **SHARED)
    running_container(kubectl, namespace, "restarter", "main", restarts=1)
    assert logs_containing(kubectl, namespace, "start", "restarter") == "start 2\n"
    assert kubectl("logs", "-n", namespace, "restarter", "--previous") == "start 1\n"

    apply_pod(kubectl, namespace, "fresh", "Never", containers=[container("main", "sleep 300")])
    running_container(kubectl, namespace, "fresh", "main")
    none = run_kubectl(kubectl, "logs", "-n", namespace, "fresh", "--previous")
    assert none.returncode != 0 and "previous terminated container" in none.stderr


def test_exec_runs_in_the_container_and_returns_its_output(kubectl, namespace):
    """/etc/hostname, volumes, env and workingDir are the container's; the user is the one its
    main process runs as; ``-c`` picks the container."""
    apply_pod(kubectl, namespace, "shell", "Never", containers=[
        container("main", "echo data > /work/file; id -u > /work/uid; sleep 300", **MOUNT,
                  workingDir="/work", env=[{"name": "GREETING", "value": "hello"}]),
        container("side", "sleep 300", env=[{"name": "GREETING", "value": "from side"}])],
        **SHARED)
    running_container(kubectl, namespace, "shell", "main")
    running_container(kubectl, namespace, "shell", "side")
    wait_until(lambda: kubectl("exec", "-n", namespace, "shell", "-c", "main", "--",
                               "cat", "/work/uid", check=False), 30, "the container's uid file")
    assert kubectl("exec", "-n", namespace, "shell", "-c", "main", "--",
                   "cat", "/etc/hostname") == "shell\n"
    out = kubectl("exec", "-n", namespace, "shell", "-c", "main", "--", "sh", "-c",
                  'pwd; cat file; echo "$GREETING"; hostname; id -u; cat uid')
    pwd, data, greeting, hostname, exec_uid, container_uid = out.splitlines()
    assert (pwd, data, greeting, hostname) == ("/work", "data", "hello", "shell")
    assert exec_uid == container_uid
    assert kubectl("exec", "-n", namespace, "shell", "-c", "side", "--",
                   "sh", "-c", 'echo "$GREETING"') == "from side\n"


def test_exec_passes_stdin_and_the_exit_code(kubectl, namespace):
    apply_pod(kubectl, namespace, "worker", "Never", containers=[
        container("main", "sleep 300", **MOUNT)], **SHARED)
    running_container(kubectl, namespace, "worker", "main")
    piped = run_kubectl(kubectl, "exec", "-i", "-n", namespace, "worker", "--",
                        "sh", "-c", "cat > /work/in; wc -l < /work/in", stdin="a\nb\nc\n")
    assert (piped.returncode, piped.stdout.strip()) == (0, "3"), piped.stderr
    assert kubectl("exec", "-n", namespace, "worker", "--", "cat", "/work/in") == "a\nb\nc\n"
    failed = run_kubectl(kubectl, "exec", "-n", namespace, "worker", "--",
                         "sh", "-c", "echo to-stderr >&2; exit 7")
    assert (failed.returncode, failed.stdout) == (7, "")
    assert "to-stderr" in failed.stderr
    missing = run_kubectl(kubectl, "exec", "-n", namespace, "worker", "--", "no-such-command")
    assert missing.returncode == 127, missing.stderr


def test_exec_into_a_container_that_does_not_run_fails(kubectl, namespace):
    apply_pod(kubectl, namespace, "partly", "Never", containers=[
        container("main", "sleep 300"), container("done", "echo finished")])

    def done_exited():
        pod = get_json(kubectl, "pod", "partly", "-n", namespace) or {}
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        return any(s["name"] == "done" and "terminated" in s["state"] for s in statuses)

    wait_until(done_exited, 60, "container done terminated")
    assert pod_in_phase(kubectl, namespace, "partly", ("Running",), 10)
    result = run_kubectl(kubectl, "exec", "-n", namespace, "partly", "-c", "done", "--", "true")
    assert result.returncode != 0
    assert 'container "done" in pod "partly" is not running' in result.stderr, result.stderr


def test_exec_with_a_terminal(kubectl, namespace):
    """``kubectl exec -it``: the command's stdin is a terminal; input typed goes to it."""
    apply_pod(kubectl, namespace, "interactive", "Never", containers=[
        container("main", "sleep 300")])
    running_container(kubectl, namespace, "interactive", "main")
    terminal, follower = os.openpty()
    with subprocess.Popen(["kubectl", "exec", "-it", "-n", namespace, "interactive", "--",
                           "sh", "-c", 'tty; read line; echo "got $line"'],
                          stdin=follower, stdout=follower, stderr=follower, env=kubectl.env,
                          start_new_session=True) as session:
        os.close(follower)
        os.write(terminal, b"typed\r")
        output = b""
        deadline = time.monotonic() + 60
        while b"got typed" not in output and time.monotonic() < deadline:
            try:
                chunk = os.read(terminal, 4096)
            except OSError:  # every end of the terminal closed
                break
            if not chunk:
                break
            output += chunk
        session.wait(timeout=60)
    os.close(terminal)
    text = output.decode(errors="replace")
    assert "/dev/pts/" in text and "got typed" in text, text
    assert session.returncode == 0


def test_kubectl_cp_copies_into_and_out_of_the_container(kubectl, namespace, tmp_path):
    """``kubectl cp`` is tar over exec: the file lands in the pod's volume, and comes back."""
    apply_pod(kubectl, namespace, "files", "Never", containers=[
        container("main", "sleep 300", **MOUNT)], **SHARED)
    running_container(kubectl, namespace, "files", "main")
    source = tmp_path / "notes.txt"
    source.write_text("copied in\n")
    kubectl("cp", str(source), f"{namespace}/files:/work/notes.txt")
    assert kubectl("exec", "-n", namespace, "files", "--", "cat", "/work/notes.txt") == (
        "copied in\n")
    kubectl("exec", "-n", namespace, "files", "--", "sh", "-c", "echo back out > /work/out.txt")
    kubectl("cp", f"{namespace}/files:/work/out.txt", str(tmp_path / "out.txt"))
    assert (tmp_path / "out.txt").read_text() == "back out\n"


def test_exec_takes_the_user_and_groups_of_the_containers_process(kubectl, namespace):
    """A container whose process runs as 1000:1000 with group 2000: exec runs as that too."""
    apply_pod(kubectl, namespace, "unprivileged", "Never", containers=[container(
        "main", "exec setpriv --reuid=1000 --regid=1000 --groups=1000,2000 sleep 300")])
    running_container(kubectl, namespace, "unprivileged", "main")
    # Until the container's shell has exec'd setpriv, its process is still root.
    ids = wait_until(lambda: (out := kubectl("exec", "-n", namespace, "unprivileged", "--",
                                             "sh", "-c", 'echo "$(id -u) $(id -g) $(id -G)"',
                                             check=False)) and not out.startswith("0 ") and out,
                     30, "exec running as the container's user")
    assert ids.split()[:2] == ["1000", "1000"] and set(ids.split()[2:]) == {"1000", "2000"}


def test_exec_gets_the_containers_environment_whatever_its_process_did_with_it(kubectl,
                                                                                namespace):
    """A main process whose own environment is gone (here `env -i`; sshd's process title
    overwrites it the same way) does not change what exec gets: the container's env, as a
    runtime's exec gets the container's process spec."""
    apply_pod(kubectl, namespace, "cleared", "Never", containers=[container(
        "main", "exec env -i /bin/sh -c 'echo done > /work/cleared; exec sleep 300'", **MOUNT,
        env=[{"name": "GREETING", "value": "hello"}])], **SHARED)
    running_container(kubectl, namespace, "cleared", "main")
    # Once the main process runs without its environment:
    wait_until(lambda: kubectl("exec", "-n", namespace, "cleared", "--", "cat", "/work/cleared",
                               check=False), 30, "the main process cleared its environment")
    out = kubectl("exec", "-n", namespace, "cleared", "--", "sh", "-c",
                  'echo "$GREETING"; echo "$HOME"')
    greeting, home = out.splitlines()
    assert greeting == "hello" and home, out
