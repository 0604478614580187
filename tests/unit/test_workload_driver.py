"""The built-in workload's launcher side (``launcher.programs.workload``) works on plain lists, so
the launcher's process never imports torch; its KL, replica check and interleaving must agree
with torch's own computation of the same quantities on the ranks' tensors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as functional

from monarch_operator.launcher.programs import workload


def test_the_launcher_side_imports_no_torch() -> None:
    # A fresh interpreter: this test module itself imports torch.
    code = (
        "import sys\n"
        "from monarch_operator.launcher.programs import roles, workload\n"
        "rows = [[-1.0, -0.5], [-0.7, -0.7]]\n"
        "workload.kl_divergence(rows, workload.interleave([rows[:1], rows[1:]]))\n"
        "workload.replicas_agree(rows, rows)\n"
        "loaded = sorted(name for name in sys.modules if name.split('.')[0] == 'torch')\n"
        "print(loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_kl_divergence_matches_torch_on_the_workloads_batch() -> None:
    inputs, _ = workload.make_batch(1)
    with torch.no_grad():
        policy = functional.log_softmax(workload.new_model()(inputs) * 1.5, dim=-1)
        torch.manual_seed(7)
        other = torch.nn.Linear(workload.FEATURES, workload.CLASSES)
        reference = functional.log_softmax(other(inputs), dim=-1)
    expected = float((policy.exp() * (policy - reference)).sum(dim=-1).mean())

    got = workload.kl_divergence(policy.tolist(), reference.tolist())

    assert expected > 0.01
    assert got == pytest.approx(expected, abs=1e-6)
    assert workload.kl_divergence(policy.tolist(), policy.tolist()) == pytest.approx(0, abs=1e-12)


def test_kl_divergence_refuses_rows_of_unequal_count() -> None:
    with pytest.raises(ValueError, match="equal count: 2 and 1"):
        workload.kl_divergence([[0.0], [0.0]], [[0.0]])
    with pytest.raises(ValueError):
        workload.kl_divergence([], [])


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_interleave_undoes_the_ranks_strided_shards(world: int) -> None:
    whole = torch.randn(workload.BATCH, workload.CLASSES)
    shards = [whole[rank::world].tolist() for rank in range(world)]

    assert workload.interleave(shards) == whole.tolist()


def test_replicas_agree_as_torch_allclose_does() -> None:
    base = torch.randn(4, 3)
    near = base + 5e-7
    far = base.clone()
    far[2, 1] += 1e-3

    assert workload.replicas_agree(base.tolist(), near.tolist())
    assert torch.allclose(base, near, atol=workload.REPLICA_ABS_TOL)
    assert not workload.replicas_agree(base.tolist(), far.tolist())
    assert not torch.allclose(base, far, atol=workload.REPLICA_ABS_TOL)
    assert not workload.replicas_agree(base.tolist(), base[:3].tolist())


def test_weights_cross_as_lists_and_come_back_exact() -> None:
    model = workload.new_model()
    as_lists = {name: tensor.tolist() for name, tensor in model.state_dict().items()}
    other = torch.nn.Linear(workload.FEATURES, workload.CLASSES)

    other.load_state_dict({name: torch.tensor(value) for name, value in as_lists.items()})

    for name, tensor in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], tensor), name


def test_every_rank_builds_the_same_batch() -> None:
    first, labels = workload.make_batch(3)
    again, labels_again = workload.make_batch(3)
    other, _ = workload.make_batch(4)

    assert torch.equal(first, again) and torch.equal(labels, labels_again)
    assert not torch.equal(first, other)
    assert first.shape == (workload.BATCH, workload.FEATURES)
    assert labels.shape == (workload.BATCH,)
