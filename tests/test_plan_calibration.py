"""`gdr plan device=cpu` calibrated on this CPU (gdr/calibrate.py) against a measured `gdr run` at test size: the
tiny random-init LM and retriever of the pipeline tests, on the same machine, one after the other."""
from __future__ import annotations

import json

import pytest
from test_pipeline import _args, setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document corpus)

from gdr.cli import main
from gdr.config import load_config
from gdr.plan import plan_run, stage_seconds

# A loaded shared CI machine moves a stage of a few seconds by several times either way; the check still fails a
# plan that misses a stage by an order of magnitude (a step left out, a unit miscounted).
BOUND = 4.0
pytestmark = pytest.mark.alone  # not beside a parallel worker, whose load would fall on the run or the calibration


def test_the_calibrated_cpu_plan_predicts_a_run_at_test_size(setup, tmp_path, monkeypatch):
    root, folder = setup
    monkeypatch.setenv("GDR_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    args = _args(root, folder, out, "indexers=[gc,random]")
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    measured = {s["name"]: s["seconds"] for s in report["stages"]}
    cfg = load_config("run", [*args[1:], "device=cpu", "data.n_docs=30"])
    stages = plan_run(cfg, "cpu", calibrate="run")
    assert all("calibrated on this CPU" in s.basis for s in stages if s.name in ("sampling", "scoring", "training"))
    cached = list((tmp_path / "cache" / "plan-calibration").glob("*.json"))  # cached per machine and shapes
    assert len(cached) == 1
    assert json.loads(cached[0].read_text())["figures"]["calibration_s"] < 30  # the calibration's budget
    assert "at load average" in next(s for s in stages if s.name == "training").basis  # how busy it was
    again = plan_run(cfg, "cpu", calibrate="cache")  # read back, not measured again
    assert "cached" in next(s for s in again if s.name == "training").basis
    fresh = plan_run(cfg, "cpu", calibrate="refresh")  # gdr plan --recalibrate: timed again
    assert "cached" not in next(s for s in fresh if s.name == "training").basis
    predicted = stage_seconds(stages, list(measured), 2)
    rows = {n: (predicted[n], measured[n]) for n in ("score", "doc-queries", "train-gc-s0", "train-random-s0")}
    rows["total of these"] = tuple(sum(r[i] for r in rows.values()) for i in (0, 1))
    print({n: (round(p, 2), round(m, 2), round(p / m, 2)) for n, (p, m) in rows.items()})
    for name, (p, m) in rows.items():
        assert 1 / BOUND <= p / m <= BOUND, (name, p, m, rows)
