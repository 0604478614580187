"""How scripts/test.sh splits the suite over pytest-xdist workers (tests/parallel.py): whole
modules per worker, all real-node tests in one unit, longest units first, a pod range each."""

import json

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
