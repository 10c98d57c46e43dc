"""`gdr plan device=cpu`, calibrated on this CPU (gdr/calibrate.py), against a `gdr run` at test size (the tiny
random-init LM and retriever of the pipeline tests: conftest's ``tiny_run``, read only): the plan counts the work the
run does, stage by stage (the queries sampled, the pairs scored, the generated queries, the retrievers, their steps
and batch), and the calibration times the run's own shapes, once per machine and shapes. Both sides are read
through the commands (`gdr run`'s folder, `gdr plan`'s JSON line), as a user reads them.

Counted work, not seconds: a plan that leaves a step out or miscounts a unit fails here on any machine. The seconds
themselves (predicted against measured, and the calibration's budget) move with the machine's load; the benchmark
`make bench-plan` (tests/bench_plan.py) prints them."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from gdr.cli import main

# What the pipeline tests' run sets (tests/test_pipeline.py: _args), the plan's counts checked against the run's
N_DOCS, J, PER_DOC, BATCH, MAX_STEPS = 30, 16, 2, 16, 6
# Each step the calibration times, as gdr/calibrate.py documents them
CALIBRATED = {"lm_load_s", "sampling_s_per_query", "doc_queries_s_per_query", "scoring_s_per_pair",
              "training_s_per_example", "search_s_per_query", "retriever_setup_s"}


def _plan(args: list[str], capsys, *extra: str) -> dict[str, dict]:
    """The stages of `gdr plan device=cpu` for the run ``args`` (its JSON line)."""
    assert main(["plan", *args[1:], "device=cpu", f"data.n_docs={N_DOCS}", *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stages"]


def _count(basis: str, pattern: str) -> int:
    """The number ``pattern``'s group reads in a stage's basis (thousands separated by commas)."""
    m = re.search(pattern, basis)
    assert m, (pattern, basis)
    return int(m.group(1).replace(",", ""))


def _run_counts(out: Path) -> dict[str, int | list[int]]:
    """The work the run in ``out`` did, counted from its folders."""
    folder = {s["name"]: out / s["folder"] for s in json.loads((out / "report.json").read_text())["stages"]}
    score, docq = folder["score"], folder["doc-queries"]
    trained = [json.loads((p / "manifest.json").read_text()) for n, p in folder.items() if n.startswith("train-")]
    return {"queries": len((score / "queries.jsonl").read_text().splitlines()),
            "pairs": int(np.prod(np.load(score / "P.npy", mmap_mode="r").shape)),
            "doc_queries": sum(len(json.loads(line)["queries"])
                               for line in (docq / "doc_queries.jsonl").read_text().splitlines()),
            "retrievers": len(trained), "steps": [m["global_step"] for m in trained],
            "batches": [m["batch_size"] for m in trained],
            "evaluated": sum(n.startswith("eval-") for n in folder)}


def test_the_calibrated_cpu_plan_counts_the_work_of_a_run_at_test_size(tiny_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GDR_CACHE", str(tmp_path / "cache"))  # a calibration of its own
    # out= elsewhere: the plan writes its plan.json there, and the tiny run's folder is only read
    args = [a if not a.startswith("out=") else f"out={tmp_path / 'planned'}" for a in tiny_run.args]
    ran = _run_counts(tiny_run.out)
    assert ran == {"queries": J, "pairs": N_DOCS * J, "doc_queries": N_DOCS * PER_DOC, "retrievers": 2,
                   "steps": [MAX_STEPS] * 2, "batches": [BATCH] * 2, "evaluated": 2}

    stages = _plan(args, capsys)
    assert all("calibrated on this CPU" in stages[s]["basis"] for s in ("sampling", "scoring", "training"))
    planned = {"queries": _count(stages["sampling"]["basis"], r"([\d,]+) queries at"),
               "pairs": _count(stages["scoring"]["basis"], r"([\d,]+) pairs at"),
               "doc_queries": _count(stages["doc_queries"]["basis"], r"([\d,]+) queries at"),
               "retrievers": _count(stages["training"]["basis"], r"(\d+) retrievers x"),
               "steps": [_count(stages["training"]["basis"], r"retrievers x ([\d,]+) steps")] * 2,
               "batches": [_count(stages["training"]["basis"], r"x batch (\d+)")] * 2,
               "evaluated": _count(stages["evaluation"]["basis"], r"^(\d+) x ")}
    assert planned == ran

    # the calibration: timed at the run's shapes, every step of it, cached per machine and shapes
    cached = list((tmp_path / "cache" / "plan-calibration").glob("*.json"))
    assert len(cached) == 1
    cal = json.loads(cached[0].read_text())
    assert {k: cal["shapes"][k] for k in ("n_docs", "sample_batch", "score_queries", "per_doc", "batch",
                                          "doc_tokens", "new_tokens")} == {
        "n_docs": N_DOCS, "sample_batch": 8, "score_queries": J, "per_doc": PER_DOC, "batch": BATCH,
        "doc_tokens": 24, "new_tokens": 6}
    assert CALIBRATED <= set(cal["figures"]) and all(cal["figures"][k] > 0 for k in CALIBRATED)
    assert "at load average" in stages["training"]["basis"]  # how busy the machine was when timed
    again = _plan(args, capsys)  # read back, not measured again
    assert "cached" in again["training"]["basis"]
    fresh = _plan(args, capsys, "--recalibrate")  # timed again
    assert "cached" not in fresh["training"]["basis"]
    assert list((tmp_path / "cache" / "plan-calibration").glob("*.json")) == cached
