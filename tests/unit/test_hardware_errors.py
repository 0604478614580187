"""Output lines that mean a hardware fault (issue 35 item 2, field case C34): the default
pattern list against real-looking CUDA, NVML, kernel and NCCL lines, lines that must not match,
and a job's own list (spec.runPolicy.hardwareErrors), checked at admission."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from monarch_operator import hwerrors
from monarch_operator.controller.spec.rules import InvalidSpecError
from monarch_operator.controller.spec.spec import JobSpec

CRD = Path(__file__).resolve().parents[2] / "crds" / "monarchjobs.monarch-operator.dev.yaml"


@pytest.mark.parametrize(("line", "pattern"), [
    # PyTorch's message for cudaErrorECCUncorrectable (jade-hpc-gpu #194)
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "ECCUncorrectable"),
    ("CUDA error: uncorrectable ECC error encountered", "ECCUncorrectable"),
    ("cuInit failed: CUDA_ERROR_ECC_UNCORRECTABLE", "ECCUncorrectable"),
    ("RuntimeError: CUDA error: uncorrectable NVLink error was detected during the execution",
     "NVLinkUncorrectable"),
    # The kernel driver's words (NVIDIA/open-gpu-kernel-modules #1151), as dmesg prints them
    ("[ 1234.567] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
     "FallenOffTheBus"),
    ("Unable to determine the device handle for GPU 0000:2B:00.0: GPU is lost.  Reboot the "
     "system to recover this GPU", "GPULost"),
    ("pynvml.NVMLError_GPUIsLost: NVML_ERROR_GPU_IS_LOST", "GPULost"),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "
     "reset gpu to activate.", "FatalXid"),
    ("NVRM: Xid (PCI:0000:3b:00): 48, pid=2211, name=python, An uncorrectable double bit error",
     "FatalXid"),
    ("NVRM: Xid (PCI:0000:3b:00): 74, pid=2211, NVLink: fatal error detected on link 3",
     "FatalXid"),
    ("NVRM: Xid (PCI:0000:ca:00): 95, pid=91, Uncontained: FBHUB. RST: Yes, D-RST: No",
     "FatalXid"),
    # NCCL over InfiniBand (tatsu-lab/stanford_alpaca #207, NVIDIA/nccl #1405)
    ("torch.distributed.DistBackendError: NCCL error: remote process exited or there was a "
     "network error, NCCL version 2.18.1 ... Last error: NET/IB : Got completion from peer "
     "11.214.147.122<39138> with error 12, opcode 0, len 0, vendor err 129",
     "InfiniBandCompletionError"),
    ("node-3:1234:1290 [2] NCCL WARN NET/IB : Got completion from peer 10.244.1.7<4521> with "
     "status=12 opcode=0 len=0 vendor err 129 (Recv)", "InfiniBandCompletionError"),
])
def test_real_hardware_lines_match_their_pattern(line: str, pattern: str) -> None:
    found = hwerrors.find(["step 3/10 loss=1.2", line, "monarch-launch: torn down"])
    assert found == hwerrors.HardwareLine(pattern, line.strip()[:hwerrors.LINE_CHARS])


@pytest.mark.parametrize("line", [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "RuntimeError: CUDA error: device-side assert triggered",
    "RuntimeError: CUDA error: unspecified launch failure",  # also a program's own (#74235)
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
    "cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5",
    "Last error: Cuda failure 1 'invalid argument'",
    "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/NVLink",  # NVLink in use, no error
    "NVRM: Xid (PCI:0000:3b:00): 13, pid=2211, Graphics Exception: ESR 0x...",  # program fault
    "NVRM: Xid (PCI:0000:3b:00): 31, pid=2211, Ch 00000010, intr 00000000. MMU Fault",
    "NVRM: Xid (PCI:0000:3b:00): 480, not a real Xid",
    "| N/A   34C    P0    61W / 400W |      0MiB / 81920MiB |      0%      Default |",
    "Volatile Uncorr. ECC: 0",
    "ValueError: boom at step 2",
    "",
])
def test_lines_of_a_programs_own_faults_do_not_match(line: str) -> None:
    assert hwerrors.find([line]) is None


def test_the_first_matching_line_is_found_in_several_lines_of_one_text() -> None:
    text = ("Traceback (most recent call last):\n  File \"train.py\", line 88\n"
            "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call\n"
            "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.")
    found = hwerrors.find([text])
    assert found is not None and found.pattern == "ECCUncorrectable"
    assert found.line == "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def test_a_long_line_is_scanned_and_quoted_only_so_far() -> None:
    late = "x" * hwerrors.LINE_CHARS + " uncorrectable ECC error"
    assert hwerrors.find([late]) is None
    early = "uncorrectable ECC error " + "y" * 5000
    found = hwerrors.find([early])
    assert found is not None and len(found.line) == hwerrors.LINE_CHARS


def test_a_jobs_own_patterns_add_to_the_defaults_or_replace_them() -> None:
    added = hwerrors.from_spec({"patterns": [r"my-nic: link down"]})
    assert added[:len(hwerrors.DEFAULT_PATTERNS)] == hwerrors.DEFAULT_PATTERNS
    assert hwerrors.find(["eth1 my-nic: link down"], added) == hwerrors.HardwareLine(
        "patterns[0]", "eth1 my-nic: link down")
    only = hwerrors.from_spec({"patterns": [r"my-nic: link down"], "replaceDefaults": True})
    assert hwerrors.find(["CUDA error: uncorrectable ECC error encountered"], only) is None
    assert hwerrors.find(["my-nic: link down"], only) is not None
    assert hwerrors.from_spec(None) == hwerrors.DEFAULT_PATTERNS


@pytest.mark.parametrize(("value", "words"), [
    ({"patterns": ["ok", "("]}, "spec.runPolicy.hardwareErrors.patterns[1]: not a valid "
                                "regular expression"),
    ({"patterns": [" "]}, "spec.runPolicy.hardwareErrors.patterns[0]: must be a non-empty"),
    ({"patterns": ["a" * 257]}, "patterns[0]: at most 256 characters, got 257"),
    ({"patterns": ["a"] * 33}, "patterns: at most 32 patterns, got 33"),
    ({"patterns": "uncorrectable"}, "patterns: must be a list of strings"),
    ({"replaceDefaults": "yes"}, "replaceDefaults: must be true or false"),
])
def test_a_bad_list_is_refused_naming_the_field(value: dict, words: str) -> None:
    with pytest.raises(ValueError) as raised:
        hwerrors.from_spec(value)
    assert str(raised.value).startswith("spec.runPolicy.hardwareErrors.")
    assert words in str(raised.value)


def test_an_invalid_pattern_in_a_job_is_an_invalid_spec() -> None:
    body = {"metadata": {"name": "demo", "namespace": "ns"},
            "spec": {"image": "img:1", "runPolicy": {"hardwareErrors": {"patterns": ["[x"]}}}}
    with pytest.raises(InvalidSpecError, match=r"hardwareErrors\.patterns\[0\]"):
        JobSpec.from_body(body)


def test_the_launcher_gets_the_jobs_list_in_its_environment() -> None:
    value = {"patterns": ["my-nic: link down"], "replaceDefaults": True}
    env = {hwerrors.ENV: hwerrors.to_env(value)}
    assert hwerrors.from_env(env) == hwerrors.from_spec(value)
    assert hwerrors.from_env({}) == hwerrors.DEFAULT_PATTERNS
    assert hwerrors.to_env({}) == ""
    with pytest.raises(ValueError, match=f"^{hwerrors.ENV}: not JSON"):
        hwerrors.from_env({hwerrors.ENV: "[oops"})


def test_the_launchers_mark_is_found_again_by_the_operator() -> None:
    line = hwerrors.HardwareLine("ECCUncorrectable",
                                 "CUDA error: uncorrectable ECC error encountered [rank 2]")
    text = ("trainer rank 2 (host demo-worker-1, local rank 0): exited with code 1 "
            + hwerrors.marker("demo-worker-1", line))
    found = hwerrors.MARKER.search(text)
    assert found is not None
    assert (found["host"], found["pattern"], found["line"]) == (
        "demo-worker-1", "ECCUncorrectable", line.line)


def test_the_crd_limits_are_the_codes() -> None:
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]
    run = schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["runPolicy"]
    field = run["properties"]["hardwareErrors"]["properties"]
    assert field["patterns"]["maxItems"] == hwerrors.MAX_PATTERNS
    assert field["patterns"]["items"]["maxLength"] == hwerrors.MAX_PATTERN_CHARS
    assert field["replaceDefaults"]["default"] is False
