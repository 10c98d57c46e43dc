"""`make bench-gpu` (gdr/bench/gpu.py): the dry run, the no-CUDA exit, the tolerant parsing of each step,
the chain's budget, the stage seconds of a cut run, the profile tables, and one smoke step end to end.

The whole smoke chain (`make bench-gpu-smoke`, 4-15 minutes on 2 shared cores) is run by hand, not here.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from gdr.bench import gpu

pytestmark = pytest.mark.cost(seconds=39)  # the file's tests in all, fast lane, 2 cores: dealt first

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
    assert list(cmds) == ["sampling", "scoring", "training", "search", "run", "sampling_t5", "scoring_t5", "bbc",
                          "cranfield"]
    assert "-m gdr.bench.sampling --models smollm2-135m --device cuda" in cmds["sampling"]
    assert ("-m gdr.bench.scoring --device cuda --model smollm2-135m --queries 512 --doc-tokens 128 "
            "--pairs 65536 --naive-pairs 64 --doc-batch-size auto --max-query-tokens auto") in cmds["scoring"]
    assert "--models t5-base-random" in cmds["sampling_t5"]
    assert "--model t5-base-random" in cmds["scoring_t5"] and "--query-tokens 32" in cmds["scoring_t5"]
    assert "-m gdr.bench.training --presets mini,small30m" in cmds["training"]
    assert "--model small30m --docs 100000 --beam 100" in cmds["search"]
    run = cmds["run"]
    for piece in ("-m gdr.cli run +experiment=bbc", "data.n_docs=1000", "sample.n_queries=512",
                  "doc_queries.per_doc=3", "'indexers=[gc,hkmi,random]'", "'seeds=[0]'"):
        assert piece in run
    assert "+experiment=cranfield" in cmds["cranfield"]
    assert summary["configs_valid"] == {"run": True, "bbc": True, "cranfield": True} and summary["errors"] == {}
    assert sum(1 for line in out if line.startswith("[") and "timeout" in line) == 9
    assert summary["budget"] == gpu.BUDGET_S


def _seconds_arg(argv: str) -> float:
    parts = argv.split()
    return float(parts[parts.index("--seconds") + 1])


def test_the_dry_run_plan_gives_every_step_its_warm_up_and_timed_seconds_or_leaves_it_out(tmp_path, capsys):
    """At the default budget every step that runs gets at least its cold-machine load and warm-up plus the timed
    seconds it is asked for (--seconds, per preset for training) plus the margin to print its figures; a step that
    does not fit is left out with a line that says so, and the plan's limits fit in the budget."""
    assert gpu.main(["--dry-run", "--full", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    limits, left_out, cmds = summary["limits_at_budget"], summary["left_out"], summary["commands"]
    assert set(limits) | set(left_out) == set(cmds) and not set(limits) & set(left_out)
    assert {"sampling", "scoring", "training", "search", "run"} <= set(limits)
    assert sum(limits.values()) <= summary["budget"] < 600  # one device call
    for name, limit in limits.items():
        c = gpu.STEP_COSTS[name]
        timed = _seconds_arg(cmds[name]) if c.timed_s else 0
        assert timed == c.timed_s
        assert limit >= c.cold_s + timed * c.rounds + gpu.DEADLINE_MARGIN_S, name
    assert limits["scoring"] >= 71 + 10 and limits["run"] >= 240  # the measured warm-up, the run's work
    for name, why in left_out.items():
        assert any(line.startswith(f"[{name}] left out: needs {summary['timeouts'][name]}s") for line in out)
        assert why.startswith("left out: needs")
    assert {"bbc", "cranfield"} <= set(left_out)
    # a bigger budget runs every step
    assert gpu.main(["--dry-run", "--budget", "1000", "--out", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["left_out"] == {}


def test_only_picks_steps_and_refuses_an_unknown_one(tmp_path, capsys):
    assert gpu.main(["--dry-run", "--only", "run,search", "--out", str(tmp_path)]) == 0
    assert list(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["commands"]) == ["search", "run"]
    assert gpu.main(["--dry-run", "--only", "serch", "--out", str(tmp_path)]) == 2
    line = capsys.readouterr().out.strip()
    assert "--only serch: no such step" in line and "search" in line


def test_dry_run_reports_an_invalid_run_config(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gpu, "RUN_1000", [*gpu.RUN_1000, "indexers=[gc,nonsense]"])
    assert gpu.main(["--dry-run", "--out", str(tmp_path)]) == 1
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["configs_valid"] == {"run": False} and "indexers" in summary["errors"]["run"]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_bench_gpu_without_cuda_exits_2_with_one_line_and_writes_nothing(tmp_path):
    """`make bench-gpu` (python -m gdr.bench.gpu, its arguments in BENCH_ARGS) on a machine without CUDA."""
    p = subprocess.run(["make", "-s", "bench-gpu", f"BENCH_PY={sys.executable}", f"BENCH_ARGS=--out {tmp_path}"],
                       cwd=REPO, env=_no_cuda_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stdout.strip().splitlines()  # stderr: make's own "Error 2"
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0] and "Traceback" not in p.stderr
    assert not list(tmp_path.iterdir())  # nothing written


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


def test_a_step_stopped_at_its_limit_keeps_its_last_json_line_and_loses_its_process_group(tmp_path):
    """A benchmark killed at its limit (a cold compile ran long) still gives the figures of the last JSON line
    it printed, marked partial; its process group goes with it (inductor's compile workers would otherwise
    keep the GPU and the CPUs busy during the next step). It is given --deadline, its limit less the margin."""
    import time

    marker = tmp_path / "grandchild-survived"
    grandchild = f"import time, pathlib; time.sleep(2.5); pathlib.Path({str(marker)!r}).touch()"
    code = ("import json, subprocess, sys, time; a = sys.argv; "
            "deadline = float(a[a.index('--deadline') + 1]) if '--deadline' in a else None; "
            f"subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
            "print(json.dumps({'rate': 7.0, 'deadline': deadline, 'partial': True}), "
            "flush=True); time.sleep(30)")
    step = _step("cold", code, {"x_rate": "rate", "x_warm": "warmup_s"}, timeout=1)
    step.bounded = True
    t0 = time.time()
    rec = gpu.execute(step, tmp_path)
    t1 = time.time()
    assert rec["rc"] == 124 and not rec["ok"] and rec["figures"] == {"x_rate": 7.0, "x_warm": None}
    time.sleep(max(0.0, t0 + 3.5 - time.time()))
    assert not marker.exists(), "the step's grandchild outlived it"
    assert rec["partial"] and "timed out after 1s" in rec["error"]
    assert "from its last JSON line: x_rate" in rec["error"]
    line = gpu.last_json((tmp_path / "cold.log").read_text())
    # the Unix time it was started at (between t0 and t1, whole seconds) plus its limit, 1 s, less the margin
    assert t0 - 0.5 <= line["deadline"] - (1 - gpu.DEADLINE_MARGIN_S) <= t1 + 0.5, (t0, t1, line)


def test_the_budget_is_spread_over_the_steps_left():
    """Each step gets its share of the budget left, by its floor among the steps to come, never less than its
    floor: `--only` the four benchmarks at 420 s gives them the whole budget; time a step leaves unused goes to
    the next ones."""
    steps = gpu.plan("gpu", Path("/tmp/w"))
    four = [s for s in steps if s.name in ("sampling", "scoring", "training", "search")]
    assert [s.timeout for s in four] == [85, 115, 40, 28]
    limits = gpu.planned_limits(four, 420)
    # 420 x 85 / 268 = 133; 287 x 115 / 183 = 180; 107 x 40 / 68 = 62; the last gets what is left: 45
    assert limits == {"sampling": 133, "scoring": 180, "training": 62, "search": 45}
    assert sum(limits.values()) <= 420 and all(limits[s.name] >= s.timeout for s in four)
    default = gpu.planned_limits(steps, gpu.BUDGET_S)
    assert all(default[s.name] >= s.timeout for s in steps if s.name in default)
    assert gpu.step_limit(four[1], four[2:], 420 - 50) == 232  # sampling took 50 s of its 133: 370 x 115 / 183
    assert gpu.step_limit(four[3], [], 30) == 30 and gpu.step_limit(four[3], [], 300) == 300  # the last: all left
    assert all(s.bounded and s.profile and "--seconds" in s.argv for s in four)


def test_a_step_runs_to_the_limit_the_chain_gives_it_not_its_floor(tmp_path):
    """The chain's limit for a step (step_limit: its share of the budget) is what execute() enforces, also above
    the step's own floor: a step planned more than its floor is not stopped at the floor."""
    step = gpu.Step("slow", [sys.executable, "-c", "import time, json; time.sleep(2); print(json.dumps({'x': 1}))"],
                    timeout=1)
    rec = gpu.execute(step, tmp_path, timeout=20)
    assert rec["rc"] == 0 and rec["error"] is None, rec
    assert gpu.execute(step, tmp_path)["rc"] == 124  # on its own, the floor holds


@pytest.mark.parametrize("bench", ["sampling", "scoring", "training", "search"])
def test_benchmarks_time_bound_their_timed_phase_and_report_as_they_go(bench, tmp_path, capsys, monkeypatch):
    """Each benchmark prints a partial JSON line as soon as it has a figure (the load, then the warm-up apart),
    stops timing after --seconds (one round: here 0 s), and skips its profile when --deadline leaves no time
    for it (saying so in the table)."""
    import time

    from gdr.bench import training

    monkeypatch.setattr(training, "MIN_PRESET_S", 0, raising=False)  # a preset starts however near the deadline

    lm = str(gpu.make_tiny_lm(tmp_path / "tiny-lm")) if bench in ("sampling", "scoring") else None
    docs = tmp_path / "docs.txt"
    docs.write_text("the cat sat on the mat\nstocks fell on monday\noil prices rose\nthe club signed a striker\n")
    argv = {"sampling": ["--models", lm, "--docs", "4", "--doc-tokens", "16", "--max-new-tokens", "3",
                         "--queries", "8", "--hf-queries", "4", "--batch-size", "4", "--docs-file", str(docs)],
            "scoring": ["--model", lm, "--queries", "2", "--doc-tokens", "16", "--query-tokens", "3", "--pairs", "8",
                        "--naive-pairs", "0", "--doc-batch-size", "2", "--docs-file", str(docs)],
            "training": ["--presets", "tiny", "--batch", "4", "--steps", "5", "--warmup", "1", "--seq-len", "8"],
            "search": ["--model", "tiny", "--docs", "200", "--beam", "4", "--queries", "8", "--batch", "4",
                       "--no-reference"]}[bench]
    prof = tmp_path / "p.txt"
    module = {"search": "decoding"}.get(bench, bench)
    main = __import__(f"gdr.bench.{module}", fromlist=["main"]).main
    assert main([*argv, "--device", "cpu", "--seconds", "0", "--deadline", str(time.time() + 1),
                 "--profile", str(prof)]) == 0
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    final = lines[-1]
    assert final["partial"] is False and any(ln.get("partial") for ln in lines[:-1])
    if bench == "training":
        assert final["tiny"]["steps"] == 1 and final["tiny"]["launches_per_example"] is None
    else:
        rate = {"sampling": "queries_per_s", "scoring": "engine_pairs_per_s", "search": "queries_per_s"}[bench]
        assert lines[0]["load_s"] is not None and lines[0]["warmup_s"] is None  # before the warm-up
        assert any(ln["warmup_s"] is not None and ln[rate] is None for ln in lines)  # after it, before the timing
        assert final[rate] > 0
        assert final["pairs" if bench == "scoring" else "queries"] == (4 if bench == "scoring" else 4)
    assert "skipped:" in prof.read_text()


def test_run_figures_read_the_report(tmp_path):
    rep = {"seconds": 123.4, "n_docs": 1000, "retrieval": {"gc": {"recall@1": 40.0, "mrr@100": 50.0},
                                                          "random": {"recall@1": 20.0, "mrr@100": 30.0}},
           "bm25": {"recall@1": 35.0, "mrr@100": 45.0}, "stages": [{"name": "score", "seconds": 9.0}]}
    (tmp_path / "report.json").write_text(json.dumps(rep))
    step = gpu.Step("run", ["true"], 1, run_out=tmp_path)
    figures, missing = gpu.run_figures(step)
    assert missing == []
    assert figures["run_seconds"] == 123.4 and figures["run_gc_recall_at_1"] == 40.0
    assert figures["run_random_rr_at_100"] == 30.0 and figures["run_bm25_rr_at_100"] == 45.0
    # RR is named at the run's depth (a run of evaluate.k=10 has no RR@100)
    rep = {**rep, "results_per_query": 10, "retrieval": {"gc": {"recall@1": 40.0, "mrr@10": 48.0}},
           "bm25": {"recall@1": 35.0, "mrr@10": 44.0}}
    (tmp_path / "report.json").write_text(json.dumps(rep))
    figures, _ = gpu.run_figures(step)
    assert figures["run_gc_rr_at_10"] == 48.0 and figures["run_bm25_rr_at_10"] == 44.0
    assert not any(key.endswith("_at_100") for key in figures)
    assert figures["run_stages"] == {"score": 9.0}
    empty, missing = gpu.run_figures(gpu.Step("run", ["true"], 1, run_out=tmp_path / "absent"))
    assert empty == {"run_seconds": None, "run_stage_seconds": {}, "run_unfinished_stages": []}
    assert "not written" in missing[0]


def _stage(run: Path, folder: str, name: str, seconds: float | None, **manifests) -> None:
    d = run / folder
    d.mkdir(parents=True)
    rec = {"stage": name, "status": "complete" if seconds is not None else "running"}
    if seconds is not None:
        rec["seconds"] = seconds
    (d / "stage.json").write_text(json.dumps(rec))
    for file, m in manifests.items():
        (d / f"{file}.manifest.json").write_text(json.dumps(m))


def test_run_stages_of_a_cut_run(tmp_path):
    """A run stopped by its time limit: every finished stage's seconds, sampling apart from scoring, and the
    stage that was running with its seconds so far."""
    run = tmp_path / "run"
    _stage(run, "score-abc", "score", 60.5, queries={"status": "complete", "seconds_last_call": 20.25},
           P={"status": "complete", "seconds_last_call": 38.0})
    _stage(run, "doc-queries-def", "doc-queries", 70.0)
    _stage(run, "index-gc-123", "index-gc", 1.5)
    _stage(run, "train-gc-s0-456", "train-gc-s0", None)
    stages, unfinished = gpu.run_stages(run)
    assert stages["sample"] == 20.25 and stages["score"] == 38.0 and stages["score_stage"] == 60.5
    assert stages["doc_queries"] == 70.0 and stages["index_gc"] == 1.5
    assert unfinished == ["train_gc_s0"] and 0 <= stages["train_gc_s0"] < 60
    figures, missing = gpu.run_figures(gpu.Step("run", ["true"], 1, run_out=run))
    assert figures["run_seconds"] is None and figures["run_stage_seconds"] == stages and "not written" in missing[0]
    assert gpu.run_stages(tmp_path / "absent") == ({}, [])


def test_a_step_whose_floor_does_not_fit_is_left_out_and_the_chain_still_succeeds(tmp_path, monkeypatch, capsys):
    """A step whose floor does not fit in what the budget leaves is left out (a line, `left_out`), not run and
    not an error; bench-gpu.json is written after every step."""
    steps = [_step("a", 'print(\'{"rate": 1.0}\')', {"a_rate": "rate"}, timeout=5),
             _step("b", 'print(\'{"rate": 2.0}\')', {"b_rate": "rate"}, timeout=60)]
    monkeypatch.setattr(gpu, "plan", lambda mode, work, full=False: steps)
    monkeypatch.setattr(gpu, "make_tiny_lm", lambda folder: folder)
    monkeypatch.setattr(gpu, "MIN_STEP_S", 1)
    rc = gpu.main(["--smoke", "--budget", "30", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    res = json.loads(captured.out.strip().splitlines()[-1])
    assert rc == 0 and res["a_rate"] == 1.0 and "b_rate" not in res and res["skipped"] == []
    assert "needs 60s" in res["left_out"]["b"] and "[b] left out: needs 60s" in captured.err
    assert json.loads((tmp_path / "bench-gpu.json").read_text()) == res


def test_a_step_left_too_little_by_an_overrun_is_skipped_as_an_error(tmp_path, monkeypatch, capsys):
    """Both floors fit the budget, but the first step runs past its limit (killed at 1 s): the second finds less
    than its floor left, is skipped and listed, and the chain exits 1."""
    steps = [_step("a", "import time; time.sleep(5)", {}, timeout=1),
             _step("b", 'print(\'{"rate": 2.0}\')', {"b_rate": "rate"}, timeout=9)]
    monkeypatch.setattr(gpu, "plan", lambda mode, work, full=False: steps)
    monkeypatch.setattr(gpu, "make_tiny_lm", lambda folder: folder)
    monkeypatch.setattr(gpu, "MIN_STEP_S", 1)
    rc = gpu.main(["--smoke", "--budget", "10", "--out", str(tmp_path)])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 1 and res["skipped"] == ["b"] and res["left_out"] == {} and "timed out" in res["errors"]["a"]


def test_profile_table_on_the_cpu(tmp_path):
    from gdr.bench.common import profile_table

    a = torch.randn(512, 512)  # large enough that mm's own time dominates matmul's dispatch under load
    summary = profile_table(lambda: [a @ a for _ in range(5)], 5, "pair", torch.device("cpu"), tmp_path / "p.txt",
                            title="matmuls")
    text = (tmp_path / "p.txt").read_text()
    assert summary["top"][0]["op"] == "aten::mm" and summary["top"][0]["calls"] == 5
    assert summary["launch_kind"] == "aten op calls" and summary["launches_per_unit"] >= 1
    assert abs(sum(r["share"] for r in summary["top"]) - 1) < 0.01
    assert text.startswith("# matmuls: 5 pairs") and "aten::mm" in text
    # a profile that fails (e.g. a CUDA graph captured under the profiler) says so and does not raise: the
    # benchmark's figures still come back
    failed = profile_table(lambda: 1 / 0, 5, "pair", torch.device("cpu"), tmp_path / "f.txt", title="broken")
    assert failed["launches_per_unit"] is None and "ZeroDivisionError" in failed["error"]
    assert "FAILED: ZeroDivisionError" in (tmp_path / "f.txt").read_text()


def _cuda_profile():
    """A CUDA profile as torch.profiler's kineto post-processing builds it (real FunctionEvents), shaped like the
    H100 training profile: the CPU operators aten::mm and aten::add_ each with the kernel it launched, the GPU
    kernels themselves, and Optimizer.step#AdamW.step as a CPU user annotation plus its GPU-side span over
    every kernel of the step (Lightning runs forward and backward inside the optimizer step)."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import EventList, FunctionEvent

    def ev(i, name, t0, t1, device=DeviceType.CPU, annotation=False):
        return FunctionEvent(id=i, name=name, thread=0, start_us=t0, end_us=t1, use_device="cuda", stack=[],
                             device_type=device, is_user_annotation=annotation)

    step_cpu = ev(1, "Optimizer.step#AdamW.step", 0, 100, annotation=True)
    mm, add = ev(2, "aten::mm", 10, 20), ev(3, "aten::add_", 30, 40)
    mm.append_kernel("sm90_xmma_gemm", 0, 60.0)
    add.append_kernel("vectorized_elementwise_kernel<add>", 0, 20.0)
    launch = ev(4, "cudaLaunchKernel", 12, 14)
    kernels = [ev(5, "sm90_xmma_gemm", 20, 80, DeviceType.CUDA), ev(6, "vectorized_elementwise_kernel<add>", 90, 110,
                                                                    DeviceType.CUDA),
               ev(7, "Optimizer.step#AdamW.step", 20, 220, DeviceType.CUDA, annotation=True)]
    events = EventList([step_cpu, mm, launch, add, *kernels], use_device="cuda")
    events._build_tree()
    return SimpleNamespace(key_averages=events.key_averages)


def test_cuda_profile_table_counts_each_kernel_once(tmp_path):
    """Kernels and operators apart, each as shares of the kernels' GPU time (80 us here), and the optimizer
    step's annotation (a 200 us span over the same kernels) in neither: on main the table summed operators,
    kernels and the span, so the span came first at 62.8% (H100 training profile) and the rest about halved."""
    from gdr.bench.common import write_table

    summary = write_table(_cuda_profile(), 0.5, 4, "example", torch.device("cuda"), tmp_path / "p.txt",
                          title="training")
    kernels = {r["op"]: r["share"] for r in summary["top"]}
    assert kernels == {"sm90_xmma_gemm": 0.75, "vectorized_elementwise_kernel<add>": 0.25}
    assert {r["op"]: r["share"] for r in summary["top_ops"]} == {"aten::mm": 0.75, "aten::add_": 0.25}
    assert summary["total_ms"] == 0.08 and summary["launches"] == 1 and summary["launches_per_unit"] == 0.25
    text = (tmp_path / "p.txt").read_text()
    assert "Optimizer.step" not in text and "75.0%" in text and "top 2 operators" in text


@pytest.mark.slow(seconds=25)
def test_smoke_search_step_end_to_end(tmp_path):
    """One real step of `make bench-gpu-smoke`: its figures, its warm-up apart, its profile in the archive."""
    p = subprocess.run([sys.executable, "-m", "gdr.bench.gpu", "--smoke", "--only", "search", "--out",
                        str(tmp_path)], cwd=REPO, env=_no_cuda_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["search_queries_per_s"] > 0 and res["search_warmup_s"] >= 0 and res["search_launches_per_query"] > 0
    assert res["search_flops_per_unit"] > 0 and res["search_bytes_per_unit"] > 0 and res["search_limit_per_s"] > 0
    assert 0 < res["search_fraction_of_limit"] and res["search_h200_limit_per_s"] > res["search_limit_per_s"]
    assert res["steps"]["search"]["ok"] and res["errors"] == {} and res["skipped"] == []
    with tarfile.open(tmp_path / "bench-gpu-logs.tar.gz") as tar:
        names = tar.getnames()
        assert "logs/search.log" in names and "logs/search.profile.txt" in names
        table = tar.extractfile("logs/search.profile.txt").read().decode()
    assert "aten op calls" in table and "per query" in table


# ----------------------------------------------------------------------------- the roofline of every benchmark

def test_roofline_limits_from_peaks_hand_checked(monkeypatch):
    """limit = min(peak FLOP/s / FLOPs, peak bytes/s / bytes) per unit; the CPU's peaks are measured (and passed
    in by the benchmarks), a known GPU's come from the data-sheet table, an unknown one has none (and says why);
    an H200's limit is always there."""
    from gdr import cost
    from gdr.bench import common

    monkeypatch.setattr(common, "cpu_peaks", lambda: cost.DevicePeaks("cpu", 1e12, 1e10))
    r = common.roofline(1e9, 1e6, 100.0, "cpu")
    assert r["limit_per_s"] == 1000.0 and r["limit_bound"] == "compute" and r["fraction_of_limit"] == 0.1
    assert r["h200_limit_per_s"] == 989e12 / 1e9 and r["h200_limit_bound"] == "compute"
    assert r["limit_reason"] is None and "measured" in r["peak_source"]
    r = common.roofline(1e6, 1e6, 50.0, "cpu")  # 1 FLOP per byte: bound by memory everywhere
    assert r["limit_per_s"] == 1e4 and r["limit_bound"] == "memory" and r["h200_limit_per_s"] == 4.8e6
    r = cost.roofline(1e6, 1e6, 50.0, "cpu")  # a CPU without measured peaks: no limit, and why
    assert r["limit_per_s"] is None and "CPU peaks not measured" in r["limit_reason"] and r["h200_limit_per_s"]
    monkeypatch.setattr(cost, "device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    r = cost.roofline(1e9, 1e6, 100.0, "cuda")
    assert r["peak_flops"] == 989e12 and r["peak_bytes_per_s"] == 3.35e12 and r["peak_source"] == "data sheet"
    assert r["limit_per_s"] == 989e3 and r["fraction_of_limit"] == pytest.approx(100 / 989e3, abs=1e-5)
    assert cost.peak_bandwidth("cuda") == 3.35e12
    monkeypatch.setattr(cost, "device_name", lambda device=None: "NVIDIA H200")
    assert cost.peak_bandwidth("cuda") == 4.8e12 and cost.peak_flops("cuda") == 989e12
    monkeypatch.setattr(cost, "device_name", lambda device=None: "Mystery Accelerator 9000")
    r = cost.roofline(1e9, 1e6, 100.0, "cuda")
    assert r["limit_per_s"] is None and r["fraction_of_limit"] is None and "Mystery" in r["limit_reason"]
    assert r["h200_limit_per_s"] == 989e3


def test_device_table_is_data_matched_most_specific_first():
    """The peaks are read from device_peaks.json: a PCIe H100 is not taken for an SXM one, a GH200 not for an H200."""
    from gdr import cost

    assert cost.device_peaks("NVIDIA H100 PCIe").flops == 756e12
    assert cost.device_peaks("NVIDIA H100 80GB HBM3").bytes_per_s == 3.35e12
    assert cost.device_peaks("NVIDIA GH200 480GB").bytes_per_s == 4.9e12
    assert cost.device_peaks("NVIDIA H200").memory == 141e9 and cost.device_peaks("cpu") is None


def test_cpu_peaks_are_measured():
    from gdr.bench.common import cpu_peaks

    p = cpu_peaks()
    assert p.flops > 1e8 and p.bytes_per_s > 1e8


def test_cpu_peaks_time_each_dtype_at_the_first_size_whose_call_is_long_enough(monkeypatch):
    """On a clock where a matmul takes what it takes on an AVX2 core (fp32 29 ms at 1,024, bf16 2.3 s: emulated),
    fp32 is timed at 1,024 and bf16 at 256, the first size whose call takes 10 ms; the peak is fp32's."""
    import torch

    from gdr.bench import common

    clock, calls = [0.0], []
    ms_at_1024 = {torch.float32: 29.0, torch.bfloat16: 2300.0}

    def mm(a, b):
        calls.append((a.dtype, a.shape[0]))
        clock[0] += ms_at_1024[a.dtype] / 1e3 * (a.shape[0] / 1024) ** 3
        return a

    def perf_counter():
        clock[0] += 1e-6  # a copy takes a microsecond
        return clock[0]

    monkeypatch.setattr(torch, "mm", mm)
    monkeypatch.setattr(common.time, "perf_counter", perf_counter)
    p = common.cpu_peaks.__wrapped__(copy_mib=1)
    sizes = {dtype: [n for d, n in calls if d == dtype] for dtype in ms_at_1024}
    assert sorted(set(sizes[torch.float32])) == [128, 256, 512, 1024]
    assert sorted(set(sizes[torch.bfloat16])) == [128, 256]
    # at its size, each dtype: the set-up call, the probe, the warm-up and the best of 5
    assert sizes[torch.float32].count(1024) == sizes[torch.bfloat16].count(256) == 2 + 1 + 5
    assert p.flops == pytest.approx(2 * 1024 ** 3 / (0.029 + 1e-6), rel=1e-3)


def test_bytes_and_flops_per_unit_hand_checked():
    """A known tiny Llama (GQA: 4 query heads, 2 KV heads) and a known tiny retriever, counted by hand."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from gdr import cost
    from gdr.cost import hypotheses_per_step, search_bytes_per_query, search_flops_per_query
    from gdr.training.model import GenerativeRetriever, RetrieverConfig

    lm = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    # per layer q 32x32, k and v 32x16 (2 KV heads of 8), o 32x32, MLP 3 x 32x64, 2 norms; final norm; tied head
    P = 2 * (1024 + 512 + 512 + 1024 + 6144 + 64) + 32 + 100 * 32
    assert cost.param_count(lm) == P == 21792
    kv = 2 * 2 * 2 * 8 * 2  # K and V, 2 layers, 2 KV heads (not 4), head dim 8, bf16
    assert cost.kv_bytes_per_position(lm.config, 2) == kv == 128
    stats = dict(decode_context=1000, prefill_tokens=100, decode_tokens=50)
    assert cost.sampling_bytes(lm, stats, decode_steps=10, prefill_passes=2, element_size=2) == (
        12 * P * 2 + kv * (1000 + 100 + 50))
    # 2 docs of 10 prompt tokens a pass, 8 queries of 4 tokens in chunks of 16 tokens: 2 chunks
    assert cost.scoring_bytes_per_pair(lm, 10, 4, 8, 2, 16, 2) == (
        3 * P * 2 + 2 * 2 * 10 * kv + 2 * (10 + 32) * kv) / 16
    assert cost.training_bytes_per_example(1000, 800, 10, True) == (800 * 12 + 1000 * 44) / 10

    cfg = RetrieverConfig(encoder=None, encoder_config=dict(d_model=8, num_layers=1, num_heads=2, d_kv=4, d_ff=16),
                          tokenizer="unused", n_digits=3, max_code_len=2, d_model=8, num_layers=1, num_heads=2,
                          d_ff=16, dropout=0.0)
    r = GenerativeRetriever.build(cfg, vocab_size=50)
    enc = 4 * 8 * 8 + 2 * 8 + 2 * 8 * 16 + 8  # q k v o, 2 norms, FF, final norm (embeddings are lookups)
    dec = 2 * 4 * 8 * 8 + 3 * 8 + 2 * 8 * 16 + 8  # self and cross q k v o, 3 norms, FF, final norm
    assert (cost.param_count(r.encoder), cost.param_count(r.decoder)) == (enc, dec) == (536, 800)
    assert hypotheses_per_step(3, 2, beam=5) == [1, 4, 5]
    S, cross_kv, A, K1 = 6, 2 * 8 * 8, 8, 4
    per_hyp = 2 * (dec - cross_kv) + 2 * 8 * K1
    expect = S * 2 * enc + 4 * A * S * S + S * 2 * cross_kv + sum(
        w * (per_hyp + 4 * A * (t + 1 + S)) for t, w in enumerate([1, 4, 5]))
    assert search_flops_per_query(r, S, beam=5) == expect == 25888
    pos = 2 * A * 4  # one cached position (K and V, 1 layer), fp32
    expect = ((enc + 3 * dec) * 4 / 2  # encoder once, decoder each of 3 steps, shared by a batch of 2
              + S * pos * 4  # cross K/V written once, read at 3 steps
              + 1 * 2 * pos + 4 * 1 * pos * 2 + 4 * 3 * pos + 5 * 2 * pos * 2 + 5 * 4 * pos)  # steps and reorders
    assert search_bytes_per_query(r, S, beam=5, batch=2, element_size=4) == expect == 11376


ROOF_KEYS = ("flops_per_unit", "bytes_per_unit", "limit_per_s", "fraction_of_limit", "h200_limit_per_s")


def _sane_roofline(res: dict, rate: float) -> None:
    assert res["flops_per_unit"] > 0 and res["bytes_per_unit"] > 0 and res["limit_reason"] is None
    assert res["limit_per_s"] > 0 and res["limit_bound"] in ("compute", "memory")
    assert res["fraction_of_limit"] == pytest.approx(rate / res["limit_per_s"], rel=1e-2, abs=1e-5)  # rates rounded
    assert res["h200_limit_per_s"] > 0 and res["h200_limit_bound"] in ("compute", "memory")


def test_every_benchmark_json_has_the_roofline(tmp_path, capsys):
    """The sampling, scoring, training and search benchmarks on tiny models: each JSON gives FLOPs and bytes per
    unit, the limit on this CPU's measured peaks, the fraction of it, and one H200's limit."""
    from gdr.bench import decoding, sampling, scoring, training

    lm = str(gpu.make_tiny_lm(tmp_path / "tiny-lm"))
    docs = tmp_path / "docs.txt"
    docs.write_text("the cat sat on the mat\nmarkets fell on tuesday after the rate rise\nthe team won the final\n")
    runs = {
        "sampling": (sampling.main, ["--models", lm, "--docs", "3", "--doc-tokens", "8", "--max-new-tokens", "2",
                                     "--queries", "4", "--batch-size", "4", "--hf-queries", "1", "--device", "cpu",
                                     "--docs-file", str(docs)], "queries_per_s"),
        "scoring": (scoring.main, ["--model", lm, "--device", "cpu", "--queries", "2", "--doc-tokens", "8", "--pairs",
                                   "4", "--naive-pairs", "0", "--query-tokens", "2", "--docs-file", str(docs)],
                    "engine_pairs_per_s"),
        "training": (training.main, ["--presets", "tiny", "--batch", "4", "--steps", "1", "--warmup", "1", "--device",
                                     "cpu", "--seq-len", "8"], "examples_per_s"),
        "search": (decoding.main, ["--docs", "200", "--beam", "5", "--queries", "2", "--batch", "2",
                                   "--no-reference", "--device", "cpu"], "queries_per_s"),
    }
    for name, (main, argv, rate) in runs.items():
        assert main(argv) == 0, name
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        res = out["tiny"] if name == "training" else out
        assert set(ROOF_KEYS) <= res.keys(), name
        _sane_roofline(res, res[rate])
    # the chain surfaces them: every step's figures name the five roofline keys
    figures = {k for s in gpu.plan("gpu", tmp_path) for k in s.figures}
    for prefix in ("sampling", "scoring", "sampling_t5", "scoring_t5", "training_mini", "training_small30m", "search"):
        assert {f"{prefix}_{k}" for k in ROOF_KEYS} <= figures, prefix


@pytest.mark.parametrize("bench,argv,message", [
    ("training", ["--K", "4", "--depth", "3", "--docs", "65"],
     "--docs 65: more than the 64 distinct docids of --K 4 --depth 3; lower --docs or raise --K or --depth"),
    ("decoding", ["--K", "4", "--depth", "3", "--docs", "65"], "--docs 65: more than the 64 distinct docids"),
    ("training", ["--steps", "0"], "argument --steps: 0: must be a positive integer"),
    ("training", ["--seq-len", "0"], "argument --seq-len: 0: must be a positive integer"),
    ("training", ["--warmup", "-1"], "argument --warmup: -1: must be an integer >= 0"),
    ("training", ["--batch", "abc"], "argument --batch: abc: must be auto or a positive integer"),
    ("training", ["--seed", "-1"], "argument --seed: -1: must be an integer in [0, 2^32)"),
    ("training", ["--seconds", "inf"], "argument --seconds: inf: must be a number >= 0"),
    ("decoding", ["--K", "0"], "argument --K: 0: must be a positive integer"),
    ("decoding", ["--batch", "0"], "argument --batch: 0: must be auto or a positive integer"),
    ("sampling", ["--top-p", "1.5"], "argument --top-p: 1.5: must be a number in (0, 1]"),
    ("sampling", ["--top-k", "-1"], "argument --top-k: -1: must be an integer >= 0"),
    ("sampling", ["--hf-batch-size", "auto"], "argument --hf-batch-size: auto: must be a positive integer"),
    ("scoring", ["--naive-pairs", "-1"], "argument --naive-pairs: -1: must be an integer >= 0"),
    ("scoring", ["--doc-batch-size", "0"], "argument --doc-batch-size: 0: must be auto or a positive integer"),
    ("indexing", ["--memory-mb", "0"], "argument --memory-mb: 0: must be a number > 0"),
    ("overlap", ["--alone-s", "nan"], "argument --alone-s: nan: must be a number > 0"),
    ("clustering", ["--alpha", "-0.25"], "argument --alpha: -0.25: must be a number > 0"),
    ("integrity", ["--mb", "0"], "argument --mb: 0: must be a positive integer"),
    ("gpu", ["--budget", "0"], "argument --budget: 0: must be a positive integer"),
])
def test_every_benchmark_refuses_a_number_out_of_range_at_the_door(bench, argv, message, capsys):
    """A benchmark's numbers are checked as it parses them, in the words of gdr's settings (gdr.rules.option_type):
    exit 2 and one line naming the option, not a traceback (or a figure of 0 timed steps) once a model is built."""
    import importlib

    main = importlib.import_module(f"gdr.bench.{bench}").main
    with pytest.raises(SystemExit) as refused:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and message in err[-1], err
