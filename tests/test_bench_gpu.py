"""`make bench-gpu` (gdr/cli/bench/gpu.py): the dry run, the no-CUDA exit, and the tolerant parsing of each step.

The chain itself is run by hand (`make bench-gpu-smoke` on a CPU, `make bench-gpu` on a GPU), not here.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gdr.cli.bench import gpu

REPO = Path(__file__).resolve().parents[1]


def _no_cuda_env() -> dict[str, str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    env.pop("OUT", None)
    return env


def test_dry_run_lists_every_command_and_validates_the_run_configs(tmp_path, capsys):
    assert gpu.main(["--dry-run", "--full", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    cmds = summary["commands"]
    assert list(cmds) == ["sampling", "scoring", "scoring_t5", "training", "search", "run", "bbc", "cranfield"]
    assert "-m gdr.cli.bench.sampling" in cmds["sampling"]
    assert ("-m gdr.cli.bench.scoring --device cuda --model smollm2-135m --queries 1024 --doc-tokens 128 "
            "--pairs 131072 --naive-pairs 64 --doc-batch-size auto --max-query-tokens auto") in cmds["scoring"]
    assert "--model t5-base-random" in cmds["scoring_t5"] and "--query-tokens 32" in cmds["scoring_t5"]
    assert "-m gdr.cli.bench.training --presets mini,small30m" in cmds["training"]
    assert "--model small30m --docs 100000 --beam 100" in cmds["search"]
    run = cmds["run"]
    for piece in ("-m gdr.cli run +experiment=bbc", "data.n_docs=1000", "sample.n_queries=512",
                  "'indexers=[gc,hkmi,random]'", "'seeds=[0]'"):
        assert piece in run
    assert "+experiment=cranfield" in cmds["cranfield"]
    assert summary["configs_valid"] == {"run": True, "bbc": True, "cranfield": True} and summary["errors"] == {}
    # the human-readable lines name each step and its timeout; the default chain fits 6 minutes
    assert sum(1 for line in out if line.startswith("[") and "timeout" in line) == 8
    assert sum(v for k, v in summary["timeouts"].items() if k not in ("bbc", "cranfield")) <= 360


def test_dry_run_reports_an_invalid_run_config(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu, "RUN_1000", [*gpu.RUN_1000, "indexers=[gc,nonsense]"])
    assert gpu.main(["--dry-run", "--out", str(tmp_path)]) == 1
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["configs_valid"] == {"run": False} and "indexers" in summary["errors"]["run"]


def test_without_cuda_the_real_run_prints_one_line_and_exits_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "gdr.cli.bench.gpu", "--out", str(tmp_path)], cwd=REPO,
                       env=_no_cuda_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = (p.stdout + p.stderr).strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_bench_gpu_without_cuda_exits_2_with_one_line():
    p = subprocess.run(["make", "-s", "bench-gpu", f"BENCH_PY={sys.executable}"], cwd=REPO, env=_no_cuda_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert len(p.stdout.strip().splitlines()) == 1 and "needs a CUDA GPU" in p.stdout


def test_last_json_takes_the_last_object_line():
    text = 'progress 1\n{"a": 1}\nnot json {\n{"b": 2, "c": {"d": 3}}\n[1, 2]\ntrailing words\n'
    assert gpu.last_json(text) == {"b": 2, "c": {"d": 3}}
    assert gpu.last_json("no json at all\n") is None


def _step(name: str, code: str, figures: dict[str, str], timeout: int = 60) -> gpu.Step:
    return gpu.Step(name, [sys.executable, "-c", code], timeout, figures=figures)


def test_a_step_missing_a_key_a_failing_step_and_a_hung_step_are_recorded(tmp_path):
    figs = {"x_rate": "rate", "x_nested": "inner.value", "x_mfu": "mfu"}
    ok = gpu.execute(_step("ok", 'print("hi"); print(\'{"rate": 5.0, "inner": {"value": 2}, "mfu": null, '
                                 '"device": "cpu"}\')', figs), tmp_path)
    assert ok["ok"] and ok["error"] is None and ok["device"] == "cpu"
    assert ok["figures"] == {"x_rate": 5.0, "x_nested": 2, "x_mfu": None}  # MFU may be null (unknown peak)
    partial = gpu.execute(_step("partial", 'print(\'{"rate": 5.0}\')', figs), tmp_path)
    assert not partial["ok"] and partial["figures"]["x_nested"] is None and "inner.value" in partial["error"]
    failed = gpu.execute(_step("failed", 'import sys; print("boom: bad flag"); sys.exit(3)', figs), tmp_path)
    assert failed["rc"] == 3 and "boom: bad flag" in failed["error"] and failed["figures"]["x_rate"] is None
    hung = gpu.execute(_step("hung", "import time; time.sleep(30)", figs, timeout=1), tmp_path)
    assert hung["rc"] == 124 and "timed out" in hung["error"]
    assert (tmp_path / "failed.log").read_text().startswith("$ ")


def test_run_figures_read_the_report(tmp_path):
    rep = {"seconds": 123.4, "n_docs": 1000, "retrieval": {"gc": {"recall@1": 40.0, "mrr@100": 50.0},
                                                          "random": {"recall@1": 20.0, "mrr@100": 30.0}},
           "bm25": {"recall@1": 35.0, "mrr@100": 45.0}, "stages": [{"name": "score", "seconds": 9.0}]}
    (tmp_path / "report.json").write_text(json.dumps(rep))
    step = gpu.Step("run", ["true"], 1, run_out=tmp_path)
    figures, missing = gpu.run_figures(step)
    assert missing == []
    assert figures["run_seconds"] == 123.4 and figures["run_gc_recall_at_1"] == 40.0
    assert figures["run_random_mrr_at_100"] == 30.0 and figures["run_bm25_mrr_at_100"] == 45.0
    assert figures["run_stages"] == {"score": 9.0}
    empty, missing = gpu.run_figures(gpu.Step("run", ["true"], 1, run_out=tmp_path / "absent"))
    assert empty == {"run_seconds": None} and "not written" in missing[0]
