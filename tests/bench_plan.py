"""Benchmark: the seconds `gdr plan device=cpu` predicts against those of a measured `gdr run` at test size (the
tiny random-init LM and retriever and the 30-document corpus of tests/test_pipeline.py, on this CPU, one after the
other), and the seconds the plan's calibration took.

    make bench-plan          (or: PYTHONPATH=$PWD python tests/bench_plan.py [--out DIR])

The run; then `gdr plan <its overrides> device=cpu --recalibrate` (gdr/calibrate.py timed afresh: its seconds and
the load average it ran at); then the check of `gdr plan --check RUN device=cpu`, each stage's plan beside its
measured seconds. On a quiet machine each compared stage is within BOUND either way; a busy one moves a stage of a
few seconds by several times, which is why this is a benchmark and not a test (tests/test_plan_calibration.py
checks, on any machine, that the plan counts the run's work). Prints the tables; the LAST line is one JSON object:
per compared stage (predicted, measured, predicted / measured), `within_bound`, the calibration's seconds and load
average. Exits 0 whatever the ratios: it measures, it does not judge.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

import torch
from test_pipeline import _args, toy_collection
from tiny_models import saved_tiny_llama

from gdr.cli import main as gdr
from gdr.plan import check_run, format_check

BOUND = 4.0  # a plan that misses a stage by an order of magnitude (a step left out, a unit miscounted) is outside
COMPARED = ("score", "doc-queries", "train-gc-s0", "train-random-s0")


def _captured(argv: list[str]) -> str:
    """What `gdr <argv>` prints (echoed), after checking it exits 0."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = gdr(argv)
    print(buf.getvalue(), end="")
    if rc != 0:
        raise SystemExit(f"gdr {' '.join(argv)}: exit {rc}")
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="an empty folder for the models, the corpus, the run and the cache "
                                             "(default: a new temporary folder)")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="gdr-bench-plan-"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ["GDR_CACHE"] = str(out / "cache")  # a calibration of its own, not one cached earlier
    torch.set_num_threads(1)  # as the tests' runs (threads=1)
    saved_tiny_llama(out / "tiny-llama")
    args = _args(out, toy_collection(out / "toy"), out / "run", "indexers=[gc,random]")
    _captured(args)
    _captured(["plan", *args[1:], "device=cpu", "data.n_docs=30", "--recalibrate"])
    (cached,) = (out / "cache" / "plan-calibration").glob("*.json")
    cal = json.loads(cached.read_text())["figures"]
    check = check_run(out / "run", "cpu")  # what `gdr plan --check RUN device=cpu` prints, as numbers
    print(format_check(check))
    rows = {name: (plan, measured) for name, _, plan, measured in check.rows}
    compared = {n: rows[n] for n in COMPARED}
    compared["total of these"] = tuple(sum(r[i] for r in compared.values()) for i in (0, 1))
    figures = {n: (round(p, 2), m, round(p / m, 2) if m > 0 else None) for n, (p, m) in compared.items()}
    within = all(r is not None and 1 / BOUND <= r <= BOUND for _, _, r in figures.values())
    print(json.dumps({"stages": figures, "bound": BOUND, "within_bound": within,
                      "calibration_s": cal["calibration_s"], "calibration_load_average": cal["load_average"],
                      "load_average_now": round(os.getloadavg()[0], 1), "out": str(out)}))


if __name__ == "__main__":
    main()
