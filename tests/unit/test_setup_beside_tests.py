"""The set-up beside the tests (scripts/test.sh, tests/setup_parts.py): which parts have ended,
and the scheduler giving a worker the first unit whose parts have (tests/parallel.py)."""

from pathlib import Path

import pytest

from tests import parallel, setup_parts
from tests.unit.test_parallel_units import _scheduler, _Worker


def test_a_part_has_ended_once_done_failed_or_the_whole_set_up_is(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(setup_parts.STATE_ENV, raising=False)
    assert setup_parts.ended("node")  # no set-up beside the tests: everything is there
    monkeypatch.setenv(setup_parts.STATE_ENV, str(tmp_path))
    assert not setup_parts.ended("node")
    (tmp_path / "node.done").write_text("1122\n")
    (tmp_path / "kueue.failed").write_text("30\n")
    assert setup_parts.ended("node") and setup_parts.ended("kueue")
    assert not setup_parts.ended("images")
    (tmp_path / "all.failed").write_text("31\n")  # a part never started ends with the set-up
    assert setup_parts.ended("images")
    with pytest.raises(ValueError, match="not a set-up part: 'nodes'"):
        setup_parts.ended("nodes")


def test_waiting_for_a_part_ends_when_it_does_and_times_out_otherwise(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(setup_parts.STATE_ENV, str(tmp_path))
    monkeypatch.setattr(setup_parts, "POLL_SECONDS", 0.01)
    with pytest.raises(TimeoutError, match="'scanners' has not ended"):
        setup_parts.wait_for("scanners", timeout=0.05)
    (tmp_path / "scanners.done").write_text("266\n")
    setup_parts.wait_for("scanners", timeout=0.05)


def test_the_phase_table_gives_each_parts_seconds_and_what_still_runs(tmp_path) -> None:
    assert parallel.setup_lines(setup_parts.outcomes(tmp_path / "none")) == []
    (tmp_path / "venv.done").write_text("545\n")
    (tmp_path / "kueue.failed").write_text("692\n")
    lines = parallel.setup_lines(setup_parts.outcomes(tmp_path))
    assert lines == ["set-up beside the tests: still running: control-plane, node, helm, "
                     "scanners, images, coredns-image (seconds per part: venv 545, "
                     "kueue 692 FAILED)"]
    (tmp_path / "all.done").write_text("1180\n")
    assert "ended in 1180 s" in parallel.setup_lines(setup_parts.outcomes(tmp_path))[0]


def test_every_folder_needs_parts_the_set_up_has() -> None:
    root = Path(__file__).resolve().parents[2]
    for folder, needs in parallel.SETUP_NEEDS.items():
        assert (root / folder).is_dir(), folder
        assert set(needs) <= set(setup_parts.PARTS), folder
    # A folder not named needs everything (the real nodes: binaries, images, Kueue).
    assert "tests/e2e" not in parallel.SETUP_NEEDS
    part_names = {line.split()[1] for line in (root / "scripts/setup.sh").read_text().splitlines()
                  if line.startswith("part ") or line.startswith("  part ")}
    assert part_names == set(setup_parts.PARTS)


def _two_workers(collection: list[str]) -> tuple[parallel.UnitScheduling, _Worker, _Worker]:
    scheduler = _scheduler(2)
    first, second = _Worker("gw0"), _Worker("gw1")
    for worker in (first, second):
        scheduler.add_node(worker)  # type: ignore[arg-type]
        scheduler.add_node_collection(worker, collection)  # type: ignore[arg-type]
    return scheduler, first, second


def test_units_whose_set_up_has_ended_go_first(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(setup_parts.STATE_ENV, str(tmp_path))
    (tmp_path / "venv.done").write_text("545\n")
    # Longest first, as pytest_collection_modifyitems leaves them: real nodes, cluster, launcher.
    collection = ["tests/e2e/test_a.py::t1",
                  *(f"tests/cluster/test_c.py::t{n}" for n in range(4)),
                  *(f"tests/launcher/test_l1.py::t{n}" for n in range(4)),
                  *(f"tests/launcher/test_l2.py::t{n}" for n in range(4)),
                  "tests/unit/test_u.py::t1"]
    scheduler, first, second = _two_workers(collection)
    scheduler.schedule()
    # Only the venv is there: both workers start launcher modules, the rest waits.
    assert sorted(first.sent + second.sent) == [[5, 6, 7, 8], [9, 10, 11, 12]]
    assert list(scheduler.workqueue) == [parallel.REAL_NODES_UNIT, "tests/cluster/test_c.py",
                                         "tests/unit/test_u.py"]
    # The control plane is built: the cluster module goes before the real nodes.
    for part in ("control-plane", "helm", "kueue"):
        (tmp_path / f"{part}.done").write_text("900\n")
    worker = first if first.sent[0][0] == 5 else second
    for index in (5, 6):
        scheduler.mark_test_complete(worker, index)  # type: ignore[arg-type]
    assert worker.sent[-1] == [1, 2, 3, 4]
    # The whole set-up is done: the real nodes are next, longest first again.
    (tmp_path / "all.done").write_text("1180\n")
    other = second if worker is first else first
    for index in other.sent[0][:2]:
        scheduler.mark_test_complete(other, index)  # type: ignore[arg-type]
    assert other.sent[-1] == [0]


def test_with_nothing_ready_a_worker_waits_a_test_then_takes_the_first_unit(
        tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(setup_parts.STATE_ENV, str(tmp_path))
    (tmp_path / "venv.done").write_text("545\n")
    collection = [*(f"tests/launcher/test_l.py::t{n}" for n in range(4)),
                  *(f"tests/cluster/test_c.py::t{n}" for n in range(3)),
                  "tests/e2e/test_a.py::t1"]
    scheduler, first, second = _two_workers(collection)
    scheduler.schedule()
    # One worker has the launcher module; the other, holding nothing, takes the first unit
    # (its fixture then waits for the control plane's build).
    assert sorted(first.sent + second.sent) == [[0, 1, 2, 3], [4, 5, 6]]
    worker = first if first.sent[0][0] == 0 else second
    scheduler.mark_test_complete(worker, 0)  # type: ignore[arg-type]
    assert len(worker.sent) == 1  # three tests left: the unit waits, nothing is ready
    scheduler.mark_test_complete(worker, 1)  # type: ignore[arg-type]
    assert len(worker.sent) == 1  # two left (its last besides): still waits
    scheduler.mark_test_complete(worker, 2)  # type: ignore[arg-type]
    assert worker.sent[-1] == [7]  # down to its last test: it takes the real nodes


def test_without_a_set_up_beside_the_tests_the_order_stays(monkeypatch) -> None:
    monkeypatch.delenv(setup_parts.STATE_ENV, raising=False)
    collection = ["tests/e2e/test_a.py::t1", "tests/cluster/test_c.py::t1",
                  "tests/launcher/test_l.py::t1"]
    scheduler, first, second = _two_workers(collection)
    scheduler.schedule()
    # Longest first as collected: the real nodes and the cluster module go out first.
    assert sorted([first.sent[0], second.sent[0]]) == [[0], [1]]
