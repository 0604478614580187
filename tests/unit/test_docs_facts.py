"""What the documentation states about the code and the systems around it, checked (issue 32
item 7): each fact where it can drift, against the code that decides it. The chart's values
table is checked in test_chart.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from monarch_operator.localcluster import cli, demo

DOCS = Path(__file__).resolve().parents[2] / "docs"


def section(page: str, heading: str) -> str:
    """The text of ``page`` under ``heading`` (a ``## `` heading) up to the next one."""
    text = (DOCS / page).read_text()
    return text[text.index(f"## {heading}\n"):].split("\n## ")[0]


def test_the_local_cluster_page_gives_the_clis_gpus_per_node(monkeypatch, tmp_path):
    made: list[dict[str, Any]] = []

    class Cluster:
        def __init__(self, state_dir: Path, **kwargs: Any) -> None:
            made.append(kwargs)

        def up(self, progress: Any = None) -> None:
            pass

    monkeypatch.setattr(cli, "LocalCluster", Cluster)
    assert cli.main(["--dir", str(tmp_path), "up", "--real-nodes", "2"]) == 0
    gpus = made[0]["gpus_per_node"]
    text = " ".join(section("local-cluster.md", "Real nodes").split())
    assert f"each with {gpus} fake GPUs" in text


def test_the_kueue_page_says_how_wait_for_pods_ready_meets_our_startup_gate():
    text = " ".join(section("kueue.md", "`waitForPodsReady`").split())
    for fact in ("PodsReady", "startupTimeoutSeconds", "recoveryTimeout", "Keep it enabled"):
        assert fact in text, fact


def test_checkpoints_are_recommended_on_storage_that_outlives_the_pods():
    text = " ".join(section("failures.md", "Checkpoint before a stop").split())
    assert "a volume of `spec.launcher.template`" not in text
    assert "PersistentVolumeClaim" in text and "persistentVolumeClaim" in text
    assert "object store" in text and "`emptyDir`" in text


def test_the_demo_shows_monarchs_log_note_once():
    """Each Monarch process (the launcher and every worker) prints where its internal logs
    go; the demo shows the launcher's output with that line once, not once per process
    interleaved with the others."""
    note = "Monarch internal logs are being written to /tmp/monarch_log_{}.log"
    output = "".join([
        note.format(0) + "\n",
        "[trainer/demo-worker-0/0] " + note.format(1) + "\n",
        "[ref/demo-worker-2/0] step 1 " + note.format(2) + "\n",
        "[trainer/demo-worker-1/1] " + note.format(3) + "\n",
        "trainer rank 0: loss 1.25\n"])
    assert demo.tidy_output(output) == (note.format(0) + "\n[ref/demo-worker-2/0] step 1\n"
                                        "trainer rank 0: loss 1.25\n")
    assert demo.tidy_output("no note\n") == "no note\n"


def test_the_demo_shows_kubectl_gets_column_header():
    asked: list[tuple[str, ...]] = []

    def kubectl(*args: str, **kwargs: Any) -> str:
        asked.append(args)
        return ("NAME   STATUS      READY   RESTARTS   STEP   PROGRESS   ETA   AGE\n"
                "demo   Succeeded   0/3     0          3      100%             52s\n")

    shown = demo.jobs_table(kubectl, "team-a")  # type: ignore[arg-type]
    assert asked == [("get", "monarchjobs", "-n", "team-a", "--no-headers=false")]
    assert shown.splitlines()[1:3] == ["$ kubectl get monarchjobs -n team-a",
                                       "NAME   STATUS      READY   RESTARTS   STEP   PROGRESS   "
                                       "ETA   AGE"]
