"""monarch-launch over loopback sshd classes a rank failure caused by the hardware (issue 35
item 2, field case C34 standalone): the rank prints PyTorch's uncorrectable-ECC line and exits
1; the result names host and rank, class Infrastructure, reason GPUHardwareError; the exit status
stays the rank's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from monarch_operator.testing.loopback_sshd import SshCluster
from tests.launcher.test_spmd import copy_script, spmd_on_two_hosts

pytestmark = pytest.mark.ssh

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def test_c34_a_rank_that_printed_an_ecc_error_is_a_hardware_fault_of_its_host(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    _, b, _ = ssh_cluster.hosts
    script = copy_script(tmp_path, "ecc_error.py")

    launch = spmd_on_two_hosts(tmp_path, ssh_cluster, monarch_port, "--json", str(script), "1")

    result = [json.loads(line) for line in launch.lines if line.startswith("{")][-1]
    assert launch.returncode == 1, launch.describe()
    assert (result["status"], result["exit_code"]) == ("failed", 1), result
    assert (result["failure_class"], result["failure_reason"]) == (
        "Infrastructure", "GPUHardwareError"), result
    # The line as the host's worker printed it, with Monarch's rank prefix ([spmd/<host>/1]).
    hardware = result["hardware"]
    assert (hardware["host"], hardware["rank"], hardware["pattern"]) == (
        b, 1, "ECCUncorrectable"), result
    assert hardware["line"].endswith(ECC) and "/1]" in hardware["line"], result
    assert f"[GPUHardwareError on host {b}: hardware error (ECCUncorrectable): " in (
        result["reason"]) and result["reason"].endswith(f"{ECC}]"), result


def test_a_rank_exiting_without_such_a_line_stays_unclassed(
    tmp_path: Path, ssh_cluster: SshCluster, monarch_port: int
) -> None:
    script = copy_script(tmp_path, "exit_with.py")

    launch = spmd_on_two_hosts(tmp_path, ssh_cluster, monarch_port, "--json", str(script), "3")

    result = [json.loads(line) for line in launch.lines if line.startswith("{")][-1]
    assert launch.returncode == 3, launch.describe()
    assert "failure_class" not in result and "hardware" not in result, result
