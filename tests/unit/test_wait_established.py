"""install_crds' wait for the CRD (demo.wait_established): a just-created CRD has no conditions,
which made `kubectl wait --for=condition=Established` fail at once (bench/restart_latency.py,
2026-11-30); polling waits through it."""

from __future__ import annotations

import pytest

from monarch_operator.localcluster import demo


class FakeKubectl:
    """Answers ``get crd/...`` with each of ``states`` in turn (the last one for ever)."""

    def __init__(self, *states: dict) -> None:
        self.states = list(states)
        self.calls = 0

    def json(self, *args: str) -> dict:
        self.calls += 1
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


ESTABLISHED = {"status": {"conditions": [{"type": "NamesAccepted", "status": "True"},
                                         {"type": "Established", "status": "True"}]}}


def test_waits_through_no_conditions_until_established(monkeypatch):
    monkeypatch.setattr(demo.time, "sleep", lambda seconds: None)
    kubectl = FakeKubectl({}, {"status": {}}, {"status": {"conditions": [
        {"type": "Established", "status": "False"}]}}, ESTABLISHED)
    demo.wait_established(kubectl, "monarchjobs.monarch-operator.dev")  # type: ignore[arg-type]
    assert kubectl.calls == 4


def test_gives_up_naming_the_crd():
    with pytest.raises(RuntimeError, match="CRD x.example.com not Established after 0s"):
        demo.wait_established(FakeKubectl({}), "x.example.com", timeout=0)  # type: ignore[arg-type]
