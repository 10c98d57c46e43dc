"""``gdr plan``: each stage's predicted seconds and peak memory of a ``gdr run`` configuration, before anything loads;
``gdr plan --check RUN_DIR``: a finished run's measured seconds beside that plan.

On a GPU a stage's seconds are its units of work (queries sampled, pairs scored, training examples, search queries)
over the rate the device allows (the roofline of :mod:`gdr.cost`: ``min(peak FLOP/s / FLOPs per unit, peak
bytes/s / bytes per unit)`` for models built on the meta device) times the fraction of that limit the same step
reached in the committed GPU runs (``reports/gpu-runs/*.json``: the highest fraction any of them reached on that
device kind, the file named), plus the cold part those runs measured (model load, compilation warm-up; sampling is
compiled, and pays the warm-up, only from ``sample.compile_min_queries`` queries, as the run decides). Then each
stage is multiplied by the measured / predicted ratio of the device's newest finished run
(``reports/gpu-runs/*-factors.json``, written by ``gdr plan --check RUN_DIR --write-factors``). A device kind
without figures of its own takes the H200's fractions and says so. Installed from a wheel, gdr reads its copy of
``reports/gpu-runs/``; ``$GDR_GPU_RUNS`` names another folder (:func:`gdr.paths.shipped_dir`).

On the CPU the plan first times this machine (:mod:`gdr.calibrate`: a few batches of each step at the run's shapes
and thread counts, cached per machine); without a calibration (``calibrate="off"``, or ``"cache"`` with none
cached, as the run's report uses) it falls back to :data:`CPU_FRACTIONS` of :data:`CPU_PEAKS`, and says so.

Host stages (flat clustering and its k-means baselines, every docid scheme's indexing, BM25) are per-unit seconds of
the BBC run's machine (:data:`HOST_S`); the report rewritten after each retriever is ``tests/bench_report.py``'s
rewrite after as many retrievers (:data:`REPORT_REWRITE_S`), and the rest outside stages the 2026-11-27 run's
remainder (:data:`OUTSIDE_1127`). With ``qg.enabled`` the run first fine-tunes its query generator (``qg``: 6 x
parameters x tokens at an assumed fraction of the limit, :data:`QG_FRACTION`), loads it from that folder, and with
``qg.compare_two_shot`` samples, scores and clusters a second P with the base model (the ``(two-shot)`` rows). The
stages' sum is the run's seconds one after another; with ``overlap`` on (``auto``: on a GPU) the host stages run in a
background thread beside the device stages, and :func:`plan_wall` simulates that thread for the run's wall clock
(``wall``). Training is planned as the run
trains: batch and ``train.concurrent`` ``auto`` resolved for the memory free at training (``free``), each example
at the padded width measured with and without length buckets (:data:`BUCKETED_WIDTH`), from the earliest stop
early stopping allows (``low``) through a central stop (``seconds``) to the epoch cap (``high``). Every figure
says what it rests on (``basis``), and an assumption says it is one.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import os
import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from gdr import cost
from gdr.calibrate import calibrate_cpu, calibration_path
from gdr.config import load_config
from gdr.data import corpus_from_config, resolve_corpus
from gdr.data.core import iter_lines
from gdr.data.titles import TITLE_FRACTIONS
from gdr.formats import STAGE_FILE, read_stage_record
from gdr.lm.compiling import want_compile
from gdr.lm.sampling import CPU_BATCH as CPU_SAMPLE_BATCH
from gdr.lm.scoring import CPU_MAX_QUERY_TOKENS
from gdr.models import BUNDLED
from gdr.paths import shipped_dir
from gdr.stages.command_keys import RunKeys, RunQG
from gdr.stages.index import index_stage_name, index_stages
from gdr.stages.overlap import Priority, overlap_on
from gdr.stages.plan_file import DEVICES, RUN_GROUPS, TWO_SHOT, plan_identity, planned_names, run_device, write_plan
from gdr.stages.plan_file import stage_seconds as _stage_seconds
from gdr.stages.settings import (
    ClusterSettings,
    IndexSettings,
    SampleSettings,
    ScoreSettings,
    TrainSettings,
    section_from,
)
from gdr.stages.train import model_config_from, retriever_folds, retriever_name, training_threads
from gdr.training.data import dev_sizes
from gdr.training.model import meta_retriever
from gdr.training.options import ExampleOptions, TrainerOptions
from gdr.training.stopping import effective_min_steps, patience_checks, steps_per_check
from gdr.training.train import CPU_BATCH, concurrent_for_memory, cuda_batch_size

log = logging.getLogger(__name__)

__all__ = ["StagePlan", "HostTask", "WallPlan", "Remaining", "plan_run", "plan_wall", "simulate_overlap", "remaining",
           "finished_stages", "format_remaining", "predict",
           "predict_stages", "run_device", "measured_figures", "format_plan", "DEVICES", "MAX_GPUS", "gpus_problem",
           "sized_config", "write_run_plan"]

GPU_RUNS = shipped_dir("gpu-runs")  # the committed GPU figures: reports/gpu-runs/, or the wheel's copy
MAX_GPUS = 16  # gdr run trains and scores on the GPUs of one machine (no multi-node), and none holds more


def gpus_problem(device: str, gpus: str) -> str | None:
    """What is wrong with ``gpus=<gpus>`` (the raw value) for ``device``, or None: a whole number from 1 to
    :data:`MAX_GPUS`, and 1 on a CPU."""
    if not gpus.isdigit() or not 1 <= int(gpus) <= MAX_GPUS:
        return f"gpus={gpus!r}: a whole number of GPUs, 1 to {MAX_GPUS} (those of one machine, where gdr run runs)"
    if device == "cpu" and int(gpus) != 1:
        return f"gpus={gpus}: device=cpu has no GPUs; plan for device=h200 | h100 | a100 with gpus=N, or drop gpus="
    return None

# Corpus and query-split sizes of the known data sets, for a config with data.n_docs null (the whole corpus)
CORPUS_DOCS = {"bbc": 2225, "cranfield": 1400, "nq320k": 109_739, "msmarco-lite": 138_457, "reuters": 10_788}
TEST_QUERIES = {"cranfield": 225, "nq320k": 7830, "msmarco-lite": 2792}
ASSUMED_TEST_QUERIES = 1000  # a collection of neither the table nor query files gdr plan can count
TRAIN_QUERIES = {"nq320k": 307_373, "msmarco-lite": 0, "cranfield": 0}
# The LMs' architectures (their config.json), so that no model file is needed to plan
LM_CONFIGS = {
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                   tie_word_embeddings=True)),
    "doc2query/all-with_prefix-t5-base-v1": ("t5", dict(d_model=768, d_ff=3072, d_kv=64, num_layers=12,
                                                        num_decoder_layers=12, num_heads=12, vocab_size=32128)),
}
PROMPT_TOKENS = 32  # the prompt template's tokens around a document (chat template and instruction)
# The measured constants, as data: reports/plan-constants.json (each with the file it was measured in or read
# from; the wheel's copy when installed, $GDR_PLAN_CONSTANTS to name another folder)
CONSTANTS_FILE = shipped_dir("plan-constants") / "plan-constants.json"
_C = {k: v["value"] for k, v in json.loads(CONSTANTS_FILE.read_text(encoding="utf-8"))["constants"].items()}
# A 2-core CPU's limit and the fraction of it each step reaches, without a calibration of this CPU
CPU_PEAKS = cost.DevicePeaks("cpu", float(_C["CPU_PEAKS"]["flops"]), float(_C["CPU_PEAKS"]["bytes_per_s"]))
CPU_FRACTIONS: dict[str, float] = _C["CPU_FRACTIONS"]
CPU_COLD_S: dict[str, float] = _C["CPU_COLD_S"]
# Input positions per training example under trainer.length_buckets, as a share of max_query_len, by batch size
BUCKETED_WIDTH = {int(b): w / _C["BUCKETED_WIDTH"]["max_query_len"]
                  for b, w in _C["BUCKETED_WIDTH"]["positions_by_batch"].items()}
# Test queries the titles loader keeps, as a share of fractions[2] x documents
TITLES_TEST_KEPT = {name: k["kept"] / (k["test_fraction"] * k["documents"])
                    for name, k in _C["TITLES_TEST_KEPT"].items()}
# Host stages' seconds per unit (clustering, indexing, BM25) on the BBC run's machine
HOST_S = {name: h["seconds"] / h["units"] for name, h in _C["HOST_S"].items()}
# BMI's index seconds by index.bmi.inputs, over those of its generated queries alone (what index_bmi_doc measured)
BMI_INPUTS_COST: dict[str, float] = _C["BMI_INPUTS_COST"]
# One report rewrite after n retrievers (tests/bench_report.py --retrievers, the development CPU): n -> best seconds
REPORT_REWRITE_S = {int(n): float(v) for n, v in _C["REPORT_REWRITE_S"]["best_s_by_retrievers"].items()}
# The 2026-11-27 run's seconds outside stages: all, its report rewrites (from run.log), the rest ("other")
OUTSIDE_1127: dict[str, float] = _C["OUTSIDE_1127"]
QG_FRACTION = float(_C["QG_FRACTION"])  # the qg stage's fraction of a GPU's limit: assumed (no GPU figure)
SPAWN_S = float(_C["SPAWN_S"])  # a worker process that trains retrievers (train.concurrent > 1): assumed
LM_LOAD_S = float(_C["LM_LOAD_S"])  # the fast GGUF conversion's cold start


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


@dataclass
class StagePlan:
    """One stage: predicted ``seconds``, ``peak_bytes`` of device memory (None: host work) and its ``basis``;
    ``low``: the seconds if every early stop comes at its earliest (None: ``seconds``)."""

    name: str
    seconds: float
    peak_bytes: float | None
    basis: str
    low: float | None = None
    high: float | None = None
    parts: dict[str, float] | None = None  # seconds of each part a run times as a stage of its own (indexing), or
    # accounts apart (reports: report_rewrites, other)
    steps: tuple[int, int] | None = None  # training: (steps at low, steps at seconds) of each retriever
    at_once: int | None = None  # training: the retrievers trained at once

    def at_steps(self, n: float) -> float:
        """Training: the seconds if each retriever took ``n`` steps (linear between ``low`` and ``seconds``)."""
        lo, mid = self.steps
        return self.seconds + (n - mid) * (self.seconds - self.seconds_low) / max(mid - lo, 1)

    @property
    def seconds_low(self) -> float:
        return self.seconds if self.low is None else self.low

    @property
    def seconds_high(self) -> float:
        return self.seconds if self.high is None else self.high

    def scale(self, factor: float) -> None:
        """Every figure of the stage times ``factor``."""
        self.seconds *= factor
        self.low = None if self.low is None else self.low * factor
        self.high = None if self.high is None else self.high * factor
        self.parts = None if self.parts is None else {k: v * factor for k, v in self.parts.items()}


def measured_figures(device: str, folder: Path = GPU_RUNS) -> dict[str, tuple[float, str]]:
    """Flat figure -> (value, file) from the committed GPU runs of ``device`` (``h200``, ``h100``, ...): for a
    fraction of the limit the highest any file reached, for a cold part (``*_load_s``, ``*_warmup_s``) the longest.
    A single benchmark's JSON (``...-scoring.json``) gives its keys with the benchmark's name in front."""
    best: dict[str, tuple[float, str]] = {}
    want = DEVICES[device].lower()
    for path in sorted(folder.glob("*.json")):
        line = path.read_text(encoding="utf-8").strip().splitlines()[-1]
        rec = json.loads(line)
        if want not in str(rec.get("device", "")).lower():
            continue
        flat = _flatten(rec, _bench_prefix(path.stem))
        for key, v in flat.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and (
                    key not in best or v > best[key][0]):
                best[key] = (float(v), path.name)
    return best


def _bench_prefix(stem: str) -> str:
    for bench, prefix in (("scoring", "scoring_"), ("search", "search_"), ("training", "training_"),
                          ("sampling", "sampling_")):
        if stem.endswith("-" + bench):
            return prefix
    return ""


def _flatten(rec: dict, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if isinstance(v, dict) and k not in ("steps", "errors", "devices_reported"):
            out.update({f"{prefix}{k}_{kk}": vv for kk, vv in v.items()})
        else:
            out[prefix + ("pairs_per_s" if k == "engine_pairs_per_s" else k)] = v
    return out


def _training_points(device: str, folder: Path) -> list[tuple[int, float, str]]:
    """(batch, fraction of the limit or MFU, file) of small30m's training in each committed run on ``device``."""
    out = []
    for path in sorted(folder.glob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8").strip().splitlines()[-1])
        if DEVICES[device].lower() not in str(rec.get("device", "")).lower():
            continue
        flat = _flatten(rec, _bench_prefix(path.stem))
        batch = flat.get("training_small30m_batch") or flat.get("training_batch")
        frac = flat.get("training_small30m_fraction_of_limit") or flat.get("training_small30m_mfu")
        if batch and frac:
            out.append((int(batch), float(frac), path.name))
    return out


def stage_factors(device: str, folder: Path = GPU_RUNS) -> tuple[dict[str, float], str]:
    """(plan stage -> measured / predicted seconds, the file) of the newest ``*-factors.json`` in ``folder`` for
    ``device`` (what ``gdr plan --check RUN_DIR --write-factors`` wrote from a finished run); ({}, "") if none."""
    want = DEVICES[device].lower()
    for path in sorted(folder.glob("*-factors.json"), reverse=True):
        rec = json.loads(path.read_text(encoding="utf-8"))
        if want in str(rec.get("device", "")).lower():
            return {k: float(v) for k, v in rec["factors"].items()}, path.name
    return {}, ""


class _Rates:
    """The device's peaks and, per step, the fraction of the limit and the cold seconds to plan with; the
    per-stage factors a finished run on the device measured (:func:`stage_factors`)."""

    def __init__(self, device: str, folder: Path = GPU_RUNS, cfg=None, factors: bool = True):
        self.device = device
        self.cal: dict[str, float] = {}  # this CPU's calibration (gdr.calibrate), when there is one
        self.cal_note = ""
        self.beam = 1  # the beam the calibration searched at
        self.factors, self.factor_file = stage_factors(device, folder) if factors else ({}, "")
        if device == "cpu":
            self.peaks, self.figures, self.note, self.points = CPU_PEAKS, {}, "", []
            return
        self.peaks = cost.device_peaks(DEVICES[device])
        kind, self.note = device, ""
        if not any(k.endswith("fraction_of_limit") for k in measured_figures(device, folder)):
            kind, self.note = "h200", f" (H200 figures: none for {device})"
        self.figures = measured_figures(kind, folder)
        self.points = _training_points(kind, folder)

    def apply_factor(self, st: StagePlan) -> None:
        """``st`` times the measured / predicted ratio of its stage in the device's newest finished run (a
        two-shot row without a ratio of its own: its first pass's, the same work)."""
        f = self.factors.get(st.name, self.factors.get(st.name.removesuffix(TWO_SHOT)))
        if f is not None:
            st.scale(f)
            st.basis += f"; x {f:.2f}: measured / predicted in {self.factor_file}"

    def host_note(self) -> str:
        return ("reports/gpu-runs/2026-11-27-bbc-compare, the H200 machine's CPU" if self.device != "cpu" else
                "reports/gpu-runs/2026-11-27-bbc-compare, the H200 machine's CPU: assumed to hold here, not measured")

    def cpu_note(self) -> str:
        return self.cal_note or "CPU default"

    def per_unit(self, key: str) -> float | None:
        """Seconds per unit this CPU's calibration measured for ``key`` (None without a calibration)."""
        return self.cal.get(key)

    def fraction(self, step: str, key: str | None = None) -> tuple[float, str]:
        if self.device == "cpu":
            return CPU_FRACTIONS[step], "CPU default"
        value, file = self.figures[key or f"{step}_fraction_of_limit"]
        return value, file + self.note

    def training_fraction(self, batch: int) -> tuple[float, str]:
        """small30m's fraction of the limit at ``batch``: interpolated in log2(batch) between the committed runs'
        batches (MFU where a run predates the roofline: training is compute-bound, so the two are equal)."""
        if self.device == "cpu":
            return CPU_FRACTIONS["training"], "CPU default"
        pts = sorted(self.points)
        if not pts:
            return self.fraction("training", "training_small30m_fraction_of_limit")
        lo = max([p for p in pts if p[0] <= batch], default=pts[0])
        hi = min([p for p in pts if p[0] >= batch], default=pts[-1])
        if lo[0] == hi[0]:
            return lo[1], lo[2]
        w = (math.log2(batch) - math.log2(lo[0])) / (math.log2(hi[0]) - math.log2(lo[0]))
        return lo[1] + w * (hi[1] - lo[1]), f"between batch {lo[0]} ({lo[2]}) and {hi[0]} ({hi[2]})"

    def cold(self, step: str, *keys: str) -> float:
        if self.device == "cpu":
            return CPU_COLD_S[step]
        return sum(self.figures.get(k, (0.0, ""))[0] for k in keys)

    def limit(self, flops: float, nbytes: float) -> float:
        return min(self.peaks.flops / flops, self.peaks.bytes_per_s / nbytes)


def _meta_lm(name: str):
    """The LM ``name`` built on the meta device from its architecture (:data:`LM_CONFIGS`, else its local
    config.json): no weights."""
    if name in LM_CONFIGS:
        kind, kw = LM_CONFIGS[name]
        config = AutoConfig.for_model(kind, **kw)
    elif (Path(name) / "config.json").exists():
        config = AutoConfig.from_pretrained(name)
    else:
        raise ValueError(f"model.name={name!r}: gdr plan knows {sorted(LM_CONFIGS)} or a local model folder")
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(config)


def _query_stats(prompt: int, new: int) -> dict[str, float]:
    """Decoder statistics (:func:`gdr.cost.sampling_flops`) of one sampled query of ``new`` tokens."""
    return {"prefill_tokens": prompt, "decode_tokens": new, "prefill_context": prompt * (prompt + 1) / 2,
            "decode_context": new * prompt + new * (new + 1) / 2}


def _sampling(name: str, lm, n_queries: int, new_tokens: int, doc_tokens: int, rates: _Rates, compiled: bool,
              batch: int = 1024) -> StagePlan:
    """Sampling ``n_queries`` queries (one process: sampling does not spread over GPUs); ``compiled``: whether the
    run compiles the decode step for them (:func:`gdr.lm.compiling.want_compile`): only then the compiled rate
    and its warm-up apply."""
    prompt = doc_tokens + PROMPT_TOKENS
    stats = _query_stats(prompt, new_tokens)
    flops = cost.sampling_flops(lm, stats)
    nbytes = cost.sampling_bytes(lm, stats, decode_steps=new_tokens / batch, prefill_passes=1 / batch,
                                 element_size=2)
    mode = "compiled" if compiled else "eager"
    peak = cost.weight_bytes(lm, 2) + batch * (prompt + new_tokens) * cost.kv_bytes_per_position(lm.config, 2)
    key = "doc_queries_s_per_query" if name == "doc_queries" else "sampling_s_per_query"
    if rates.per_unit(key):
        per = rates.per_unit(key)
        return StagePlan(name, n_queries * per, peak,
                         f"{n_queries:,} queries at {_rate(1 / per)}/s ({rates.cpu_note()})")
    if compiled or rates.device == "cpu":
        frac, src = rates.fraction("sampling")
    elif "sampling_eager_fraction_of_limit" in rates.figures:
        frac, src = rates.fraction("sampling", "sampling_eager_fraction_of_limit")
    else:
        frac, src = rates.fraction("sampling")
        src += "; assumed: the eager loop as fast as the compiled one (no eager figure)"
    rate = frac * rates.limit(flops, nbytes)
    warm = rates.cold("sampling", "sampling_warmup_s") if compiled or rates.device == "cpu" else 0.0
    return StagePlan(name, warm + n_queries / rate, peak,
                     f"{n_queries:,} queries, {mode}, at {_rate(rate)}/s ({frac:.1%} of the limit, {src}) "
                     f"+ warm-up {warm:.0f} s")


def _scoring(lm, n_docs: int, n_queries: int, query_tokens: int, doc_tokens: int, rates: _Rates,
             gpus: int, processes: int = ScoreSettings.processes) -> StagePlan:
    """Scoring every (document, query) pair, the documents spread over the GPUs (or ``score.processes`` CPU
    processes, each at the single process's calibrated rate)."""
    prompt = doc_tokens + PROMPT_TOKENS
    free = rates.peaks.memory or 16e9
    chunk = 4096
    per_doc, tile = cost.score_memory(cost.dims(lm.config), prompt, chunk)
    batch = cost.batch_for_memory(free, per_doc, share=0.5, fixed=tile, cap=64)
    flops = cost.scoring_flops_per_pair(lm, prompt, query_tokens, n_queries)
    nbytes = cost.scoring_bytes_per_pair(lm, prompt, query_tokens, n_queries, batch, chunk, 2)
    frac, src = rates.fraction("scoring")
    rate = frac * rates.limit(flops, nbytes)
    warm = rates.cold("scoring", "scoring_warmup_s")
    pairs = n_docs * n_queries
    ways = gpus if rates.device != "cpu" else max(1, processes)
    peak = cost.weight_bytes(lm, 2) + batch * per_doc + tile
    if rates.per_unit("scoring_s_per_pair"):
        per, spawn = rates.per_unit("scoring_s_per_pair"), (rates.per_unit("lm_load_s") if ways > 1 else 0.0)
        return StagePlan("scoring", spawn + pairs / ways * per, peak,
                         f"{pairs:,} pairs at {_rate(1 / per)}/s a process x {ways} ({rates.cpu_note()}; assumed: "
                         f"the processes share no core)" + (f" + {spawn:.1f} s: each worker loads the LM, assumed "
                                                            f"as long as one load" if ways > 1 else ""))
    return StagePlan("scoring", warm + pairs / ways / rate, peak,
                     f"{pairs:,} pairs at {_rate(rate)}/s ({frac:.1%} of the limit, {src})"
                     + (f" x {ways} processes" if ways > 1 else "") + f" + warm-up {warm:.0f} s")


def _train_and_search(cfg, n_docs: int, n_train: int, n_test: int, rates: _Rates, gpus: int,
                      free: float | None) -> list[StagePlan]:
    """Training of every (indexer, seed) retriever (spread over the GPUs) and their search of the test split (one
    process)."""
    t = _train_settings(cfg)
    model = _retriever(cfg, t, n_docs)
    rc = model.config  # with the encoder's HF config filled in
    n_ret = len(cfg.indexers) * len(cfg.seeds) * _n_folds(cfg)
    per_epoch, dev = _examples(t.examples, n_docs, n_train, int(cfg.doc_queries.per_doc), _dev_split_size(cfg))
    train = _training(t, model, n_ret, per_epoch, rates, gpus, free, dev)
    beam = int(cfg.evaluate.beam)
    if rates.per_unit("search_s_per_query"):
        per, setup = rates.per_unit("search_s_per_query"), rates.per_unit("retriever_setup_s")
        return [train, StagePlan("evaluation", n_ret * (setup + n_test * per), None,
                                 f"{n_ret} x ({setup:.1f} s set-up + {n_test:,} test queries at beam {beam}: "
                                 f"{_rate(1 / per)}/s) ({rates.cpu_note()})")]
    sbatch = 32 if rates.device == "cpu" else 1024
    flops = cost.search_flops_per_query(model, rc.max_query_len, beam)
    nbytes = cost.search_bytes_per_query(model, rc.max_query_len, beam, sbatch, 2)
    frac, src = rates.fraction("search")
    rate = frac * rates.limit(flops, nbytes)
    load, warm = rates.cold("search", "search_load_s"), rates.cold("search", "search_warmup_s")
    queries = n_ret * n_test
    mem = sbatch * cost.search_memory_per_query(cost.dims(rc.encoder_hf_config), cost.dims(rc), rc.max_query_len,
                                                rc.max_code_len, rc.n_digits, beam)
    search = StagePlan("evaluation", load + n_ret * warm + queries / rate, mem,
                       f"{n_ret} x {n_test:,} test queries at beam {beam}: {_rate(rate)}/s ({frac:.1%} of the limit, "
                       f"{src}) + load {load:.1f} s + warm-up {warm:.1f} s per retriever")
    return [train, search]


def _typed(cls, section):
    """The settings class ``cls`` from a section of the run's config (checked at ``gdr run``'s door): its values
    read as attributes, a key the section lacks at the field's default."""
    return cls.from_config(OmegaConf.to_container(section, resolve=True))


def _train_settings(cfg) -> TrainSettings:
    """The run's retriever settings (its ``train:`` section)."""
    return _typed(TrainSettings, cfg.train)


def _examples(ex: ExampleOptions, n_docs: int, n_train: int, per_doc: int,
              dev_given: int | None = None) -> tuple[int, int]:
    """(training examples an epoch, dev queries) of one retriever: ``n_train`` real queries (one relevant document
    each), ``per_doc`` generated ones per document and the document windows, less what the dev split holds out
    (:func:`gdr.training.data.dev_sizes`); ``dev_given``: the dev split is the query set's own of that many queries
    (``queries.dev_split``): no training query is held out, generated ones only fill it up to ``dev_min``. A run
    without queries validates on held-out windows (not modelled: all windows are counted as training examples)."""
    n_real = n_train if ex.use_real else 0
    n_gen = n_docs * per_doc if ex.use_generated else 0
    if ex.generated_per_doc is not None:
        n_gen = n_docs * min(per_doc, ex.generated_per_doc)
    if dev_given is None:
        dev_real, dev_gen = dev_sizes(n_real, n_gen, n_docs if n_gen else 0, ex.dev_fraction, ex.dev_max,
                                      ex.dev_min, ex.dev_max_share)
    else:
        dev_real, dev_gen = 0, dev_sizes(0, n_gen, n_docs if n_gen else 0, 0.0, ex.dev_max,
                                         max(ex.dev_min - dev_given, 0), ex.dev_max_share)[1]
    windows = n_docs * (ex.doc_first + ex.doc_windows)
    return n_real - dev_real + n_gen - dev_gen + windows, (dev_given or 0) + dev_real + dev_gen


def _retriever(cfg, t: TrainSettings, n_docs: int):
    """The run's retriever (``t``) on the meta device, its docids sized for ``n_docs`` documents
    (``index.n_clusters`` digits, the depth a tree of ``index.leaf_size`` leaves needs)."""
    K = int(cfg.index.n_clusters)
    depth = 1 + max(1, math.ceil(math.log(max(n_docs / max(int(cfg.index.leaf_size), 1), 1.0)) / math.log(K)))
    return meta_retriever(model_config_from({**asdict(t.model), "n_digits": K, "max_code_len": depth},
                                            t.model_presets))


def _padded_width(max_query_len: int, batch: int, buckets: bool) -> float:
    """Input positions (real tokens plus pad) per training example: ``max_query_len`` without length buckets; with
    them the measured share (:data:`BUCKETED_WIDTH`), interpolated in log2(batch) between the measured batches."""
    if not buckets:
        return float(max_query_len)
    pts = sorted(BUCKETED_WIDTH.items())
    share = float(np.interp(math.log2(batch), [math.log2(b) for b, _ in pts], [w for _, w in pts]))
    return share * max_query_len


def _training(t: TrainSettings, model, n_ret: int, per_epoch: int, rates: _Rates, gpus: int, free: float | None,
              dev: int) -> StagePlan:
    """Training ``n_ret`` retrievers of ``per_epoch`` examples an epoch: batch and ``train.concurrent`` as the run
    resolves them for ``free`` bytes of device memory at training time (None: the device's memory), each example
    at its padded width (:func:`_padded_width`); ``seconds`` at the central stop (the dev score best at the floor,
    then the patience), ``low`` at the earliest stop, ``high`` at the epoch cap."""
    rc = model.config
    memory = free if free is not None else (rates.peaks.memory or 16e9)
    passes = t.optim.forward_passes  # R-drop: two forward passes, both held until the backward
    batch = _train_batch(t.trainer.batch_size, rc, rates, per_epoch, memory, passes)
    params = sum(p.numel() for p in model.parameters())
    buckets = t.trainer.length_buckets
    width = _padded_width(rc.max_query_len, batch, buckets)
    flops = passes * cost.train_flops_per_example(model, width)
    nbytes = cost.training_bytes_per_example(params, cost.param_count(model), batch, rates.device != "cpu")
    frac, src = rates.training_fraction(batch)
    concurrent = _concurrent(t.concurrent, rc, batch, rates, n_ret, gpus, memory, passes)
    agg = min(concurrent * frac, 1.0)
    limit = rates.limit(flops, nbytes)
    rate = agg * limit
    steps, low_steps, stop, mid_steps = _train_steps(t.trainer, per_epoch, batch)
    warm = rates.cold("training", "training_small30m_warmup_s") * math.ceil(n_ret / concurrent)
    spawns = concurrent * SPAWN_S if concurrent > 1 else 0.0
    mem = concurrent * (batch * cost.train_memory_per_example(
        cost.dims(rc.encoder_hf_config), cost.dims(rc), rc.max_query_len, rc.max_code_len, rc.n_digits, passes)
        + cost.TRAIN_BYTES_PER_PARAM * params)

    per = rates.per_unit("training_s_per_example")
    if per:  # this CPU's calibration: its rate at this batch and width, plus each retriever's set-up and validations
        rate, agg = 1 / per, 0.0
        check = steps_per_check(per_epoch, batch, t.trainer.check_val_every_n_epoch, t.trainer.val_check_interval)
        beam = t.trainer.val_beam
        val_s = dev * rates.per_unit("search_s_per_query") * beam / rates.beam
        warm, src = n_ret * rates.per_unit("retriever_setup_s"), rates.cpu_note()

    def at(n_steps: int) -> float:
        if per:
            return warm + n_ret * (n_steps * batch * per + n_steps / check * val_s)
        return warm + spawns + n_ret * n_steps * batch / gpus / rate

    full = rates.limit(passes * cost.train_flops_per_example(model, rc.max_query_len), nbytes)
    width_note = (f"length buckets: {width:.1f} input positions an example at batch {batch} (measured, "
                  f"reports/training-buckets.py --widths), a limit {limit / full:.1f}x the full width's; assumed: "
                  f"the measured fraction of the limit holds at that width" if buckets
                  else f"padded to {rc.max_query_len} tokens")
    resolved = "" if free is None or rates.device == "cpu" else f" for {memory / 1e9:.1f} GB free"
    auto_c = f" (auto: what the memory holds{resolved})" if str(t.concurrent) == "auto" else ""
    together = (f"{concurrent} at once{auto_c}"
                + (f", {concurrent} x the single rate up to the limit: assumed: concurrent runs overlap their "
                   f"host-bound steps; not measured yet; {concurrent} worker spawns at {SPAWN_S:.0f} s each "
                   f"(assumed, not measured)" if concurrent > 1 else ""))
    auto = " (auto" + resolved + ")" if t.trainer.batch_size == "auto" else ""
    if per:
        together = (f"{concurrent} at once" + (": assumed: as fast together as one with all the threads"
                                              if concurrent > 1 else "")
                    + f"; a validation every {check:g} steps: {dev} dev queries at val_beam, {val_s:.1f} s")
    span = (f"{steps:,} steps ({t.trainer.max_epochs} epochs; {stop})" if low_steps == mid_steps == steps
            else f"{mid_steps:,} steps (assumed: the dev score best at the floor, then the patience) from "
                 f"{low_steps:,} ({stop}) to {steps:,} ({t.trainer.max_epochs} epochs, the cap)")
    return StagePlan("training", at(mid_steps), mem,
                     f"{n_ret} retrievers x {span} "
                     f"x batch {batch}{auto}{', two passes each' if passes == 2 else ''}; {width_note}; {together}: "
                     f"{_rate(rate)} examples/s ("
                     + (f"{agg:.1%} of the limit; one: {frac:.1%}, " if not per else "") + f"{src}) + "
                     + ("set-up" if per else "warm-up") + f" {warm:.0f} s", low=at(low_steps), high=at(steps),
                     steps=(low_steps, mid_steps), at_once=concurrent)


def _concurrent(setting, rc, batch: int, rates: _Rates, n_ret: int, gpus: int, memory: float, passes: int) -> int:
    """``train.concurrent`` for ``n_ret`` retrievers, as :func:`gdr.stages.train.retrievers_at_once` resolves it: 1
    where each retriever trains data-parallel over several ``gpus``; a number is kept (at most ``n_ret``); ``auto``
    is 1 on the CPU and on a GPU what :func:`gdr.training.train.concurrent_for_memory` fits in ``memory``."""
    if gpus > 1:
        return 1
    if str(setting) != "auto":
        return max(1, min(int(setting), n_ret))
    if rates.device == "cpu":
        return 1
    return concurrent_for_memory(rc, batch, memory, n_ret, passes)


def _train_steps(trainer: TrainerOptions, per_epoch: int, batch: int) -> tuple[int, int, str, int]:
    """(steps at the cap, steps at the earliest stop, what the earliest stop rests on, steps at the central stop)
    of one retriever: the cap is ``max_epochs`` (or ``max_steps``); the earliest stop is the first validation
    past both the floor (:func:`gdr.training.stopping.effective_min_steps`) and the patience (``patience_steps``
    turned into validations, else ``patience`` validations) after the first validation, as gdr.training.train sets
    up its early stopping: no run of these settings stops sooner. The central stop assumes the dev score is best
    at the floor and the patience runs out after it (the BBC run on the H200 stopped its 9 structured-docid
    retrievers at 400-550 steps, floor 300 + patience 200 = 500)."""
    epoch_steps = math.ceil(per_epoch / batch)
    max_steps = trainer.max_steps
    cap = epoch_steps * trainer.max_epochs
    cap = min(cap, max_steps) if max_steps > 0 else cap
    check = steps_per_check(per_epoch, batch, trainer.check_val_every_n_epoch, trainer.val_check_interval)
    patience = trainer.patience_steps
    checks = patience_checks(patience, check) if patience else trainer.patience
    if checks <= 0:
        return cap, cap, "no early stopping: the cap", cap
    floor = effective_min_steps(trainer.min_steps, per_epoch, batch, trainer.max_epochs, max_steps)
    first = max(1 + checks, math.ceil(floor / check))
    mid = math.ceil((math.ceil(max(floor, check) / check) + checks) * check)
    return cap, min(cap, math.ceil(first * check)), (f"earliest stop: min_steps {floor}, patience {checks} "
                                                     f"validations, one every {check:g} steps"), min(cap, mid)


def _train_batch(batch_size, rc, rates: _Rates, per_epoch: int, memory: float, passes: int) -> int:
    """``trainer.batch_size``; ``auto`` as gdr.training.train resolves it: 64 on the CPU, on a GPU what ``memory``
    bytes hold at ``passes`` forward passes a step (:func:`gdr.training.train.cuda_batch_size`)."""
    if batch_size != "auto":
        return int(batch_size)
    if rates.device == "cpu":
        return CPU_BATCH
    return cuda_batch_size(rc, memory, per_epoch, passes)


def _dev_split_size(cfg) -> int | None:
    """The queries of the retrievers' dev split when it is the query set's own (``queries.dev_split``), else None:
    titles by the split's share; a query set's dev split, whose size the plan does not know, as 0."""
    if cfg.queries.get("dev_split") is None:
        return None
    return _titles_dev(cfg)


def _n_folds(cfg) -> int:
    """Retrievers per (indexer, seed): ``queries.folds``, else one."""
    return int(cfg.queries.get("folds") or 1)


def _sizes(cfg) -> tuple[int, int, int]:
    """(documents, training queries, test queries) of one retriever of the run (cross-validated: every topic is
    in one fold, scored there and trained on in the others)."""
    n_docs, n_train, n_test = _split_sizes(cfg)
    k = _n_folds(cfg)
    if k > 1:
        n_train, n_test = (n_train + n_test) * (k - 1) // k, (n_train + n_test) // k
    return n_docs, n_train, n_test


def _split_sizes(cfg) -> tuple[int, int, int]:
    """(documents, training queries, test queries) of the run's query set."""
    name = str(cfg.data.name)
    n_docs = cfg.data.get("n_docs") or CORPUS_DOCS.get(name)
    if n_docs is None:
        raise ValueError(f"data.n_docs is null and gdr plan does not know the size of corpus {name!r}: "
                         f"set data.n_docs=<documents>")
    n_docs = int(n_docs)
    if str(cfg.queries.name) == "titles":
        fr = list(cfg.queries.get("fractions") or TITLE_FRACTIONS)
        kept = TITLES_TEST_KEPT.get(name, 1.0)
        return n_docs, int(fr[0] * n_docs * kept), max(1, round(fr[2] * n_docs * kept))
    scale = n_docs / CORPUS_DOCS.get(name, n_docs)
    n_test = TEST_QUERIES.get(name) or _own_test_queries(cfg) or ASSUMED_TEST_QUERIES
    return n_docs, int(TRAIN_QUERIES.get(name, 0) * scale), int(n_test * scale)


def _own_test_queries(cfg) -> int | None:
    """The test queries of a run's own query files: the distinct query ids of its test qrels (``data.qrels``, a file
    or a folder of ``<split>.tsv``, or a BEIR folder's ``qrels/test.tsv``), judged relevant or not; None where there
    is no such file."""
    data = cfg.data
    kind, path = resolve_corpus(str(data.name), data.get("path"))  # a BEIR folder given as data.name too
    given = data.get("qrels") or (Path(str(path)) / "qrels" if kind == "beir" and path else None)
    if not given:
        return None
    f = Path(str(given)).expanduser()
    f = f / "test.tsv" if f.is_dir() else f
    if not f.is_file():
        return None
    ids = {line.split()[0] for _, line in iter_lines(f) if line.strip()} - {"query-id"}
    return len(ids) or None


def plan_run(cfg, device: str = "h200", gpus: int = 1, folder: Path = GPU_RUNS,
             free: float | None = None, factors: bool = True, calibrate: str = "cache") -> list[StagePlan]:
    """Each stage of ``gdr run`` with the composed config ``cfg`` on ``gpus`` devices of kind ``device``;
    ``free``: the device memory free when training starts (bytes; None: all of it, assumed). On the CPU,
    ``calibrate``: ``run`` times this CPU at the run's shapes unless a calibration of them is cached
    (:func:`gdr.calibrate.calibrate_cpu`), ``cache`` uses a cached one only (no model loads), ``off`` neither."""
    if device not in DEVICES:
        raise ValueError(f"device={device!r}: use {' | '.join(DEVICES)}")
    if calibrate not in ("run", "refresh", "cache", "off"):
        raise ValueError(f"calibrate={calibrate!r}: use run | refresh | cache | off")
    rates = _Rates(device, folder, cfg, factors)
    n_docs, n_train, n_test = _sizes(cfg)
    if device == "cpu" and calibrate != "off":
        _calibrate(rates, cfg, n_docs, calibrate)
    lm = _meta_lm(str(cfg.model.name))
    doc_tokens, J = int(cfg.model.max_doc_tokens), int(cfg.sample.n_queries)
    kind = "cpu" if device == "cpu" else "cuda"
    s, score = _typed(SampleSettings, cfg.sample), _typed(ScoreSettings, cfg.score)
    compiled = want_compile(s.compile, kind, J, s.compile_min_queries)
    qg = _qg_settings(cfg)
    clustering = bool(cfg.cluster.enabled and _labelled(cfg))

    def lm_stages(fine_tuned: bool) -> list[StagePlan]:
        """The score stage's plan stages (the LM's load, P's queries sampled, P scored) and the flat clustering."""
        out = [_lm_load(str(cfg.model.name), lm, rates, fine_tuned),
               _sampling("sampling", lm, J, int(s.max_new_tokens), doc_tokens, rates, compiled),
               _scoring(lm, n_docs, J, int(s.max_new_tokens), doc_tokens, rates, gpus, score.processes)]
        return out + ([_clustering(cfg, n_docs, J, rates)] if clustering else [])

    stages = [] if qg is None else [_qg(cfg, qg, lm, rates)]
    stages += lm_stages(fine_tuned=qg is not None)
    per_doc = int(cfg.doc_queries.per_doc)
    if per_doc:
        n_gen = n_docs * per_doc
        stages.append(_sampling("doc_queries", lm, n_gen, int(cfg.doc_queries.max_new_tokens), doc_tokens, rates,
                                want_compile(s.compile, kind, n_gen, s.compile_min_queries)))
    if qg is not None and qg.compare_two_shot and clustering:  # gdr/pipeline.py compare_two_shot
        for st in lm_stages(fine_tuned=False):
            st.name += TWO_SHOT
            st.basis = "the base model with its two-shot prompt (qg.compare_two_shot), as the first: " + st.basis
            stages.append(st)
    stages.append(_indexing(cfg, n_docs, J, rates))
    if cfg.get("bm25", RunKeys.bm25):
        stages.append(_host("bm25", HOST_S["bm25_doc"] * n_docs, rates, f"{n_docs:,} documents"))
    stages += _train_and_search(cfg, n_docs, n_train, n_test, rates, gpus, free)
    stages.append(_reports(len(cfg.indexers) * len(cfg.seeds), rates))
    if lm.config.is_encoder_decoder and device != "cpu":  # the committed LM figures are SmolLM2's
        for st in stages:
            if st.name.removesuffix(TWO_SHOT) in ("lm_load", "sampling", "scoring", "doc_queries"):
                st.basis += "; measured on SmolLM2 (no seq2seq LM figure committed)"
    for st in stages:
        rates.apply_factor(st)
    return stages


def sized_config(cfg):
    """``cfg``, with ``data.n_docs`` the corpus's document count when it is null and the corpus is none whose size
    the plan knows (:data:`CORPUS_DOCS`: a local folder or file, counted by loading it); as it is otherwise, or
    when the corpus does not load here."""
    if cfg.data.get("n_docs") or str(cfg.data.name) in CORPUS_DOCS:
        return cfg
    try:
        n_docs = len(corpus_from_config(OmegaConf.to_container(cfg.data, resolve=True)))
    except Exception as e:  # noqa: BLE001  (the plan then asks for data.n_docs in its own words)
        log.info("plan: the corpus did not load to count its documents (%s: %s)", type(e).__name__, e)
        return cfg
    sized = copy.deepcopy(cfg)
    sized.data.n_docs = n_docs
    return sized


def _first_texts(cfg, n: int) -> list[str] | None:
    """The LM inputs of the run's first ``n`` documents, or None (with a log line) when the corpus does not load
    here: the calibration then times a stand-in news text."""
    try:
        corpus = corpus_from_config(OmegaConf.to_container(cfg.data, resolve=True))
    except Exception as e:  # noqa: BLE001  (a plan never fails for want of the corpus: it times a stand-in)
        log.info("plan: calibrating on a stand-in text, the corpus did not load (%s: %s)", type(e).__name__, e)
        return None
    return list(corpus.model_inputs()[:n])


def _calibrate(rates: _Rates, cfg, n_docs: int, mode: str) -> None:
    """This CPU's calibration at the shapes of ``cfg`` into ``rates``: measured now (``run``, unless cached;
    ``refresh``: even if cached) or read from the cache (``cache``)."""
    t = _train_settings(cfg)
    model = _retriever(cfg, t, n_docs)
    rc = model.config
    threads = cfg.get("threads")
    score = _typed(ScoreSettings, cfg.score)
    processes = score.processes
    batch = CPU_BATCH if t.trainer.batch_size == "auto" else int(t.trainer.batch_size)
    sb, db = _typed(SampleSettings, cfg.sample).batch_size, cfg.doc_queries.batch_size
    per_doc, new = int(cfg.doc_queries.per_doc), int(cfg.sample.max_new_tokens)
    qt = score.max_query_tokens
    shapes = {"model": str(cfg.model.name), "doc_tokens": int(cfg.model.max_doc_tokens),
              "new_tokens": new, "threads": threads,
              "sample_batch": min(int(cfg.sample.n_queries), CPU_SAMPLE_BATCH if sb == "auto" else int(sb)),
              "per_doc": per_doc,
              "doc_query_docs": min(n_docs, max(1, (CPU_SAMPLE_BATCH if db == "auto" else int(db)) // max(per_doc, 1))),
              "score_threads": 1 if processes > 1 else (threads or torch.get_num_threads()),
              "score_queries": min(int(cfg.sample.n_queries),
                                   (CPU_MAX_QUERY_TOKENS if qt == "auto" else int(qt)) // max(new, 1)),
              "train_threads": training_threads(), "batch": batch,
              "width": round(_padded_width(rc.max_query_len, batch, t.trainer.length_buckets), 1),
              "beam": int(cfg.evaluate.beam), "n_docs": n_docs, "n_digits": rc.n_digits, "depth": rc.max_code_len,
              "retriever": {k: v for k, v in rc.to_dict().items() if k != "encoder_hf_config"},
              "docs": str(cfg.data.name)}  # timed on the run's first documents
    if mode in ("run", "refresh"):
        path = calibration_path(shapes)
        need = max(shapes["doc_query_docs"], shapes["sample_batch"])
        texts = None if path.is_file() and mode == "run" else _first_texts(cfg, need)
        figures, path, cached = calibrate_cpu(shapes, rc, refresh=mode == "refresh", texts=texts)
    else:
        path = calibration_path(shapes)
        if not path.is_file():
            return
        figures, cached = json.loads(path.read_text(encoding="utf-8"))["figures"], True
    rates.cal, rates.beam = figures, shapes["beam"]
    busy = figures.get("load_average")
    rates.cal_note = (f"calibrated on this CPU{', cached' if cached else ''}"
                      + (f" at load average {busy:g} on {os.cpu_count()} cores" if busy is not None else "")
                      + (f" in {figures['calibration_s']:g} s" if "calibration_s" in figures else "")
                      + f": {path}")


def _host(name: str, seconds: float, rates: _Rates, what: str) -> StagePlan:
    """Host work (no model math) at the figures of the BBC run's machine (:data:`HOST_S`)."""
    src = rates.host_note()
    return StagePlan(name, seconds, None, f"{what} at the BBC run's per-unit seconds ({src})")


def _clustering(cfg, n_docs: int, J: int, rates: _Rates) -> StagePlan:
    """The flat clustering stage: GC (each variant) and the k-means baselines, ``cluster.repeats`` times each."""
    c = _typed(ClusterSettings, cfg.cluster)
    repeats, variants, baselines = c.repeats, max(1, len(c.variants)), c.baselines
    per = {"tfidf": HOST_S["tfidf_doc_repeat"] * n_docs, "embedding": HOST_S["embedding_doc_repeat"] * n_docs,
           "logp": HOST_S["logp_entry_repeat"] * n_docs * J}
    seconds = repeats * (variants * HOST_S["gc_entry_repeat"] * n_docs * J + sum(per.get(b, 0.0) for b in baselines))
    return _host("clustering", seconds, rates, f"{repeats} repeats of GC ({variants} variant(s)) over the "
                 f"{n_docs * J:,} P entries and of k-means on {', '.join(baselines) or 'nothing'}")


def _indexing(cfg, n_docs: int, J: int, rates: _Rates) -> StagePlan:
    """Every docid scheme's index: GC's over P, the others over the documents; with ``index_seed=retriever`` one per
    retriever seed (:func:`gdr.stages.index.index_seeds`). ``parts``: the seconds of one index of each scheme."""
    per = {i: HOST_S["index_gc_entry"] * n_docs * J if i == "gc" else HOST_S.get(f"index_{i}_doc", 0.0) * n_docs
           for i in cfg.indexers}
    if "bmi" in per:  # BMI's measured seconds are of its generated queries alone
        per["bmi"] *= BMI_INPUTS_COST[_typed(IndexSettings, cfg.index).bmi.inputs]
    count = {i: sum(m == i for m, _ in _index_stages(cfg)) for i in cfg.indexers}
    st = _host("indexing", sum(v * count[i] for i, v in per.items()), rates,
               ", ".join(f"{i} {v:.1f} s" + (f" x {count[i]} seeds" if count[i] > 1 else "") for i, v in per.items()))
    st.parts = per
    return st


def _lm_load(name: str, lm, rates: _Rates, fine_tuned: bool = False) -> StagePlan:
    """The LM's cold load: a bundled GGUF LM by the fast conversion (:data:`LM_LOAD_S`), another by the cold load
    the committed runs measured; ``fine_tuned``: the generator the qg stage fine-tuned, from its local folder."""
    measured = rates.per_unit("lm_load_s") or rates.cold("lm_load", "sampling_load_s")
    src = rates.cpu_note() if rates.device == "cpu" else rates.figures.get("sampling_load_s", (0, "none"))[1]
    if fine_tuned:
        return StagePlan("lm_load", measured, cost.weight_bytes(lm, 4),
                         f"the generator fine-tuned by the qg stage, loaded from its folder (no GGUF conversion): "
                         f"the cold load measured ({src})")
    if rates.device == "cpu" or name not in BUNDLED:
        return StagePlan("lm_load", measured, cost.weight_bytes(lm, 4), f"the cold load measured ({src})")
    return StagePlan("lm_load", LM_LOAD_S, cost.weight_bytes(lm, 4),
                     f"the fast GGUF conversion: {LM_LOAD_S:.0f} CPU s measured on the 2-core development CPU "
                     f"(reports/lm-cold-start.md), not on the GPU machine's; its cold load before it: "
                     f"{measured:.1f} s ({src})")


def _qg_settings(cfg) -> RunQG | None:
    """The run's ``qg`` section, typed as the run types it (``gdr.pipeline.run_settings``); None when the run
    fine-tunes no generator (``qg.enabled`` false, or a config from before the section)."""
    if cfg.get("qg") is None or not cfg.qg.get("enabled"):
        return None
    return section_from(RunQG, OmegaConf.to_container(cfg.qg, resolve=True), "qg")


# The share of a corpus's documents with a title of their own (qg.pairs=titles: one pair each), measured with
# gdr.data.titles.title_queries: Cranfield 1,350 of 1,400 (2 without a title, 48 sharing one); others: all, assumed
TITLED_SHARE = {"cranfield": 1350 / 1400}


def _qg(cfg, q: RunQG, lm, rates: _Rates) -> StagePlan:
    """The qg stage (gdr/pipeline.py ``qg_spec``): the base LM loaded, its held-out loss on the run's dev pairs, the
    fine-tune on the training split's (document, query) pairs (one pair a training query, :func:`_split_sizes`;
    ``qg.dev_fraction`` of them held out to pick the checkpoint, validated before, once an epoch and once more at
    the end), the fine-tuned generator loaded from its folder for its held-out loss. Training FLOPs 6 x parameters x
    tokens, forward passes 2 x; each pair max_doc_tokens + the prompt + a query of ``sample.max_new_tokens`` tokens
    (assumed: the queries the generator learns are as long as those it samples)."""
    o = q.train
    n_docs, n_pairs, _ = _split_sizes(cfg)
    dev = _titles_dev(cfg)
    titles = q.pairs == "titles"
    if titles:  # one pair a document with a title of its own, less the held-out documents' (qg.dev_fraction, at
        # most qg.dev_max: the report's held-out loss)
        titled = round(n_docs * TITLED_SHARE.get(str(cfg.data.name), 1.0))
        dev = min(round(titled * float(q.dev_fraction)), int(q.dev_max or titled))
        n_pairs = titled - dev
    if q.max_pairs:
        n_pairs = min(n_pairs, int(q.max_pairs))
    held = min(round(n_pairs * float(q.dev_fraction)), int(q.dev_max))  # titles: one pair a document
    n_fit = n_pairs - held
    query_tokens = int(cfg.sample.max_new_tokens)
    tokens = int(cfg.model.max_doc_tokens) + PROMPT_TOKENS + query_tokens
    epoch_steps = math.ceil(n_fit / max(o.batch_size, 1))
    steps = epoch_steps * o.max_epochs
    steps = min(steps, o.max_steps) if o.max_steps > 0 else steps
    fitted = min(n_fit * o.max_epochs, steps * o.batch_size)  # pairs trained on, every epoch
    matmul, params = cost.param_count(lm), sum(p.numel() for p in lm.parameters())
    on_gpu = rates.device != "cpu"
    train_flops = 3 * cost.linear_flops_per_token(matmul) * tokens  # 6 x parameters x tokens
    train_bytes = cost.training_bytes_per_example(params, matmul, o.batch_size, on_gpu)
    fwd_flops = cost.linear_flops_per_token(matmul) * tokens
    fwd_bytes = cost.weight_bytes(lm, 2 if on_gpu else 4) / max(int(o.eval_batch_size), 1)
    if on_gpu:
        frac, src = QG_FRACTION, "assumed: no GPU run has fine-tuned the generator (plan-constants.json QG_FRACTION)"
    else:
        frac, src = rates.fraction("training")
    rate, fwd_rate = frac * rates.limit(train_flops, train_bytes), frac * rates.limit(fwd_flops, fwd_bytes)
    validations = o.max_epochs + 2 if held else 0  # before the fit, each epoch, the kept state's measure
    forward = held * validations + 2 * dev  # + the run's dev pairs under the base and the fine-tuned generator
    base = _lm_load(str(cfg.model.name), lm, rates)
    tuned = _lm_load(str(cfg.model.name), lm, rates, fine_tuned=True)
    warm = rates.cold("training", "training_small30m_warmup_s")
    seconds = base.seconds + tuned.seconds + warm + fitted / rate + forward / fwd_rate
    peak = cost.TRAIN_BYTES_PER_PARAM * params
    held_what = "held-out documents' titles" if titles else "run's dev pairs"
    return StagePlan("qg", seconds, peak,
                     f"fine-tuning {cfg.model.name} on {n_pairs:,} training pairs"
                     f"{' (document, title)' if titles else ''} less {held} held out for the checkpoint "
                     f"(qg.dev_fraction {float(q.dev_fraction):g}) x {o.max_epochs} epochs: {steps:,} "
                     f"steps at batch {o.batch_size}, {tokens} tokens a pair (max_doc_tokens "
                     f"{cfg.model.max_doc_tokens} + prompt {PROMPT_TOKENS} + a query of {query_tokens}: assumed), 6 x "
                     f"{matmul / 1e6:.0f} M "
                     f"parameters x tokens at {_rate(rate)} pairs/s ({frac:.1%} of the limit, {src}); forward only "
                     f"(2 x parameters x tokens) at {_rate(fwd_rate)} pairs/s: the {held} held-out pairs x "
                     f"{validations} validations and the {dev} {held_what} under both generators; + loads: the "
                     f"base model {base.seconds:.1f} s, the fine-tuned one {tuned.seconds:.1f} s; + warm-up "
                     f"{warm:.0f} s (the retriever's, assumed); peak: weights, gradients and AdamW state "
                     f"(activations not counted)")


def _titles_dev(cfg) -> int:
    """The run's dev split's queries: titles by the split's share (:data:`TITLES_TEST_KEPT`); 0 for a query set,
    whose dev split's size the plan does not know."""
    if str(cfg.queries.name) != "titles":
        return 0
    fr = list(cfg.queries.get("fractions") or TITLE_FRACTIONS)
    name = str(cfg.data.name)
    return round(fr[1] * int(cfg.data.get("n_docs") or CORPUS_DOCS.get(name, 0)) * TITLES_TEST_KEPT.get(name, 1.0))


def _rewrite_s(n: int) -> float:
    """One report rewrite after ``n`` retrievers (:data:`REPORT_REWRITE_S`, linear between the measured counts, held
    past the last)."""
    pts = sorted(REPORT_REWRITE_S.items())
    return float(np.interp(n, [k for k, _ in pts], [v for _, v in pts]))


def _rewrites_s(first: int, last: int) -> float:
    """The report rewrites after retrievers ``first`` .. ``last`` (:func:`_rewrite_s` each)."""
    return sum(_rewrite_s(k) for k in range(first, last + 1))


def _index_stages(cfg) -> list[tuple[str, int | None]]:
    """(indexer, index seed) of every index stage of the run of ``cfg`` (:func:`gdr.stages.index.index_stages`)."""
    return index_stages(cfg.indexers, str(cfg.get("index_seed") or RunKeys.index_seed), cfg.seeds)


def _reports(n_ret: int, rates: _Rates) -> StagePlan:
    """The time outside any stage but the LM's load: the report rewritten after each of ``n_ret`` retrievers (each
    at tests/bench_report.py's seconds after as many retrievers) and the rest (process start, corpus load,
    bookkeeping: the 2026-11-27 run's outside seconds less its report rewrites, :data:`OUTSIDE_1127`)."""
    rewrites = _rewrites_s(1, n_ret)
    other = OUTSIDE_1127["other"]
    st = StagePlan("reports", rewrites + other, None,
                   f"{n_ret} report rewrites, one after each retriever, {_rewrite_s(1):.2f}-{_rewrite_s(n_ret):.2f} s "
                   f"each by the retrievers done (tests/bench_report.py --retrievers on the 2-core development CPU, "
                   f"plan-constants.json REPORT_REWRITE_S; assumed: the run's CPU as fast): {rewrites:.1f} s; other "
                   f"outside stages {other:.1f} s (process start, corpus load, bookkeeping: the 2026-11-27 run's "
                   f"{OUTSIDE_1127['seconds']:.1f} s outside stages less its {OUTSIDE_1127['report_rewrites']:.1f} s "
                   f"of report rewrites (run.log), assumed for any run)")
    st.parts = {"report_rewrites": rewrites, "other": other}
    return st


# --- the wall clock: host stages in a background thread beside the device stages (gdr.stages.overlap) ---------------

@dataclass
class HostTask:
    """A host stage the run starts in the background (:class:`gdr.stages.overlap.HostStages`): its ``seconds``, its
    :class:`gdr.stages.overlap.Priority` and the main thread's step after which the run starts it (``after``)."""

    name: str
    seconds: float
    priority: int
    after: str


@dataclass
class WallPlan:
    """The run's predicted wall clock (``seconds``), with ``overlap`` on or off: the main thread's ``waits`` (step ->
    seconds it waited before that step), each host stage's ``finish`` (seconds from the start; overlap on), the host
    stages' seconds (``host``) and what it rests on (``basis``)."""

    seconds: float
    overlap: bool
    waits: dict[str, float]
    finish: dict[str, float]
    host: float
    basis: str

    def record(self) -> dict:
        """The wall as plan.json and the JSON line hold it."""
        return {"seconds_wall": round(self.seconds, 1),
                "overlap": {"on": self.overlap, "host_seconds": round(self.host, 1),
                            "waits": {k: round(v, 1) for k, v in self.waits.items()}}}


def simulate_overlap(main: list[tuple[str, float]], host: list[HostTask], indexes_by: str,
                     all_by: str) -> WallPlan:
    """The wall clock of a run whose main thread runs the steps ``main`` (name, seconds) in order while one
    background worker runs the ``host`` stages one at a time: each becomes available once its ``after`` step has
    ended, and the worker, when free, takes the lowest priority of those available (then the first started), as
    :class:`gdr.stages.overlap.HostStages` does. The main thread waits before step ``indexes_by`` for every index
    (priority :attr:`Priority.INDEX`, :func:`gdr.pipeline.take_indexes`) and before step ``all_by`` for every host
    stage (the first report). Every ``after`` step comes before both waits, as in the run (all host stages start
    before the retrievers train), so the worker's schedule is fixed before the main thread waits."""
    names = [n for n, _ in main]
    first_wait = min(names.index(indexes_by), names.index(all_by))
    ends, t = {}, 0.0
    for name, sec in main[:first_wait]:
        t += sec
        ends[name] = t
    late = [h.name for h in host if h.after not in ends]
    if late:
        raise ValueError(f"host stages {late} start after the main thread first waits ({names[first_wait]})")
    queue = sorted(range(len(host)), key=lambda i: (ends[host[i].after], i))  # by release, then as started
    finish, free, ready, k = {}, 0.0, [], 0
    while k < len(queue) or ready:
        if not ready:
            free = max(free, ends[host[queue[k]].after])
        while k < len(queue) and ends[host[queue[k]].after] <= free:
            ready.append(queue[k])
            k += 1
        i = min(ready, key=lambda j: (host[j].priority, j))
        ready.remove(i)
        free += host[i].seconds
        finish[host[i].name] = free
    waits, t = {}, 0.0
    for name, sec in main:
        need = [finish[h.name] for h in host if name == all_by or (name == indexes_by and h.priority == Priority.INDEX)]
        if need and max(need) > t:
            waits[name] = max(need) - t
            t = max(need)
        t += sec
    return WallPlan(t, True, waits, finish, sum(h.seconds for h in host), "")


def plan_wall(cfg, stages: list[StagePlan], device: str, overlap: bool | None = None,
              left: Remaining | None = None) -> WallPlan:
    """The wall clock of the run of ``cfg`` planned as ``stages`` on ``device``: with ``overlap`` (None: the run's
    setting, :func:`gdr.stages.overlap.overlap_on`) the host stages (the flat clustering(s), every index, BM25) in
    one background thread beside the main thread (:func:`simulate_overlap`), else the stages one after another;
    ``left``: what a run folder still lacks (:func:`remaining`), ``stages`` being its remaining plan."""
    if overlap is None:
        overlap = overlap_on(cfg.get("overlap", RunKeys.overlap), "cpu" if device == "cpu" else "cuda")
    by = {s.name: s for s in stages}
    total = sum(s.seconds for s in stages)
    if not overlap:
        return WallPlan(total, False, {}, {}, 0.0, "overlap off (on the CPU by default: the host stages would compete "
                        "for its cores): the stages one after another, the total")

    def sec(*names: str) -> float:
        return sum(by[n].seconds for n in names if n in by)

    tasks = []
    parts = (by["indexing"].parts or {}) if "indexing" in by else {}
    for method, seed in _index_stages(cfg):
        name = index_stage_name(method, seed)
        done = left is not None and name in left.finished
        tasks.append(HostTask(name, 0.0 if done else parts.get(method, 0.0), Priority.INDEX,
                              "doc_queries" if method == "bmi" else "score"))
    tasks += [HostTask("cluster", sec("clustering"), Priority.CLUSTER, "score"),
              HostTask("bm25", sec("bm25"), Priority.BM25, "score"),
              HostTask("cluster" + TWO_SHOT, sec("clustering" + TWO_SHOT), Priority.CLUSTER, "score" + TWO_SHOT)]
    tasks = [t for t in tasks if t.seconds > 0 or t.name.startswith("index-")]
    train = by.get("training")
    n_ret = len(cfg.indexers) * len(cfg.seeds) * _n_folds(cfg) if left is None else left.retrievers
    at_once = min(train.at_once or 1, n_ret) if train is not None else 1
    first = (sec("training") * at_once + sec("evaluation")) / max(n_ret, 1)  # the first retriever trained and scored
    main = [("qg", sec("qg")), ("score", sec(*RUN_GROUPS["score"])), ("doc_queries", sec("doc_queries")),
            ("score" + TWO_SHOT, sec(*RUN_GROUPS["score" + TWO_SHOT])), ("first retriever", first),
            ("the rest", sec("training", "evaluation", "reports") - first)]
    wall = simulate_overlap(main, tasks, "first retriever", "the rest")
    host = sum(t.seconds for t in tasks)
    waited = ", ".join(f"{v:.1f} s before {'training' if k == 'first retriever' else 'the first report'}"
                       for k, v in wall.waits.items()) or "no wait"
    wall.basis = (f"overlap on: the host stages ({host:.1f} s: the flat clustering(s), every index, "
                  f"BM25) in one background thread beside the device stages, taken in Priority order as the run "
                  f"starts them (indexes, clustering and BM25 after the score stage, BMI's indexes after doc_queries, "
                  f"the two-shot clustering after its scoring); the main thread waits for every index before "
                  f"training and for the rest by the first report (after the first retriever: training x {at_once} at "
                  f"once / {n_ret} + evaluation / {n_ret}, assumed even): {waited}; not modelled: the host thread's "
                  f"hold on the GIL slowing the device stages' dispatch (gdr bench overlap on a CPU: a dispatch-bound "
                  f"main loop keeps 0.96x its rate beside the clustering, 0.2-0.5x beside BM25 and the indexes but "
                  f"BMI's: at most ~10 s of a BBC run, reports/benchmarks.md)")
    return wall


# --- what a run folder still lacks: the plan of the stages left (a later lease of one experiment) -----------------

@dataclass
class Remaining:
    """The stages a run folder holds finished (``finished``: run stage name -> count, :func:`finished_stages`) and
    what is left of the run of ``cfg``: the retrievers whose evaluation is not there (``retrievers``, of ``total``)."""

    finished: dict[str, int]
    retrievers: int
    total: int

    def record(self, stages: list[StagePlan], wall: WallPlan) -> dict:
        """What is left as the JSON line holds it."""
        return {"finished": dict(sorted(self.finished.items())), "retrievers_left": self.retrievers,
                "retrievers": self.total, "seconds": round(sum(s.seconds for s in stages), 1),
                "seconds_wall": round(wall.seconds, 1)}


def finished_stages(out: Path) -> dict[str, int]:
    """The stages complete in the run folder ``out`` (``<name>-<key>/stage.json`` with status complete, pruned ones
    too: their results stand), counted by name (a run's second ``score`` and ``cluster``: the two-shot ones)."""
    counts: dict[str, int] = {}
    for path in sorted(Path(out).glob(f"*/{STAGE_FILE}")):
        rec = read_stage_record(path.parent)  # None: being written, or damaged: gdr run redoes it, so it is left
        if rec is not None and rec.get("status") == "complete" and rec.get("stage"):
            counts[str(rec["stage"])] = counts.get(str(rec["stage"]), 0) + 1
    return counts


def remaining(cfg, stages: list[StagePlan], finished: dict[str, int]) -> tuple[list[StagePlan], Remaining]:
    """The plan ``stages`` of the run of ``cfg`` less what its folder holds finished (``finished``, by stage name:
    :func:`finished_stages`), as ``gdr run`` with the same settings reuses it: the qg stage; P (its LM load only
    once the generated queries are made too); the clustering; the generated queries; each index by its stage name;
    BM25; each retriever trained (``train-*``) and evaluated (``eval-*``), its share of training and evaluation;
    the report rewrites after the retrievers done. A second ``score`` or ``cluster`` is the two-shot one
    (``qg.compare_two_shot``). Names only: a stage made with other settings is counted as finished here, where
    ``gdr run`` would make it again."""
    n = finished.get
    names = [retriever_name(m, int(s), f) for s in cfg.seeds for f in retriever_folds(cfg.queries.get("folds"))
             for m in cfg.indexers]
    trained = sum(n(f"train-{r}", 0) > 0 for r in names)
    evaluated = sum(n(f"eval-{r}", 0) > 0 for r in names)
    total = len(names)
    done = {"qg": n("qg", 0) >= 1, "sampling": n("score", 0) >= 1, "scoring": n("score", 0) >= 1,
            "lm_load": n("score", 0) >= 1 and (n("doc-queries", 0) >= 1 or not int(cfg.doc_queries.per_doc)),
            "clustering": n("cluster", 0) >= 1, "doc_queries": n("doc-queries", 0) >= 1, "bm25": n("bm25", 0) >= 1,
            "lm_load" + TWO_SHOT: n("score", 0) >= 2, "sampling" + TWO_SHOT: n("score", 0) >= 2,
            "scoring" + TWO_SHOT: n("score", 0) >= 2, "clustering" + TWO_SHOT: n("cluster", 0) >= 2}
    left = []
    for st in stages:
        st = copy.copy(st)
        if done.get(st.name):
            st.scale(0.0)
        elif st.name == "indexing":
            parts = st.parts or {}
            st.seconds = sum(parts.get(m, 0.0) for m, seed in _index_stages(cfg) if not n(index_stage_name(m, seed), 0))
        elif st.name == "training":
            st.scale((total - trained) / max(total, 1))
        elif st.name == "evaluation":
            st.scale((total - evaluated) / max(total, 1))
        elif st.name == "reports":
            st.parts = {**(st.parts or {}), "report_rewrites": _rewrites_s(evaluated + 1, total)}
            st.seconds = sum(st.parts.values())
        left.append(st)
    return left, Remaining(finished, total - evaluated, total)


def format_remaining(stages: list[StagePlan], left: Remaining, wall: WallPlan, out: Path) -> str:
    """What is left of the run in ``out``: the stages with seconds left, then its sum and wall clock."""
    said = ", ".join(f"{k}" + (f" x{v}" if v > 1 else "") for k, v in sorted(left.finished.items()))
    lines = [f"remaining: {out} holds {sum(left.finished.values())} finished stages ({said}); "
             f"{left.total - left.retrievers} of {left.total} retrievers evaluated; matched by stage name (a stage "
             f"made with other settings counts here, where gdr run makes it again):"]
    lines += [f"  {s.name:<22} {s.seconds:>9.1f}" for s in stages if s.seconds > 0]
    lines.append(f"{'remaining':<20} {sum(s.seconds for s in stages):>9.1f}  the stages left one after another")
    lines.append(f"{'remaining wall':<20} {wall.seconds:>9.1f}  "
                 + ("overlap on, as the wall above" if wall.overlap else "overlap off"))
    return "\n".join(lines)


def _labelled(cfg) -> bool:
    """Whether the corpus has class labels (flat clustering is evaluated only then)."""
    return str(cfg.data.name) in ("bbc", "reuters", "r2", "r5")


def predict(cfg, device: str = "h200", gpus: int = 1) -> dict[str, float]:
    """Predicted seconds per stage (:func:`plan_run`), for a report to set beside the measured ones."""
    return {s.name: round(s.seconds, 1) for s in plan_run(cfg, device, gpus)}


def stage_seconds(stages: list[StagePlan], names: list[str], n_ret: int) -> dict[str, float | None]:
    """The plan's seconds of each run stage in ``names`` (:func:`gdr.stages.plan_file.stage_seconds`)."""
    return _stage_seconds({s.name: s.seconds for s in stages}, _index_parts(stages), names, n_ret)


def _index_parts(stages: list[StagePlan]) -> dict[str, float]:
    return next((dict(s.parts or {}) for s in stages if s.name == "indexing"), {})


def write_run_plan(cfg, run_dir: Path, device: str, gpus: int, stages: list[StagePlan],
                   wall: WallPlan | None = None) -> Path:
    """``<run_dir>/plan.json`` (:func:`gdr.stages.plan_file.write_plan`) of ``stages``, the plan of the composed
    run config ``cfg`` on ``device``, with its wall clock (``wall``; None: :func:`plan_wall` of the run's
    ``overlap``): what the run's report sets beside the measured seconds."""
    identity = plan_identity(OmegaConf.to_container(cfg, resolve=True), device)
    wall = wall or plan_wall(cfg, stages, device)
    return write_plan(run_dir, identity, gpus, {s.name: s.seconds for s in stages}, _index_parts(stages),
                      len(cfg.indexers) * len(cfg.seeds) * _n_folds(cfg), wall.record())


def predict_stages(cfg, names: list[str], n_docs: int) -> dict[str, float | None]:
    """Predicted seconds of the ``gdr run`` stages ``names`` (:func:`stage_seconds`) of ``cfg`` over ``n_docs``
    documents on this machine (:func:`run_device`), from :func:`plan_run` (configs only, no model loaded). None
    for every stage where the plan cannot be made (a model without a local config, a GPU without figures), said
    in the log: a report never fails for want of a prediction."""
    device, gpus = run_device(cfg.get("device"))
    try:
        if device is None:
            raise ValueError(f"no figures for {torch.cuda.get_device_name(0)}")
        sized = copy.deepcopy(cfg)
        sized.data.n_docs = int(n_docs)
        stages = plan_run(sized, device, gpus)
    except Exception as e:  # noqa: BLE001  (any reason the plan cannot be made leaves the predictions n/a)
        log.info("report: no predicted seconds (%s: %s)", type(e).__name__, e)
        return {name: None for name in names}
    got = stage_seconds(stages, names, len(cfg.indexers) * len(cfg.seeds) * _n_folds(cfg))
    return {k: None if v is None else round(v, 1) for k, v in got.items()}


def format_plan(stages: list[StagePlan], device: str, gpus: int, wall: WallPlan | None = None) -> str:
    """The plan as a table: stage, seconds, peak memory, basis; the total at the central stops, then at the
    earliest early stops, then at the epoch caps; then the wall clock (``wall``, when given)."""
    lines = [f"gdr plan on {gpus} x {DEVICES[device]}:", f"{'stage':<20} {'seconds':>9} {'peak GB':>8}  basis"]
    for s in stages:
        mem = "-" if s.peak_bytes is None else f"{s.peak_bytes / 1e9:.1f}"
        lines.append(f"{s.name:<20} {s.seconds:>9.1f} {mem:>8}  {s.basis}")
    lines.append(f"{'total':<20} {sum(s.seconds for s in stages):>9.1f}  every retriever stopped at the central "
                 f"estimate")
    lines.append(f"{'total, early stop':<20} {sum(s.seconds_low for s in stages):>9.1f}  every retriever stopped at "
                 f"the earliest its early stopping allows")
    lines.append(f"{'total, epoch cap':<20} {sum(s.seconds_high for s in stages):>9.1f}  every retriever to its "
                 f"epoch cap")
    if wall is not None:
        lines.append(f"{'wall':<20} {wall.seconds:>9.1f}  {wall.basis}")
    return "\n".join(lines)


# --- gdr plan --check: a finished run's measured seconds against the plan of its config -------------------------

_RESOLVED = re.compile(r"train\.concurrent=auto: (\d+) retrievers at once \(batch (\d+), ([\d.]+) GB free\)")


@dataclass
class RunCheck:
    """A finished run beside its plan: ``rows`` of (stage, predicted before the run's factors, predicted, measured);
    ``factors``: measured / predicted per plan stage (the plan before any factors), as ``--write-factors`` saves."""

    run: Path
    device: str
    rows: list[tuple[str, float | None, float | None, float]]
    factors: dict[str, float]
    notes: list[str]
    cfg: Any = None  # the run's composed config
    plan: list[StagePlan] | None = None  # the plan of that config, with the device's factors
    wall: WallPlan | None = None  # that plan's wall clock, the host stages overlapped as they were in the run


def _run_report(run_dir: Path) -> tuple[Path, dict]:
    """(the folder, report.json) of ``run_dir``: a run folder or a folder holding its report.json."""
    path = run_dir / "report.json"
    if not path.is_file():
        raise ValueError(f"gdr plan --check {run_dir}: no report.json there (a finished gdr run folder, or a "
                         f"folder holding its report.json)")
    rep = json.loads(path.read_text(encoding="utf-8"))
    if not rep.get("stages"):
        raise ValueError(f"{path}: no stages with seconds (a report of gdr run)")
    return run_dir, rep


def _run_config(run_dir: Path, rep: dict):
    """The composed config of the run: its ``run.config.yaml``, else the overrides of ``command`` in report.json."""
    saved = run_dir / "run.config.yaml"
    if saved.is_file():
        return OmegaConf.load(saved)
    words = shlex.split(str(rep.get("command", "")))  # the command as gdr run wrote it, each word shell-quoted
    if words[:2] != ["gdr", "run"]:
        raise ValueError(f"{run_dir}: no run.config.yaml and report.json's command {rep.get('command')!r} is not "
                         f"a gdr run")
    return load_config("run", [w for w in words[2:] if not w.startswith("out=")])


def check_run(run_dir: Path, device: str | None = None, gpus: int = 1, folder: Path = GPU_RUNS) -> RunCheck:
    """The plan of the run in ``run_dir`` (its config; the memory free at training as its log says, when it does)
    beside the seconds its report measured, stage by stage (:func:`stage_seconds`; a stage the run ran twice, the
    second score and cluster of ``qg.compare_two_shot``, as :func:`gdr.stages.plan_file.planned_names` names it;
    a host stage run in the background beside its own plan row), with the retrievers' training, their evaluation,
    the time outside any stage but the LM loads (the report's ``outside_stages`` accounts when it has them: report
    rewrites and the rest; else the run's seconds less its stages') and the total (the plan's wall clock, with the
    host stages overlapped as they were in the run) as rows of their own."""
    run_dir, rep = _run_report(Path(run_dir))
    cfg = _run_config(run_dir, rep)
    notes = []
    log_text = (run_dir / "run.log").read_text(encoding="utf-8", errors="replace") if (
        run_dir / "run.log").is_file() else ""
    if device is None:
        device = _recorded_device(run_dir, log_text)
    m = _RESOLVED.search(log_text)
    free = float(m.group(3)) * 1e9 if m else None
    if m:
        notes.append(f"resolved in the run (run.log): {m.group(1)} retriever(s) at once, batch {m.group(2)}, "
                     f"{m.group(3)} GB free at training")
    else:
        notes.append("assumed: the device's whole memory free at training (run.log does not say)")
    trained = rep.get("training") or {}
    if trained.get("peak_gb") is not None and trained.get("estimate_gb"):
        notes.append(f"training memory: one retriever's measured peak {trained['peak_gb']:.1f} GB against the batch "
                     f"rule's {trained['estimate_gb']:.1f} GB ({trained['peak_gb'] / trained['estimate_gb']:.2f}x; "
                     f"the rule fills 60% of the free memory with its estimate)")
    sized = copy.deepcopy(cfg)
    sized.data.n_docs = int(rep.get("n_docs") or _sizes(cfg)[0])
    raw = plan_run(sized, device, gpus, folder, free=free, factors=False)
    cal = plan_run(sized, device, gpus, folder, free=free)
    _, ffile = stage_factors(device, folder)
    if ffile:
        notes.append(f"plan: with the factors of {ffile}" + (
            " (measured on this run: in-sample; 'plan, no factors' is the out-of-sample prediction)"
            if ffile.startswith(run_dir.resolve().name) else ""))
    reused = sum(bool(st.get("reused")) for st in rep["stages"])
    if reused:  # each stage row holds that stage's own seconds; the invocation's clock covers only what it did
        notes.append(f"resumed: {reused} of {len(rep['stages'])} stages were made by an earlier invocation; the "
                     f"report's seconds ({float(rep['seconds']):.1f} s) and outside accounts are of the last one "
                     "alone, so the total and outside rows are not compared with the whole run's plan")
    if rep.get("partial"):
        notes.append(f"partial: {rep['partial']['retrievers_done']} of {rep['partial']['retrievers']} retrievers "
                     "finished; the plan is of the whole run")
    names = planned_names([st["name"] for st in rep["stages"]])
    measured: dict[str, float] = {}
    for name, st in zip(names, rep["stages"]):  # a name repeated past the two-shot pass: summed
        measured[name] = measured.get(name, 0.0) + float(st["seconds"])
    names = list(measured)
    n_ret = sum(n.startswith("train-") for n in names) or len(cfg.indexers) * len(cfg.seeds)
    p_raw, p_cal = stage_seconds(raw, names, n_ret), stage_seconds(cal, names, n_ret)
    rows = [(n, p_raw[n], p_cal[n], measured[n]) for n in names]
    by_raw, by_cal = {s.name: s for s in raw}, {s.name: s for s in cal}
    accounts = rep.get("outside_stages")
    if accounts:  # the run's own clock (gdr.pipeline.run_timing); its LM loads are inside the score rows here
        outside = float(accounts["report_rewrites"]) + float(accounts["other"])
        notes.append(f"outside stages: the report's accounts, report rewrites {accounts['report_rewrites']:.1f} s + "
                     f"other {accounts['other']:.1f} s (its LM loads, {accounts['lm_load']:.1f} s, are in the score "
                     f"rows)")
    else:
        outside = float(rep["seconds"]) - sum(measured.values())
        notes.append("outside stages: the run's seconds less its stages' (the report has no outside_stages accounts)")
    ran_beside = rep.get("overlapped")
    if ran_beside:
        notes.append(f"overlap: {', '.join(ran_beside['stages'])} ran in the background "
                     f"({ran_beside['seconds']:.1f} s, the run waited {ran_beside['waited']:.1f} s of it): each "
                     f"beside its own plan row; the total is the plan's wall clock with them overlapped")
    wall_raw = plan_wall(cfg, raw, device, overlap=bool(ran_beside))
    wall_cal = plan_wall(cfg, cal, device, overlap=bool(ran_beside))
    for label, kind in (("train, all", "train-"), ("eval, all", "eval-")):
        sel = [n for n in names if n.startswith(kind)]
        rows.append((f"{label} {len(sel)}", sum(p_raw[n] or 0 for n in sel), sum(p_cal[n] or 0 for n in sel),
                     sum(measured[n] for n in sel)))
    outside = None if reused else outside
    rows.append(("outside stages", by_raw["reports"].seconds if "reports" in by_raw else None,
                 by_cal["reports"].seconds if "reports" in by_cal else None, outside))
    if accounts and "reports" in by_raw:
        for part, label in (("report_rewrites", "  report rewrites"), ("other", "  other outside")):
            rows.append((label, (by_raw["reports"].parts or {}).get(part), (by_cal["reports"].parts or {}).get(part),
                         None if reused else float(accounts[part])))
    rows.append(("total", wall_raw.seconds, wall_cal.seconds, None if reused else float(rep["seconds"])))
    factors = _factors(run_dir, raw, measured, names, outside, n_ret, notes)
    return RunCheck(run_dir, device, rows, factors, notes, cfg, cal, wall_cal)


def _recorded_device(run_dir: Path, log_text: str) -> str:
    """The device kind the run in ``run_dir`` ran on: its ``run.json``'s machine (the GPU's model, the CPU without
    one), else the first line of its ``run.log``."""
    path = run_dir / "run.json"
    machine = json.loads(path.read_text(encoding="utf-8")).get("machine") if path.is_file() else None
    if machine is not None:
        if not machine.get("gpu"):
            return "cpu"
        device = next((k for k, v in DEVICES.items() if k != "cpu" and v.lower() in machine["gpu"].lower()), None)
        if device is None:
            raise ValueError(f"{path}: the run ran on a {machine['gpu']}, which gdr plan has no figures for: name "
                             f"the device to plan it as (device=h200|h100|a100)")
        return device
    first = log_text.splitlines()[0].lower() if log_text else ""
    device = next((k for k, v in DEVICES.items() if k != "cpu" and v.lower() in first), None)
    if device is None:
        raise ValueError(f"{run_dir}: name the device the run ran on (device=h200|h100|a100|cpu): it has no run.json "
                         f"and its run.log does not say")
    return device


def _factors(run_dir: Path, raw: list[StagePlan], measured: dict[str, float], names: list[str],
             outside: float | None, n_ret: int, notes: list[str]) -> dict[str, float]:
    """Measured / predicted seconds of each plan stage (``raw``: the plan before any factors); training at the
    steps the retrievers took (``stages.json``'s ``global_step``, else the plan's central stop)."""
    by = {s.name: s for s in raw}

    def ratio(meas: float | None, pred: float | None) -> float | None:
        return None if not pred or meas is None else meas / pred

    out: dict[str, float | None] = {}
    for run_name, plan_names in RUN_GROUPS.items():
        if run_name in measured:
            f = ratio(measured[run_name], sum(by[p].seconds for p in plan_names if p in by))
            out.update({p: f for p in plan_names if p in by})
    idx = [n for n in names if n.startswith("index-")]
    if idx and "indexing" in by:
        out["indexing"] = ratio(sum(measured[n] for n in idx), by["indexing"].seconds)
    steps = _run_steps(run_dir)
    if "training" in by:
        tr = by["training"]
        at = tr.at_steps(float(np.mean(steps))) if steps else tr.seconds
        notes.append(f"training factor at the steps taken: mean {np.mean(steps):.0f} of {len(steps)} retrievers "
                     f"(stages.json global_step)" if steps else "training factor at the plan's central stop "
                     "(no stages.json with global_step)")
        out["training"] = ratio(sum(measured[n] for n in names if n.startswith("train-")), at)
    if "evaluation" in by:
        out["evaluation"] = ratio(sum(measured[n] for n in names if n.startswith("eval-")), by["evaluation"].seconds)
    if "reports" in by:
        out["reports"] = ratio(outside, by["reports"].seconds)
    return {k: round(v, 3) for k, v in out.items() if v is not None}


def _run_steps(run_dir: Path) -> list[int]:
    """Each retriever's ``global_step`` from the run's ``stages.json`` (empty if it has none)."""
    path = run_dir / "stages.json"
    if not path.is_file():
        return []
    recs = json.loads(path.read_text(encoding="utf-8"))
    return [int(r["info"]["global_step"]) for r in recs
            if str(r.get("folder", "")).startswith("train-") and "global_step" in (r.get("info") or {})]


def format_check(check: RunCheck) -> str:
    """The check as a table: stage, predicted before the factors, predicted, measured, predicted / measured."""
    def cell(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1f}"

    lines = [f"gdr plan --check {check.run} on {DEVICES[check.device]}:", *(f"  {n}" for n in check.notes),
             f"{'stage':<22} {'plan, no factors':>16} {'plan':>9} {'measured':>9} {'plan/measured':>14}"]
    for name, raw, cal, meas in check.rows:
        ratio = "n/a" if cal is None or meas is None or meas <= 0 else f"{cal / meas:.2f}"
        lines.append(f"{name:<22} {cell(raw):>16} {cell(cal):>9} {cell(meas):>9} {ratio:>14}")
    lines.append("factors (measured / plan without factors): "
                 + ", ".join(f"{k} {v:.2f}" for k, v in check.factors.items()))
    return "\n".join(lines)


def write_factors(check: RunCheck, folder: Path = GPU_RUNS) -> Path:
    """``<folder>/<run folder name>-factors.json``: the check's factors, read by the plan of the device since."""
    path = folder / f"{check.run.resolve().name}-factors.json"
    path.write_text(json.dumps({"device": DEVICES[check.device], "run": check.run.resolve().name,
                                "what": "measured / predicted seconds per plan stage, predicted before any factors",
                                "factors": check.factors}) + "\n", encoding="utf-8")
    return path
