"""How scripts/test.sh splits the suite over pytest-xdist workers (tests/parallel.py): whole
modules per worker, all real-node tests in one unit, longest units first, a pod range each."""

import json
from pathlib import Path

import pytest

from tests import parallel


def test_a_module_is_one_unit_and_all_real_node_tests_are_one() -> None:
    assert parallel.unit_of("tests/cluster/test_kueue.py::test_x[a-b]") == "tests/cluster/test_kueue.py"
    assert parallel.unit_of("tests/unit/test_names.py::test_child_names") == "tests/unit/test_names.py"
    e2e = {parallel.unit_of("tests/e2e/test_sample_job.py::test_demo"),
           parallel.unit_of("tests/e2e/test_restarts.py::TestX::test_y[1]")}
    assert e2e == {parallel.REAL_NODES_UNIT}


def test_the_scheduler_scopes_tests_by_unit() -> None:
    split = parallel.UnitScheduling._split_scope
    assert split(None, "tests/e2e/test_a.py::t") == split(None, "tests/e2e/test_b.py::t")  # type: ignore[arg-type]
    assert split(None, "tests/cluster/test_a.py::t1") == "tests/cluster/test_a.py"  # type: ignore[arg-type]


def test_units_start_longest_first_with_defaults_for_new_ones(tmp_path) -> None:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests_run": 3, "units": {"tests/cluster/test_a.py": 300}}))
    recorded = parallel.read_durations(path)
    assert parallel.expected_seconds("tests/cluster/test_a.py", recorded) == 300
    # A module not recorded yet: its folder's default (a new unit test module is short).
    assert parallel.expected_seconds("tests/unit/test_new.py", recorded) == \
        parallel.DEFAULT_UNIT_SECONDS["unit"]
    assert parallel.expected_seconds("tests/cluster/test_new.py", recorded) == \
        parallel.DEFAULT_OTHER_SECONDS
    assert parallel.read_durations(tmp_path / "missing.json") == {}


def test_each_worker_has_a_pod_range_of_its_own_inside_loopback() -> None:
    ranges = [parallel.worker_pod_cidr(f"gw{index}") for index in range(parallel.MAX_WORKERS)]
    assert len(set(ranges)) == parallel.MAX_WORKERS
    assert ranges[0] == "127.110.0.0/16"
    # Never the lone cluster's default range nor the chaos bench's.
    assert not {"127.100.0.0/16", "127.104.0.0/16"} & set(ranges)
    with pytest.raises(ValueError, match="at most"):
        parallel.worker_pod_cidr(f"gw{parallel.MAX_WORKERS}")
    with pytest.raises(ValueError, match="worker id"):
        parallel.worker_pod_cidr("main")


class _Worker:
    """Stands in for xdist's WorkerController: records what it was sent."""

    def __init__(self, name: str) -> None:
        self.gateway = type("Gateway", (), {"id": name})()
        self.sent: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _scheduler(workers: int) -> parallel.UnitScheduling:
    values = {"tx": [f"{workers}*popen"]}
    config = type("Config", (), {"getvalue": lambda self, name: values[name],
                                 "option": type("Option", (), {"loadscopereorder": False})()})()
    return parallel.UnitScheduling(config)  # type: ignore[arg-type]


def test_machine_alone_units_wait_until_every_other_unit_is_done() -> None:
    alone = next(iter(parallel.ALONE_UNITS))
    collection = ["tests/cluster/test_a.py::t1", "tests/cluster/test_b.py::t1",
                  f"{alone}::t1", f"{alone}::t2"]
    scheduler = _scheduler(2)
    first, second = _Worker("gw0"), _Worker("gw1")
    for worker in (first, second):
        scheduler.add_node(worker)  # type: ignore[arg-type]
        scheduler.add_node_collection(worker, collection)  # type: ignore[arg-type]
    scheduler.schedule()
    # Each worker got one cluster module; the machine-alone unit waits while they run.
    assert sorted(first.sent + second.sent) == [[0], [1]]
    assert alone in scheduler.workqueue
    # An xdist worker runs its last test only once told what follows: one of them is told to
    # stop, the other waits for it.
    stopping = [worker for worker in (first, second) if worker.shutting_down]
    assert len(stopping) == 1
    last = second if stopping[0] is first else first
    scheduler.mark_test_complete(stopping[0], stopping[0].sent[0][0])  # type: ignore[arg-type]
    assert len(last.sent) == 1 and not scheduler.tests_finished
    scheduler.remove_node(stopping[0])  # type: ignore[arg-type]
    # The last worker left takes the machine-alone unit, all its tests at once.
    assert last.sent[-1] == [2, 3] and not last.shutting_down
    assert not scheduler.workqueue


def test_machine_alone_units_alone_in_the_run_go_to_one_worker() -> None:
    alone = next(iter(parallel.ALONE_UNITS))
    collection = [f"{alone}::t1", f"{alone}::t2"]
    scheduler = _scheduler(2)
    workers = [_Worker("gw0"), _Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)  # type: ignore[arg-type]
        scheduler.add_node_collection(worker, collection)  # type: ignore[arg-type]
    scheduler.schedule()
    for worker in workers:
        if worker.shutting_down and not worker.sent and worker in scheduler.nodes:
            scheduler.remove_node(worker)  # type: ignore[arg-type]
    assert [worker.sent for worker in workers if worker.sent] == [[[0, 1]]]


def test_every_machine_alone_unit_says_why_and_exists() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for unit, why in parallel.ALONE_UNITS.items():
        assert (root / unit).is_file(), unit
        assert len(why) > 40, f"{unit}: say why it needs the machine alone"


def test_only_machine_alone_units_plant_processes_of_standalone_runs() -> None:
    """A process marked as a standalone run (lineage ``-``) outside any ssh session is an
    ended run's leftover to every launcher's pre-flight on this machine: another worker's
    launcher test stops it. A module that plants one must run alone (a clean-clone CI run:
    test_ssh_at_scale's sweep found its planted process gone); others give theirs a lineage
    of their own."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    # A standalone run's mark value ("-/0/<run>") or RunMark("-", ...), in tests that run
    # processes on this machine (unit tests only build command lines).
    standalone = re.compile(r"""f?["']-/0/|RunMark\(\s*["']-["']""")
    planting = sorted(str(path.relative_to(root)) for folder in ("launcher", "cluster", "e2e")
                      for path in (root / "tests" / folder).rglob("*.py")
                      if standalone.search(path.read_text()))
    assert "tests/launcher/test_stragglers.py" in planting, "the pattern finds no planting"
    assert [unit for unit in planting if unit not in parallel.ALONE_UNITS] == []


class _Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(f"== {title}")

    def write_line(self, line: str) -> None:
        self.lines.append(line)


class _Report:
    def __init__(self, nodeid: str, when: str, duration: float) -> None:
        self.nodeid, self.when, self.duration, self.outcome = nodeid, when, duration, "passed"
        self.start, self.stop = 100.0, 100.0 + duration


def test_every_run_prints_its_longest_units_and_keeps_their_seconds(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(parallel, "LAST_DURATIONS_FILE", tmp_path / "cache" / "last.json")
    monkeypatch.setattr(parallel, "DURATIONS_FILE", tmp_path / "checked-in.json")
    config = type("Config", (), {"getoption": lambda self, name: False})()
    clock = parallel.PhaseClock(config)  # type: ignore[arg-type]
    for nodeid, seconds in [("tests/cluster/test_a.py::t1", 30.0),
                            ("tests/cluster/test_a.py::t2", 20.0),
                            ("tests/e2e/test_x.py::t", 90.0), ("tests/unit/test_u.py::t", 1.0)]:
        clock.pytest_runtest_logreport(_Report(nodeid, "call", seconds))  # type: ignore[arg-type]
    reporter = _Reporter()
    clock.pytest_terminal_summary(reporter)
    longest = next(line for line in reporter.lines if line.startswith("longest units"))
    assert longest == ("longest units (test-s): tests/e2e (real nodes) 90, "
                       "tests/cluster/test_a.py 50, tests/unit/test_u.py 1")
    kept = json.loads((tmp_path / "cache" / "last.json").read_text())
    assert kept == {"tests_run": 4, "units": {"tests/e2e (real nodes)": 90.0,
                                              "tests/cluster/test_a.py": 50.0,
                                              "tests/unit/test_u.py": 1.0}}
    assert not (tmp_path / "checked-in.json").exists()  # only with --store-durations


def test_a_run_of_a_few_modules_refreshes_theirs_and_keeps_the_rest(tmp_path: Path) -> None:
    (tmp_path / "tests" / "cluster").mkdir(parents=True)
    for module in ("a", "b"):
        (tmp_path / "tests" / "cluster" / f"test_{module}.py").write_text("")
    known = {"tests/cluster/test_a.py": 100.0, "tests/cluster/test_b.py": 50.0,
             "tests/cluster/test_gone.py": 80.0, parallel.REAL_NODES_UNIT: 900.0}

    merged = parallel.merged_durations(known, {"tests/cluster/test_b.py": 120.0}, root=tmp_path)

    assert merged == {parallel.REAL_NODES_UNIT: 900.0, "tests/cluster/test_b.py": 120.0,
                      "tests/cluster/test_a.py": 100.0}
    assert list(merged) == [parallel.REAL_NODES_UNIT, "tests/cluster/test_b.py",
                            "tests/cluster/test_a.py"]


def test_a_mistyped_test_path_is_named_before_the_workers_start(tmp_path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("")
    args = ["tests/test_a.py::test_x", "tests", "tests/test_b.py", "tests/test_c.py::t"]
    assert parallel.missing_paths(args, tmp_path) == ["tests/test_b.py", "tests/test_c.py::t"]
