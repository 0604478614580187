"""How the suite runs in parallel (pytest-xdist), and what it says about where the time went.

``scripts/test.sh`` runs ``pytest -n N --dist loadscope --no-loadscope-reorder``. Under it:

- **Work units.** One worker runs a whole module (:class:`UnitScheduling`, pytest-xdist's
  loadscope with one change): module fixtures (Kueue, a chart install) start once, and no two
  tests of a module race each other. All of ``tests/e2e`` is one unit, :data:`REAL_NODES_UNIT`:
  one cluster with real nodes runs on a machine at a time (fixed addresses on the node bridge).
  (Not ``--dist loadgroup`` with ``xdist_group`` marks: pytest-xdist 3.8 tags a test's group
  onto ``item._nodeid``, which pytest 9.2 no longer reads, so every test went its own way.)
- **Machine alone.** A module that watches what every process of this user does on the
  machine (the straggler scans stop any process an ended standalone run left, whoever started
  it) is listed in :data:`ALONE_UNITS` with its reason. Those units go last, one after another,
  on the one worker left when every other unit is done (:meth:`UnitScheduling._assign_work_unit`).
- **Order.** Units start longest first, by the seconds recorded in :data:`DURATIONS_FILE`
  (``--store-durations`` writes it from a run), so the longest chain (the real nodes: images,
  nodes, jobs) starts at once and no long module is left to start last.
- **Clusters.** Each worker starts its own kwok cluster on first use, with its own pod range
  (:func:`worker_pod_cidr`), so that no two clusters hand out the same pod IP.
- **Priority.** Two cores are saturated by four workers, and the real-node unit is the longest
  chain (35 of 39 minutes in the first parallel run). Workers run at nice :data:`WORKER_NICE`;
  the real-node cluster's fixture puts its worker back to 0 (:func:`unnice`), so the nodes,
  their pods and that worker get the larger share and the other units fill the rest. That
  fixture is the ``tests/e2e`` package's: the cluster goes, and its worker back to
  :data:`WORKER_NICE` (:func:`renice`), as soon as the folder's last test is done.

Whether run in parallel or not, the end of the run prints a phase table: the set-up's seconds
(``MONARCH_SETUP_SECONDS``, from ``scripts/test.sh``), then per test folder the tests run, the
wall time from its first test's start to its last test's end, and the test-seconds (the sum of
every test's set-up, call and teardown); then the count of tests run.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

DURATIONS_FILE = Path(__file__).with_name("durations.json")
# Every run's unit seconds also go here (``cp`` it over DURATIONS_FILE to refresh the order).
LAST_DURATIONS_FILE = Path.home() / ".cache" / "monarch-operator" / "durations-last.json"
LONGEST_UNITS_SHOWN = 15
REAL_NODES_UNIT = "tests/e2e (real nodes)"
# Seconds assumed for a unit the durations file does not know yet (a new module).
DEFAULT_UNIT_SECONDS = {"unit": 2.0, "scan": 10.0, "images": 60.0}
DEFAULT_OTHER_SECONDS = 60.0
# Pod ranges of the workers' kwok clusters: 127.110.0.0/16 for gw0, 127.111.0.0/16 for gw1 ...
# (127.100/16 is a lone cluster's default, 127.104/16 the chaos bench's, 127.0.0.x loopback sshd).
FIRST_WORKER_POD_OCTET = 110
MAX_WORKERS = 40
# The niceness of every worker but the one running the real nodes (see the module doc).
WORKER_NICE = 5


# Modules that need the machine to themselves (see the module doc), each with why.
ALONE_UNITS: dict[str, str] = {
    "tests/launcher/test_stragglers.py":
        "a killed run's processes must outlive it until this module's next run stops them; "
        "another worker's standalone pre-flight would stop them first",
    "tests/launcher/test_straggler_scan.py":
        "it plants processes of ended standalone runs and of live ones; another worker's "
        "pre-flight stops the first kind, and its scans would stop other workers' leftovers",
}


def unnice() -> None:
    """Give this process (and what it starts from now on) the default priority again, as the
    real-node fixture does in its worker (root may lower a niceness; others keep theirs)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except PermissionError:
        pass


def renice() -> None:
    """Put a pytest-xdist worker back to :data:`WORKER_NICE` once its real nodes are gone (the
    real-node fixture's teardown), so that it no longer comes before the other workers."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.nice(max(0, WORKER_NICE - os.getpriority(os.PRIO_PROCESS, 0)))


def worker_pod_cidr(worker: str) -> str:
    """The pod range of pytest-xdist worker ``worker`` (``"gw0"``, ``"gw1"``, ...): a /16 of
    127.0.0.0/8 of its own.

    Raises:
        ValueError: ``worker`` is not a pytest-xdist worker id, or beyond :data:`MAX_WORKERS`.
    """
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        raise ValueError(f"not a pytest-xdist worker id: {worker!r}")
    index = int(worker[2:])
    if index >= MAX_WORKERS:
        raise ValueError(f"worker {worker}: at most {MAX_WORKERS} workers have a pod range")
    return f"127.{FIRST_WORKER_POD_OCTET + index}.0.0/16"


def unit_of(nodeid: str) -> str:
    """The work unit of test ``nodeid``: its module's path from the repository root, or
    :data:`REAL_NODES_UNIT` for every test of tests/e2e."""
    module = nodeid.split("::", 1)[0]
    return REAL_NODES_UNIT if folder_of(module) == "tests/e2e" else module


class UnitScheduling(LoadScopeScheduling):
    """pytest-xdist's loadscope scheduling whose scope is :func:`unit_of` (a module, or all of
    tests/e2e); units go out in collection order, which
    :func:`pytest_collection_modifyitems` made longest first."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _assign_work_unit(self, node) -> None:  # type: ignore[no-untyped-def]
        """Send ``node`` the next unit, except that a unit of :data:`ALONE_UNITS` waits until
        every other worker has stopped: while another one still takes units, this one stops
        once its last test is all it holds (an xdist worker runs its last test only when told
        what comes next, or to stop); the last worker left takes the machine-alone units."""
        if next(iter(self.workqueue)) in ALONE_UNITS:
            others = [other for other in self.assigned_work if other is not node]
            if any(not other.shutting_down for other in others):
                if self._pending_of(self.assigned_work.get(node, {})) <= 1 and \
                        not node.shutting_down:
                    node.shutdown()
                return
            if others:  # stopping: they finish their last tests first (see remove_node)
                return
        super()._assign_work_unit(node)

    def remove_node(self, node):  # type: ignore[no-untyped-def]
        """xdist's, then the workers left are offered work again: a worker waiting for the
        others to stop before it takes the machine-alone units learns that they have."""
        crashitem = super().remove_node(node)
        for other in list(self.assigned_work):
            self._reschedule(other)
        return crashitem


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    """With ``--dist loadscope``: :class:`UnitScheduling` (other modes: pytest-xdist's own)."""
    if config.getvalue("dist") == "loadscope":
        return UnitScheduling(config, log)
    return None


def folder_of(nodeid: str) -> str:
    """``tests/<folder>`` of a test id: ``tests/cluster/test_x.py::test_y`` -> ``tests/cluster``."""
    return "/".join(nodeid.split("::", 1)[0].split("/")[:2])


def expected_seconds(unit: str, recorded: dict[str, float]) -> float:
    """How long ``unit`` is expected to take: its recorded seconds, else a folder default."""
    if unit in recorded:
        return recorded[unit]
    folder = unit.split("/")[1] if unit.count("/") >= 1 else ""
    return DEFAULT_UNIT_SECONDS.get(folder, DEFAULT_OTHER_SECONDS)


def merged_durations(known: dict[str, float], run: dict[str, float],
                     root: Path = DURATIONS_FILE.parent.parent) -> dict[str, float]:
    """``known`` unit seconds updated with this ``run``'s, longest first: a run of a few
    modules refreshes theirs and keeps the others' (before, every run overwrote the file, so a
    whole run's figures were gone by the next single-module run). A known unit whose module no
    longer exists under ``root`` is dropped."""
    kept = {unit: seconds for unit, seconds in known.items()
            if unit == REAL_NODES_UNIT or (root / unit).exists()}
    return dict(sorted({**kept, **run}.items(), key=lambda kv: -kv[1]))


def read_durations(path: Path = DURATIONS_FILE) -> dict[str, float]:
    """Seconds per work unit from ``path`` (empty when the file is missing)."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text())["units"].items()}
    except FileNotFoundError:
        return {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true", default=False,
                     help=f"write each work unit's test-seconds to {DURATIONS_FILE.name} "
                          "(the order the next parallel run starts units in)")


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        # Before any cluster is made; processes the tests start inherit it.
        os.environ.setdefault("MONARCH_LOCALCLUSTER_POD_CIDR", worker_pod_cidr(worker))
        os.nice(WORKER_NICE - os.getpriority(os.PRIO_PROCESS, 0))
    elif not config.getoption("pyargs", False):
        missing = missing_paths(config.args, config.invocation_params.dir)
        if missing:
            # Under pytest-xdist only the workers collect, and a path they cannot find ended
            # the run as "no tests ran"; say it as pytest alone does.
            raise pytest.UsageError("file or directory not found: " + ", ".join(missing))
    config.pluginmanager.register(PhaseClock(config), "monarch-phase-clock")


def missing_paths(args: list[str], cwd: Path) -> list[str]:
    """The test paths among pytest's ``args`` (``path`` or ``path::test``) that do not exist,
    relative to ``cwd``, as given."""
    return [arg for arg in args if not (cwd / arg.split("::", 1)[0]).exists()]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker: the work units longest first, the machine-alone ones last (a
    stable sort: tests keep their order inside a unit). Every worker sorts the same collection
    the same way."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    recorded = read_durations()
    items.sort(key=lambda item: (unit_of(item.nodeid) in ALONE_UNITS,
                                 -expected_seconds(unit_of(item.nodeid), recorded)))


@dataclass
class _Folder:
    tests: set[str] = field(default_factory=set)
    first_start: float = float("inf")
    last_stop: float = 0.0
    test_seconds: float = 0.0


class PhaseClock:
    """Collects every test report (on the controller, under pytest-xdist) and prints the phase
    table and the longest units at the end, writes each unit's seconds to
    :data:`LAST_DURATIONS_FILE` and, with ``--store-durations``, to :data:`DURATIONS_FILE`."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started = time.time()
        self.folders: dict[str, _Folder] = defaultdict(_Folder)
        self.unit_seconds: dict[str, float] = defaultdict(float)
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid
        folder = self.folders[folder_of(nodeid)]
        folder.tests.add(nodeid)
        folder.first_start = min(folder.first_start, getattr(report, "start", time.time()))
        folder.last_stop = max(folder.last_stop, getattr(report, "stop", time.time()))
        folder.test_seconds += report.duration
        self.unit_seconds[unit_of(nodeid)] += report.duration
        if report.when == "call" or report.outcome != "passed":
            # A test counts as run once; a failed set-up or teardown is its outcome too.
            if self.outcomes.get(nodeid) in (None, "passed"):
                self.outcomes[nodeid] = report.outcome

    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        if os.environ.get("PYTEST_XDIST_WORKER") or not self.folders:
            return
        write = terminalreporter.write_line
        terminalreporter.section("phases (wall time)")
        setup = os.environ.get("MONARCH_SETUP_SECONDS")
        write(f"{'phase':<22}{'tests':>7}{'wall s':>9}{'test-s':>9}")
        if setup:
            write(f"{'set-up':<22}{'':>7}{float(setup):>9.0f}{'':>9}")
        for name in sorted(self.folders):
            folder = self.folders[name]
            wall = max(0.0, folder.last_stop - folder.first_start)
            write(f"{name:<22}{len(folder.tests):>7}{wall:>9.0f}{folder.test_seconds:>9.0f}")
        total = time.time() - self.started
        write(f"{'tests, all folders':<22}{len(self.outcomes):>7}{total:>9.0f}"
              f"{sum(f.test_seconds for f in self.folders.values()):>9.0f}")
        counts: dict[str, int] = defaultdict(int)
        for outcome in self.outcomes.values():
            counts[outcome] += 1
        summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
        write(f"tests run: {len(self.outcomes)} ({summary})")
        units = {unit: round(seconds, 1) for unit, seconds in
                 sorted(self.unit_seconds.items(), key=lambda kv: -kv[1])}
        write("longest units (test-s): " + ", ".join(
            f"{unit} {seconds:.0f}" for unit, seconds in list(units.items())[:LONGEST_UNITS_SHOWN]))
        targets = [LAST_DURATIONS_FILE]
        if self.config.getoption("store_durations"):
            targets.append(DURATIONS_FILE)
        for target in targets:
            record = json.dumps({"tests_run": len(self.outcomes),
                                 "units": merged_durations(read_durations(target), units)},
                                indent=1) + "\n"
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(record)
            except OSError as error:  # a read-only home must not fail the run
                write(f"could not write {target}: {error}")
                continue
            write(f"wrote {target}")
