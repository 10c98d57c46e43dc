"""``make bench-gpu``: every GPU figure of the pipeline in one command, one JSON line last.

    python -m gdr.bench.gpu              # on a CUDA machine: BUDGET_S seconds in all, cold machine included
    python -m gdr.bench.gpu --only run   # one step (comma-separated names)
    python -m gdr.bench.gpu --dry-run    # anywhere: print every command, validate the `gdr run` configs
    python -m gdr.bench.gpu --smoke      # on a CPU: the whole chain at tiny sizes (4-15 minutes on 2 cores)
    python -m gdr.bench.gpu --full       # also `gdr run +experiment=bbc` and `+experiment=cranfield`

Each step is a subprocess with a timeout: the sampling, scoring, training and decoding (search) benchmarks,
then ``gdr run`` on 1,000 BBC articles (J = 512; indexers gc, hkmi, random; one seed), then the random-init
T5-base sampling and scoring while the chain's budget lasts. Each benchmark's last JSON line is parsed; a step
that fails, times out or lacks a figure leaves that figure null and its error in ``errors``, and the chain goes
on. Nothing here imports Hydra, OmegaConf or the LM stack, so the command starts on a bare CUDA image.

Each step's floor (:data:`STEP_COSTS`, :func:`floor_s`) is its cold part (model load, GGUF conversion,
compilation and graph capture on a cold machine: ``cold_s``) plus its steady-state seconds (``timed_s``, passed
to the benchmark as ``--seconds``) plus :data:`DEADLINE_MARGIN_S`. The cold parts are the load and warm-up
seconds a cold H200 measured for each benchmark (reports/gpu-runs/), rounded up; the T5 steps' are estimates
(no cold T5 figure is committed). The chain takes the steps in order while their floors fit in the budget
(:data:`BUDGET_S`, or ``--budget``); a step whose floor does not fit is left out with a line saying so
(``left_out`` in the JSON; not an error). Each step that runs gets its share of what is left of the budget, in
proportion to its floor among the steps still to come, never less than its floor (:func:`step_limit`); so time
a step leaves unused goes to the steps after it, and ``--only`` of a few steps spreads the whole budget over them
(``--dry-run`` prints the limits as ``limits_at_budget``). A step that finds less than its floor left when its
turn comes (a step before it overran) is skipped (listed in ``skipped``: an error). A run that times out still
reports the seconds of every stage it finished (``stage.json`` of each stage folder).

A cold GPU spends most of a benchmark's time compiling and capturing, so every benchmark bounds its own time:
it gets ``--deadline`` (its limit less :data:`DEADLINE_MARGIN_S`) and a steady-state ``--seconds``, prints a
JSON line (``"partial": true``) as soon as it has a figure (after the warm-up, after each timed round), and
runs its profile only after the timed phase and only if the deadline leaves time for it. A step still running
at its limit is stopped with its whole process group; its figures come from the last JSON line it printed
(``steps.<name>.partial``; its error says which figures that line had).

Every figure comes with its cold part apart: ``*_load_s`` (model load, GGUF conversion on a cold cache),
``*_warmup_s`` (first batches: compilation, graph capture, allocator) and the steady-state rates. Each benchmark
step also writes a ``torch.profiler`` table (``<step>.profile.txt``: top CUDA ops by time and share, kernel
launches per query / pair / example; on a CPU the top CPU ops and aten calls per unit) into the logs archive.

Outputs go under ``$OUT`` when it is set (the device machine returns at most 8 files: ``bench-gpu.json`` and
``bench-gpu-logs.tar.gz``, the step logs and profiles with the runs' report.md/report.json and stage.json files),
else under ``--out``; both are rewritten after every step, so a chain cut short still brings back what it did.
The run folders themselves go to ``--work`` (default: ``<tmp>/gdr-bench-gpu`` when ``$OUT`` is set, else under
``--out``); each run's folder is emptied first, so that no cached stage is reused.
The LAST line printed is one JSON object: ``device``, ``seconds``, every figure as a flat key (null when
missing), ``run_stage_seconds`` (sample, score, doc_queries, index_*, train_*, eval_*, ...), ``steps`` (rc,
seconds, ok per step), ``left_out`` (step: why), ``skipped`` and ``errors``.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from gdr.config import load_config
from gdr.models import resolve_model
from gdr.paths import checkout
from gdr.validate import error_line, validate

__all__ = ["Step", "plan", "main", "last_json", "extract", "run_stages", "step_limit", "planned_limits", "RUN_1000",
           "BUDGET_S", "LIMITS", "STEP_COSTS", "StepCost", "floor_s"]

# The checkout whose gdr the steps run (on a bare CUDA image, without an install); None: the installed gdr
REPO = checkout()

# The whole default chain on one H100/H200, cold machine included: under a device call's 10 minutes, with room
# for the interpreter's start and the logs archive
BUDGET_S = 570
MIN_STEP_S = 15
SMOKE_BUDGET_S = 2400  # --smoke on a shared CPU: correctness, not speed
DEADLINE_MARGIN_S = 5  # a benchmark's --deadline is this long before its step is stopped: to print its figures


@dataclass(frozen=True)
class StepCost:
    """Seconds a step needs on a cold GPU: ``cold_s`` (load, conversion, compilation, graph capture, the
    benchmark's own set-up) and ``timed_s`` (the steady-state phase, ``--seconds``; 0 for a ``gdr run``) for each
    of its ``rounds`` (the training benchmark times each preset)."""

    cold_s: int
    timed_s: int
    rounds: int = 1


# sampling: SmolLM2 load with the GGUF conversion 32 s + warm-up 34 s + HF generate's 256 queries; scoring: load
# 8 s (the GGUF is converted by then) + its own 512-query sampling + warm-up 71 s; training: two presets' builds
# and warm-ups (the step took 33 s with 10 timed seconds each); search: load 10 s + warm-up 2 s; run: 1,000 BBC
# articles, 3 indexers, one seed; the T5 steps (random init, no load): estimates
STEP_COSTS = {"sampling": StepCost(70, 10), "scoring": StepCost(100, 10), "training": StepCost(15, 10, rounds=2),
              "search": StepCost(13, 10), "run": StepCost(240, 0), "sampling_t5": StepCost(35, 10),
              "scoring_t5": StepCost(75, 10)}


def floor_s(cost: StepCost) -> int:
    """The least time a step gets: its cold part, its timed seconds and the margin to print its figures."""
    return cost.cold_s + cost.timed_s * cost.rounds + DEADLINE_MARGIN_S


LIMITS = {name: floor_s(c) for name, c in STEP_COSTS.items()}


def _timed(name: str) -> list[str]:
    return ["--seconds", str(STEP_COSTS[name].timed_s)]

# `gdr run` on 1,000 BBC articles (see README, Benchmarks); the retrievers stop at 8 epochs (early stopping
# ended them at 12-14 on the H200, ~20 s each at batch 512)
RUN_1000 = ["+experiment=bbc", "data.n_docs=1000", "sample.n_queries=512", "doc_queries.per_doc=3",
            "indexers=[gc,hkmi,random]", "seeds=[0]", "cluster.enabled=false", "plot=false", "device=auto",
            "train.trainer.batch_size=auto", "train.trainer.max_epochs=8", "evaluate.batch_size=auto"]
SMOKE_RUN = ["+experiment=bbc", "data.n_docs=40", "model.max_doc_tokens=32", "sample.n_queries=16",
             "sample.max_new_tokens=8",
             "doc_queries.per_doc=1", "indexers=[gc,hkmi,random]", "seeds=[0]",
             "index.n_clusters=4", "index.leaf_size=4", "queries.fractions=[0.5,0.1,0.4]",
             "cluster.enabled=false", "plot=false", "device=cpu", "score.processes=1", "score.shard_size=8",
             "train.model.size=tiny", "train.trainer.max_epochs=2", "train.trainer.batch_size=16",
             "train.trainer.enable_progress_bar=false", "train.optim.warmup_steps=2", "evaluate.k=10",
             "evaluate.beam=10", "evaluate.device=cpu"]


@dataclass
class Step:
    """One subprocess of the chain.

    figures : flat output key -> dotted path in the step's last JSON line (``mini.examples_per_s``)
    run_config : the ``gdr run`` overrides when the step is a ``gdr run`` (validated by --dry-run; its
        figures are read from ``<out>/report.json``)
    """

    name: str
    argv: list[str]
    timeout: int
    figures: dict[str, str] = field(default_factory=dict)
    run_config: list[str] | None = None
    run_out: Path | None = None
    profile: bool = False  # the benchmark takes --profile PATH (a torch.profiler table into the logs)
    bounded: bool = False  # the benchmark takes --deadline (a Unix time: its limit less DEADLINE_MARGIN_S)


def _py() -> list[str]:
    return [sys.executable]


def _run_step(name: str, overrides: list[str], out: Path, timeout: int) -> Step:
    ov = [*overrides, f"out={out}"]
    return Step(name, [*_py(), "-m", "gdr.cli", "run", *ov], timeout, run_config=ov, run_out=out)


def plan(mode: str, work: Path, full: bool = False) -> list[Step]:
    """The chain for ``mode`` ("gpu" or "smoke"); ``work`` holds the run folders."""
    m = [*_py(), "-m"]
    if mode == "smoke":  # tiny sizes on the CPU: proves the chaining, the parsing and the GPU code paths, not
        # the speed; limits are generous (a shared 2-core machine runs a step 3-5x slower than an idle one)
        lm = str(work / "tiny-lm")  # a random-init 2-layer Llama (make_tiny_lm) instead of SmolLM2
        steps = [
            Step("sampling", [*m, "gdr.bench.sampling", "--models", lm, "--docs", "16", "--doc-tokens", "32",
                              "--max-new-tokens", "8", "--queries", "16", "--hf-queries", "8", "--device", "cpu"], 300),
            Step("scoring", [*m, "gdr.bench.scoring", "--model", lm, "--device", "cpu", "--queries", "8",
                             "--doc-tokens", "32", "--pairs", "32", "--naive-pairs", "4"], 300),
            # the CUDA optimizer configuration (fused AdamW, bf16-mixed, clipping), asked for on the CPU
            Step("training", [*m, "gdr.bench.training", "--presets", "tiny", "--batch", "8", "--steps", "2",
                              "--warmup", "1", "--device", "cpu", "--fused", "true", "--precision", "bf16-mixed"], 300),
            Step("search", [*m, "gdr.bench.decoding", "--model", "tiny", "--docs", "500", "--beam", "10",
                            "--queries", "4", "--batch", "4", "--no-reference", "--device", "cpu"], 300),
            _run_step("run", [*SMOKE_RUN, f"model.name={lm}"], work / "run-smoke", 900),
        ]
    else:
        steps = [
            # SmolLM2 (its first load converts the bundled GGUF on a cold cache: load_s) and HF generate side by
            # side; the warm-up batch captures the CUDA graphs (warmup_s)
            Step("sampling", [*m, "gdr.bench.sampling", "--models", "smollm2-135m", "--device", "cuda",
                              "--doc-tokens", "128", "--max-new-tokens", "32", "--queries", "4096",
                              "--hf-queries", "256", *_timed("sampling")], LIMITS["sampling"]),
            Step("scoring", [*m, "gdr.bench.scoring", "--device", "cuda", "--model", "smollm2-135m", "--queries",
                             "512", "--doc-tokens", "128", "--pairs", "65536", "--naive-pairs", "64",
                             "--doc-batch-size", "auto", "--max-query-tokens", "auto", *_timed("scoring")],
                 LIMITS["scoring"]),
            Step("training", [*m, "gdr.bench.training", "--presets", "mini,small30m", "--steps", "50",
                              "--warmup", "10", "--device", "cuda", *_timed("training")], LIMITS["training"]),
            Step("search", [*m, "gdr.bench.decoding", "--model", "small30m", "--docs", "100000", "--beam", "100",
                            "--queries", "4096", "--batch", "auto", "--no-reference", "--device", "cuda",
                            *_timed("search")], LIMITS["search"]),
            _run_step("run", RUN_1000, work / "run-bbc1000", LIMITS["run"]),
            Step("sampling_t5", [*m, "gdr.bench.sampling", "--models", "t5-base-random", "--device", "cuda",
                                 "--doc-tokens", "128", "--max-new-tokens", "32", "--queries", "4096",
                                 "--hf-queries", "256", *_timed("sampling_t5")], LIMITS["sampling_t5"]),
            Step("scoring_t5", [*m, "gdr.bench.scoring", "--device", "cuda", "--model", "t5-base-random",
                                "--queries", "512", "--doc-tokens", "128", "--query-tokens", "32", "--pairs", "32768",
                                "--naive-pairs", "16", "--doc-batch-size", "auto", "--max-query-tokens", "auto",
                                *_timed("scoring_t5")], LIMITS["scoring_t5"]),
        ]
        if full:
            steps += [_run_step("bbc", ["+experiment=bbc", "device=auto"], work / "bbc", 600),
                      _run_step("cranfield", ["+experiment=cranfield", "device=auto"], work / "cranfield", 600)]
    # the roofline of one unit of each benchmark (gdr.cost.roofline): FLOPs and bytes per query / pair /
    # example, the limit they imply on this device's peaks, the measured fraction of it, the limit on one H200
    roof = {k: k for k in ("flops_per_unit", "bytes_per_unit", "limit_per_s", "fraction_of_limit", "h200_limit_per_s")}
    samp = {"queries_per_s": "queries_per_s", "hf_queries_per_s": "hf_queries_per_s",
            "tokens_per_s": "tokens_per_s", "mfu": "mfu", "load_s": "load_s", "warmup_s": "warmup_s",
            "launches_per_query": "launches_per_query", **roof}
    score = {"pairs_per_s": "engine_pairs_per_s", "mfu": "mfu", "load_s": "load_s", "sample_s": "sample_s",
             "warmup_s": "warmup_s", "launches_per_pair": "launches_per_pair", "max_abs_diff": "max_abs_diff", **roof}
    figs = {
        "sampling": {f"sampling_{k}": v for k, v in samp.items()},
        "sampling_t5": {f"sampling_t5_{k}": v for k, v in samp.items()},
        "scoring": {f"scoring_{k}": v for k, v in score.items()},
        "scoring_t5": {f"scoring_t5_{k}": v for k, v in score.items()},
        "training": {f"training_{p}_{k}": f"{p}.{k}" for p in
                     (("tiny",) if mode == "smoke" else ("mini", "small30m"))
                     for k in ("examples_per_s", "tokens_per_s", "mfu", "warmup_s", "launches_per_example", "batch",
                               *roof)},
        "search": {"search_queries_per_s": "queries_per_s", "search_warmup_s": "warmup_s",
                   "search_launches_per_query": "launches_per_query", "search_mfu": "mfu", "search_batch": "batch",
                   **{f"search_{k}": v for k, v in roof.items()}},
    }
    for s in steps:
        s.figures = figs.get(s.name, {})
        s.profile = s.bounded = s.run_out is None
    return steps


def step_limit(step: Step, later: list[Step], left: float) -> int:
    """Seconds ``step`` may run with ``left`` seconds of the budget and the steps ``later`` still to come: its
    share of what is left, in proportion to the :data:`LIMITS`-style ``timeout`` of each, but never less than
    its own ``timeout`` (the cold-machine floor) nor more than ``left``. So time a step leaves unused goes to
    the steps after it, and ``--only`` of a few steps spreads the whole budget over them."""
    share = left * step.timeout / (step.timeout + sum(s.timeout for s in later))
    return int(min(left, max(step.timeout, share)))


def fitting(steps: list[Step], budget: float) -> tuple[list[Step], dict[str, str]]:
    """(the steps that run, {left-out step: why}): the steps in order while their floors (``timeout``) fit in
    ``budget`` together."""
    keep, left_out, used = [], {}, 0
    for s in steps:
        if used + s.timeout <= budget:
            keep.append(s)
            used += s.timeout
        else:
            left_out[s.name] = (f"left out: needs {s.timeout}s (its warm-up and timed seconds), the budget of "
                                f"{budget:.0f}s leaves {budget - used:.0f}s after the steps before it")
    return keep, left_out


def planned_limits(steps: list[Step], budget: float) -> dict[str, int]:
    """The limit of each step that runs (:func:`fitting`) when every step before it runs to its own limit (the
    worst case)."""
    keep, _ = fitting(steps, budget)
    limits, left = {}, float(budget)
    for i, s in enumerate(keep):
        limits[s.name] = step_limit(s, keep[i + 1:], left)
        left -= limits[s.name]
    return limits


def make_tiny_lm(folder: Path) -> Path:
    """A random-init 2-layer Llama with the bundled MiniLM tokenizer, saved as an HF folder (smoke runs)."""
    if (folder / "config.json").exists():
        return folder

    tok = AutoTokenizer.from_pretrained(resolve_model("minilm-l6"))
    tok.eos_token = tok.sep_token
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} [SEP] {% endfor %}"
                         "{% if add_generation_prompt %}[assistant] {% endif %}")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id)
    tmp = folder.with_name(folder.name + ".tmp")
    LlamaForCausalLM(cfg).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, folder)
    return folder


def last_json(text: str) -> dict | None:
    """The last line of ``text`` that parses as a JSON object; None when there is none."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def _dig(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


# figures that may be null in a good run: MFU (no known peak on a CPU), launches (no profile asked for),
# max_abs_diff (no naive pairs), the roofline limit and its fraction (a GPU without peak figures: the benchmark's
# JSON says why in limit_reason)
OPTIONAL = ("mfu", "launches_per_query", "launches_per_pair", "launches_per_example", "max_abs_diff", "limit_per_s",
            "fraction_of_limit")


def extract(step: Step, parsed: dict | None) -> tuple[dict[str, Any], list[str]]:
    """(flat figures, missing keys) of one step: figures it lacks are None."""
    figures, missing = {}, []
    for key, path in step.figures.items():
        v = _dig(parsed, path) if parsed is not None else None
        figures[key] = v
        if v is None and not key.endswith(OPTIONAL):  # e.g. MFU is null by design where the peak is unknown
            missing.append(path)
    return figures, missing


def run_stages(run_out: Path) -> tuple[dict[str, float], list[str]]:
    """Seconds per stage of a ``gdr run`` folder, finished or not, from each stage's ``stage.json``.

    The score stage is split into ``sample`` (the queries manifest's ``seconds_last_call``) and ``score`` (the
    P manifest's); ``score_stage`` is both with the model load. Names: ``doc_queries``, ``index_gc``,
    ``train_gc_s0``, ``eval_gc_s0``, ... A stage still running when the run stopped is listed in the second
    value, with the seconds it had run (from its ``stage.json``, written when it started).
    """
    stages: dict[str, float] = {}
    unfinished: list[str] = []
    markers = sorted(run_out.glob("*/stage.json"), key=lambda p: p.stat().st_mtime) if run_out.exists() else []
    for marker in markers:
        try:
            rec = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        name = str(rec.get("stage", marker.parent.name)).replace("-", "_")
        if name == "score":
            for part, manifest in (("sample", "queries.manifest.json"), ("score", "P.manifest.json")):
                try:
                    m = json.loads((marker.parent / manifest).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if m.get("status") == "complete" and m.get("seconds_last_call") is not None:
                    stages[part] = m["seconds_last_call"]
            name = "score_stage"
        if rec.get("status") == "complete":
            stages[name] = rec.get("seconds")
        else:
            unfinished.append(name)
            stages[name] = round(time.time() - marker.stat().st_mtime, 1)
    return stages, unfinished


def run_figures(step: Step) -> tuple[dict[str, Any], list[str]]:
    """Seconds (in all and per stage), Recall@1 and RR at the run's depth k (``_rr_at_<k>``, in %) per indexer and
    of BM25 from a ``gdr run``'s report.json; the stage seconds also when the run did not finish."""
    name = step.name
    stages, unfinished = run_stages(step.run_out)
    base = {f"{name}_stage_seconds": stages, f"{name}_unfinished_stages": unfinished}
    path = step.run_out / "report.json"
    if not path.exists():
        return {f"{name}_seconds": None, **base}, [f"{path} not written"]
    rep = json.loads(path.read_text())
    out: dict[str, Any] = {f"{name}_seconds": rep.get("seconds"), f"{name}_n_docs": rep.get("n_docs"), **base}
    k = int(rep.get("results_per_query") or 100)  # a report of an earlier gdr without it ranked 100
    for method, m in {**(rep.get("retrieval") or {}), "bm25": rep.get("bm25") or {}}.items():
        out[f"{name}_{method}_recall_at_1"] = m.get("recall@1")
        out[f"{name}_{method}_rr_at_{k}"] = m.get(f"mrr@{k}")
    out[f"{name}_stages"] = {s["name"]: s["seconds"] for s in rep.get("stages", [])}
    return out, []


def validate_run_config(overrides: list[str]) -> str | None:
    """None when ``gdr run <overrides>`` composes and passes validation; else the one-line problem."""
    try:
        cfg = load_config("run", overrides)
        validate("run", cfg)
    except Exception as e:  # noqa: BLE001 - reported, not raised: the dry run lists every problem
        try:
            return error_line(e, overrides) or f"{type(e).__name__}: {e}"
        except Exception:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
    return None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    if REPO is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def execute(step: Step, logs: Path, timeout: int | None = None) -> dict[str, Any]:
    """Run one step (at most ``timeout`` seconds, default the step's own; the chain passes :func:`step_limit`,
    which may be more than the step's own floor); returns its record: rc, seconds,
    figures, error, partial.

    A benchmark gets ``--deadline`` (its limit less :data:`DEADLINE_MARGIN_S`) and prints a JSON line as soon
    as it has a figure. A step still running at its limit is stopped with its whole process group (inductor's
    compile workers too), and its figures come from the last JSON line it printed (``partial``: true)."""
    log_path = logs / f"{step.name}.log"
    timeout = step.timeout if timeout is None else timeout  # the chain's step_limit: may exceed the floor
    argv = [*step.argv, *(["--profile", str(logs / f"{step.name}.profile.txt")] if step.profile else []),
            *(["--deadline", f"{time.time() + timeout - DEADLINE_MARGIN_S:.0f}"] if step.bounded else [])]
    if step.run_out is not None and step.run_out.exists():  # a benchmark times every stage: no cached stage reused
        shutil.rmtree(step.run_out)
    t0 = time.perf_counter()
    err = None
    with open(log_path, "w", encoding="utf-8") as f:
        f.write("$ " + shlex.join(argv) + "\n")
        f.flush()
        rc, text, timed_out = _run(argv, timeout)
        if timed_out:
            err = f"timed out after {timeout}s"
        f.write(text)
    seconds = round(time.perf_counter() - t0, 1)
    if rc != 0 and err is None:
        tail = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or ["(no output)"]
        err = f"exit {rc}: {tail[0][:300]}"
    partial = False
    if step.run_out is not None:
        figures, missing = run_figures(step)
        if rc != 0:  # the error says why; the stages it finished are in the figures
            missing = []
        device = None
    else:
        parsed = last_json(text)
        figures, missing = extract(step, parsed)
        device = parsed.get("device") if parsed else None
        partial = parsed is not None and (timed_out or bool(parsed.get("partial")))
        if parsed is None and err is None:
            err = "no JSON line in the output"
        elif timed_out and parsed is not None:
            got = sorted(k for k, v in figures.items() if v is not None)
            err += f"; from its last JSON line: {', '.join(got) if got else 'no figure yet'}"
    if missing and err is None:
        err = "missing " + ", ".join(missing)
    return {"rc": rc, "seconds": seconds, "ok": err is None, "error": err, "figures": figures, "device": device,
            "partial": partial}


def _run(argv: list[str], timeout: float) -> tuple[int, str, bool]:
    """(exit status, stdout and stderr, timed out) of ``argv`` run in a process group of its own, which is
    killed whole at ``timeout`` (the output it printed until then is kept)."""
    p = subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace", start_new_session=True)

    def kill_group() -> None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out, False
    except subprocess.TimeoutExpired:
        kill_group()
        try:
            out, _ = p.communicate(timeout=30)  # the rest of the output (nothing is lost by retrying)
        except subprocess.TimeoutExpired as e:  # a process outside the group still holds the pipe
            p.kill()
            out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
        return 124, out or "", True
    finally:  # also what outlived a step that ended (or Ctrl-C: the step has a session of its own)
        kill_group()


def _device_name() -> str | None:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gdr bench gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the commands and validate the run configs")
    ap.add_argument("--smoke", action="store_true", help="the whole chain at tiny sizes on the CPU (4-15 minutes)")
    ap.add_argument("--full", action="store_true", help="also gdr run +experiment=bbc and +experiment=cranfield")
    ap.add_argument("--out", default=None, help="where the summary and logs go (default $OUT, else runs/bench-gpu)")
    ap.add_argument("--work", default=None, help="where the run folders go (default: <tmp>/gdr-bench-gpu when $OUT "
                                                   "is used, else <out>/work)")
    ap.add_argument("--only", default=None, help="comma-separated step names to run (default all)")
    ap.add_argument("--budget", type=int, default=None,
                    help=f"seconds for the whole chain (default {BUDGET_S} on a GPU, {SMOKE_BUDGET_S} with --smoke)")
    args = ap.parse_args(argv)
    if args.budget is not None and args.budget < 1:  # gdr.rules' words; it is not imported here (OmegaConf)
        ap.error(f"argument --budget: {args.budget}: must be a positive integer")
    mode = "smoke" if args.smoke else "gpu"
    out = Path(args.out or os.environ.get("OUT") or (REPO or Path.cwd()) / "runs" / "bench-gpu")
    if args.work:
        work = Path(args.work)
    elif os.environ.get("OUT") and not args.out:  # $OUT returns at most 8 files: runs live elsewhere
        work = Path(tempfile.gettempdir()) / "gdr-bench-gpu"
    else:
        work = out / "work"
    steps = plan(mode, work.resolve(), full=args.full)
    if args.only:
        names = [k for k in args.only.split(",") if k]
        unknown = [k for k in names if k not in {s.name for s in steps}]
        if unknown:
            print(f"gdr bench gpu: --only {','.join(unknown)}: no such step; the steps are "
                  f"{', '.join(s.name for s in steps)}")
            return 2
        steps = [s for s in steps if s.name in names]
    budget = args.budget or (SMOKE_BUDGET_S if mode == "smoke" else BUDGET_S)

    if mode == "smoke" and any("tiny-lm" in " ".join(st.argv) for st in steps):  # the steps that load it
        work.mkdir(parents=True, exist_ok=True)
        make_tiny_lm(work.resolve() / "tiny-lm")
    keep, left_out = fitting(steps, budget)
    if args.dry_run:
        return _dry_run(steps, keep, left_out, mode, budget)
    if mode == "gpu":
        try:
            device = _device_name()
        except ImportError as e:
            print(f"gdr bench gpu: needs torch with CUDA ({e}); `--dry-run` prints the commands")
            return 2
        if device is None:
            print("gdr bench gpu: needs a CUDA GPU (torch.cuda.is_available() is False here); "
                  "`make bench-gpu-dry` prints the commands, `--smoke` runs them at tiny sizes on the CPU")
            return 2
    else:
        device = "cpu"
    return _chain(keep, left_out, out, {"device": device, "mode": mode, "budget": budget})


def _dry_run(steps: list[Step], keep: list[Step], left_out: dict[str, str], mode: str, budget: int) -> int:
    """Print every step's command and floor (or why it is left out), validate the ``gdr run`` configs, and print
    the plan as one JSON line; 1 when a config is invalid."""
    problems: dict[str, str | None] = {}
    for s in steps:
        print(f"[{s.name}] timeout {s.timeout}s: {shlex.join(s.argv)}")
        if s.name in left_out:
            print(f"[{s.name}] {left_out[s.name]}")
        if s.run_config is not None:
            problems[s.name] = validate_run_config(s.run_config)
            print(f"[{s.name}] config: {problems[s.name] or 'ok'}")
    bad = {k: v for k, v in problems.items() if v}
    print(json.dumps({"dry_run": True, "mode": mode, "commands": {s.name: shlex.join(s.argv) for s in steps},
                      "timeouts": {s.name: s.timeout for s in steps}, "budget": budget,
                      "limits_at_budget": planned_limits(keep, budget), "left_out": left_out,
                      "configs_valid": {k: v is None for k, v in problems.items()}, "errors": bad}))
    return 1 if bad else 0


def _chain(steps: list[Step], left_out: dict[str, str], out: Path, result: dict[str, Any]) -> int:
    """Run ``steps`` within ``result["budget"]``, saving the summary after each; 0 when every step succeeded."""
    budget = result["budget"]
    for name, why in left_out.items():
        print(f"[{name}] {why}", file=sys.stderr, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="gdr-bench-logs-"))
    t0 = time.perf_counter()
    result["left_out"] = dict(left_out)
    records: dict[str, dict] = {}
    skipped: list[str] = []
    for i, s in enumerate(steps):
        left = int(budget - (time.perf_counter() - t0))
        if left < max(MIN_STEP_S, s.timeout):
            skipped.append(s.name)
            print(f"[{s.name}] skipped: {left}s of the chain's {budget}s left, its floor is {s.timeout}s",
                  file=sys.stderr, flush=True)
            continue
        limit = step_limit(s, steps[i + 1:], left)
        print(f"[{s.name}] ({limit}s) {shlex.join(s.argv)}", file=sys.stderr, flush=True)
        rec = execute(s, logs, timeout=limit)
        records[s.name] = rec
        result.update(rec.pop("figures"))
        print(f"[{s.name}] {'ok' if rec['ok'] else 'FAILED: ' + str(rec['error'])} ({rec['seconds']}s)",
              file=sys.stderr, flush=True)
        _save(result, records, skipped, steps, logs, out, t0)  # after every step: a cut chain keeps it
    line = _save(result, records, skipped, steps, logs, out, t0)
    print(line)
    return 0 if not result["errors"] and not skipped else 1


def _save(result: dict, records: dict, skipped: list[str], steps: list[Step], logs: Path, out: Path,
          t0: float) -> str:
    """Write bench-gpu.json and bench-gpu-logs.tar.gz as they stand; returns the JSON line."""
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["devices_reported"] = {k: r["device"] for k, r in records.items() if r.get("device")}
    result["steps"] = {k: {"rc": r["rc"], "seconds": r["seconds"], "ok": r["ok"], "partial": r["partial"]}
                       for k, r in records.items()}
    result["skipped"] = list(skipped)
    result["errors"] = {k: r["error"] for k, r in records.items() if r["error"]}
    # the logs, the profiles and each run's report and stage records travel in one archive (the device machine
    # returns at most 8 files)
    tmp_tar = out / ".bench-gpu-logs.tar.gz.tmp"
    with tarfile.open(tmp_tar, "w:gz") as tar:
        tar.add(logs, arcname="logs")
        for s in steps:
            if s.run_out is None or not s.run_out.exists():
                continue
            for name in ("report.md", "report.json"):
                if (s.run_out / name).exists():
                    tar.add(s.run_out / name, arcname=f"{s.name}/{name}")
            for marker in s.run_out.glob("*/stage.json"):
                tar.add(marker, arcname=f"{s.name}/{marker.parent.name}/stage.json")
    os.replace(tmp_tar, out / "bench-gpu-logs.tar.gz")
    line = json.dumps(result)
    tmp = out / ".bench-gpu.json.tmp"
    tmp.write_text(line + "\n", encoding="utf-8")
    os.replace(tmp, out / "bench-gpu.json")
    return line


if __name__ == "__main__":
    raise SystemExit(main())
