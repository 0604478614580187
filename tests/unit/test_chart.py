"""The chart ships the same CRD as crds/."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_chart_crds_identical_to_top_level_crds():
    top = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    chart = sorted(p.name for p in (ROOT / "charts/monarch-operator/crds").glob("*.yaml"))
    assert top == chart and top
    for name in top:
        assert (ROOT / "crds" / name).read_bytes() == (
            ROOT / "charts/monarch-operator/crds" / name).read_bytes(), name
