"""The run's report sets the seconds `gdr plan` predicted (its plan.json in the run folder) beside the measured ones
for every stage (report.md's stage table and report.json), predicted from the settings alone (no model loaded); a
stage the plan does not model shows n/a, a run without a plan leaves the column out, and the report is still
written. Offline, CPU, tiny models."""
from __future__ import annotations

import json

import pytest
import transformers
from test_pipeline import setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document corpus)

from gdr import plan
from gdr.cli import main
from gdr.config import load_config


def _table(md: str) -> dict[str, list[str]]:
    """The report's stage table: stage name -> its cells."""
    rows = md.split("## Stages", 1)[1].splitlines()
    head = next(i for i, line in enumerate(rows) if line.startswith("| stage |"))
    assert rows[head] == "| stage | folder | seconds | predicted | last attempt | attempts | |"
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in rows[head + 2:] if line.startswith("|")]
    return {c[0]: c for c in cells}


def test_the_report_sets_predicted_seconds_beside_the_measured_ones(tiny_run, tmp_path, capsys):
    # the session's finished gc + random run, copied: its report is written again, from the stages' records and
    # the plan.json in the run folder, whether its stages ran in this invocation or were reused
    out, args = tiny_run.copy(tmp_path / "run")
    (out / "plan.json").unlink(missing_ok=True)
    assert main(["plan", *args[1:], "device=cpu"]) == 0  # the plan into the run folder, before the run
    assert main(args) == 0
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    assert set(stages) == {"score", "doc-queries", "index-gc", "index-random", "bm25", "train-gc-s0", "eval-gc-s0",
                           "train-random-s0", "eval-random-s0"}
    predicted = {n: s["predicted_seconds"] for n, s in stages.items()}
    assert predicted["index-random"] <= predicted["index-gc"]  # GC's indexing reads P; random ids only count
    assert all(isinstance(v, float) and v >= 0 for v in predicted.values()), predicted  # every stage modelled
    assert all(predicted[n] > 0 for n in ("score", "doc-queries", "train-gc-s0", "eval-gc-s0")), predicted
    assert predicted["train-gc-s0"] == predicted["train-random-s0"]  # training shared evenly by the retrievers
    table = _table((out / "report.md").read_text())
    assert set(table) == set(stages)
    for name, s in stages.items():
        cells = table[name]
        assert cells[2] == f"{s['seconds']:.1f}"
        assert cells[3] == ("n/a" if s["predicted_seconds"] is None else f"{s['predicted_seconds']:.1f}")

    (out / "plan.json").unlink()
    assert main(args) == 0  # every stage reused, the report written again without predictions
    again = json.loads((out / "report.json").read_text())
    assert [s["predicted_seconds"] for s in again["stages"]] == [None] * len(stages)
    assert "predicted" not in (out / "report.md").read_text().split("## Stages", 1)[1].split("\n\n")[2]


def test_predicting_reads_configs_only(setup, monkeypatch):
    root, _ = setup

    def no_load(*a, **k):
        raise AssertionError("predicting loaded a model")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", no_load)
    names = ["score", "index-gc", "bm25", "train-gc-s0", "eval-gc-s0"]
    for model in (str(root / "tiny-llama"), "smollm2-135m"):
        cfg = load_config("run", ["data=bbc", f"model.name={model}", "train.model.size=tiny", "indexers=[gc]",
                                  "device=cpu"])
        got = plan.predict_stages(cfg, names, 30)
        assert all(got[n] > 0 for n in ("score", "train-gc-s0", "eval-gc-s0")) and got["bm25"] >= 0, (model, got)
    cfg = load_config("run", ["data=bbc", "model.name=no-such/model", "device=cpu"])
    assert plan.predict_stages(cfg, names, 30) == {n: None for n in names}


@pytest.mark.parametrize("n_docs", [30, 300])
def test_predicted_score_seconds_grow_with_the_documents(n_docs):
    cfg = load_config("run", ["data=bbc", "device=cpu"])
    small, large = plan.predict_stages(cfg, ["score"], n_docs)["score"], plan.predict_stages(cfg, ["score"],
                                                                                          10 * n_docs)["score"]
    assert large > small > 0


def test_a_training_capped_by_max_steps_is_predicted_shorter():
    def train_seconds(*extra):
        cfg = load_config("run", ["data=bbc", "device=cpu", "train.model.size=tiny", *extra])
        return plan.predict_stages(cfg, ["train-gc-s0"], 300)["train-gc-s0"]

    assert train_seconds("train.trainer.max_steps=6") < train_seconds() / 10
