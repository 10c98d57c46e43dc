"""``gdr plan``: each stage's predicted seconds and peak memory of a ``gdr run`` configuration, before anything loads.

A stage's seconds are its units of work (queries sampled, pairs scored, training examples, search queries) over the
rate the device allows (the roofline of :mod:`gdr.cost`: ``min(peak FLOP/s / FLOPs per unit, peak bytes/s / bytes
per unit)`` for models built on the meta device) times the fraction of that limit the same step reached in the
committed GPU runs (``reports/gpu-runs/*.json``: the highest fraction any of them reached on that device kind, the
file named), plus the cold part those runs measured (model load, compilation warm-up). A device kind without a
committed figure of its own takes the H200's fractions (a fraction of the limit carries over better than a rate),
and says so. On a CPU the fractions are :data:`CPU_FRACTIONS` of :data:`CPU_PEAKS` (scoring's measured on a 2-core
CPU, the other steps taken to reach the same). Stages that do no model math (GC clustering and indexing, BM25) are
estimated from their data sizes at the rates in :data:`HOST_RATES`. Every figure says what it rests on (``basis``),
and an assumption says it is one. Sampling, doc-query generation and evaluation run in one process; scoring and
training spread over ``gpus``.

Training is planned as the run trains: ``train.concurrent`` retrievers at once (``auto`` by the run's memory rule
at the device's memory), their aggregate rate that many times one retriever's, up to the limit (assumed, not
measured); under ``trainer.length_buckets`` each example at the mean padded width :data:`BUCKETED_PADDING` gives;
from ``max_epochs`` (``seconds``, the first total) down to the earliest stop early stopping allows (``low``, the
second total). A bundled GGUF LM loads by the fast conversion (:data:`LM_LOAD_S`).
"""
from __future__ import annotations

import copy
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from gdr import cost
from gdr.data.titles import TITLE_FRACTIONS
from gdr.models import BUNDLED
from gdr.stages.train import model_config_from
from training.concurrent import concurrent_for_memory
from training.model import meta_retriever
from training.stopping import effective_min_steps, patience_checks, steps_per_check
from training.train import cuda_batch_size

log = logging.getLogger(__name__)

__all__ = ["StagePlan", "plan_run", "predict", "predict_stages", "run_device", "measured_figures", "format_plan",
           "DEVICES", "MAX_GPUS", "gpus_problem"]

REPO = Path(__file__).resolve().parents[1]
GPU_RUNS = REPO / "reports" / "gpu-runs"
DEVICES = {"h200": "H200", "h100": "H100", "a100": "A100", "cpu": "cpu"}
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
# A 2-core CPU shared with other jobs: the peaks gdr.bench.common.cpu_peaks measured (timed matmul and copy), and
# the fraction of the limit scoring reached there (reports/benchmarks.md: SmolLM2 4.82 pairs/s at 64-token documents,
# J = 64: 0.28-0.52 of the limit for 8-16-token queries); the other steps are taken to reach the same
CPU_PEAKS = cost.DevicePeaks("cpu", 4.4e10, 3.9e9)
CPU_FRACTIONS = {"sampling": 0.3, "scoring": 0.3, "training": 0.3, "search": 0.3}
CPU_COLD_S = {"lm_load": 5.0, "sampling": 1.0, "scoring": 1.0, "training": 2.0, "search": 1.0}
# Host work that is not model math: GC indexing took 147 s for the 138,457 x 4,096 entries of MS MARCO Lite's P
# (reports/benchmarks.md: 2-core CPU, root n_init 5, inner 1) = 3.9e6 entries/s; BM25's rate is assumed
HOST_RATES = {"cluster_entries_per_s": 3.9e6, "bm25_docs_per_s": 5.0e3}
# Padded tokens per training example without and with trainer.length_buckets (reports/training-speed.md: 40.1 vs
# 5.41 on a BBC-like mix of 77% short queries, measured on the CPU: a count of tokens, not a speed)
BUCKETED_PADDING = 40.1 / 5.41
# The fast GGUF conversion's cold start (reports/lm-cold-start.md: 8.0 CPU s, 4.0 of them imports, measured on the
# 2-core development CPU; the GPU machine's CPU is not measured)
LM_LOAD_S = 8.0


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

    @property
    def seconds_low(self) -> float:
        return self.seconds if self.low is None else self.low


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


class _Rates:
    """The device's peaks and, per step, the fraction of the limit and the cold seconds to plan with."""

    def __init__(self, device: str, folder: Path = GPU_RUNS):
        self.device = device
        if device == "cpu":
            self.peaks, self.figures, self.note, self.points = CPU_PEAKS, {}, "", []
            return
        self.peaks = cost.device_peaks(DEVICES[device])
        kind, self.note = device, ""
        if not any(k.endswith("fraction_of_limit") for k in measured_figures(device, folder)):
            kind, self.note = "h200", f" (H200 figures: none for {device})"
        self.figures = measured_figures(kind, folder)
        self.points = _training_points(kind, folder)

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


def _sampling(name: str, lm, n_queries: int, new_tokens: int, doc_tokens: int, rates: _Rates,
              batch: int = 1024) -> StagePlan:
    """Sampling ``n_queries`` queries (one process: sampling does not spread over GPUs)."""
    prompt = doc_tokens + PROMPT_TOKENS
    stats = _query_stats(prompt, new_tokens)
    flops = cost.sampling_flops(lm, stats)
    nbytes = cost.sampling_bytes(lm, stats, decode_steps=new_tokens / batch, prefill_passes=1 / batch,
                                 element_size=2)
    frac, src = rates.fraction("sampling")
    rate = frac * rates.limit(flops, nbytes)
    warm = rates.cold("sampling", "sampling_warmup_s")
    peak = cost.weight_bytes(lm, 2) + batch * (prompt + new_tokens) * cost.kv_bytes_per_position(lm.config, 2)
    return StagePlan(name, warm + n_queries / rate, peak,
                     f"{n_queries:,} queries at {_rate(rate)}/s ({frac:.1%} of the limit, {src}) "
                     f"+ warm-up {warm:.0f} s")


def _scoring(lm, n_docs: int, n_queries: int, query_tokens: int, doc_tokens: int, rates: _Rates,
             gpus: int) -> StagePlan:
    """Scoring every (document, query) pair, the documents spread over the GPUs (``score.processes``)."""
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
    peak = cost.weight_bytes(lm, 2) + batch * per_doc + tile
    return StagePlan("scoring", warm + pairs / gpus / rate, peak,
                     f"{pairs:,} pairs at {_rate(rate)}/s ({frac:.1%} of the limit, {src}) + warm-up {warm:.0f} s"
                     + ("" if rates.device == "cpu" else " (measured; fewer graphs compile with the fixed shape "
                        "buckets, not remeasured)"))


def _train_and_search(cfg, n_docs: int, n_train: int, n_test: int, rates: _Rates, gpus: int) -> list[StagePlan]:
    """Training of every (indexer, seed) retriever (spread over the GPUs) and their search of the test split (one
    process)."""
    t = cfg.train
    K = int(cfg.index.n_clusters)
    depth = 1 + max(1, math.ceil(math.log(max(n_docs / max(int(cfg.index.leaf_size), 1), 1.0)) / math.log(K)))
    model = meta_retriever(model_config_from({**t.model, "n_digits": K, "max_code_len": depth}, dict(t.model_presets)))
    rc = model.config  # with the encoder's HF config filled in
    n_ret = len(cfg.indexers) * len(cfg.seeds) * _n_folds(cfg)
    ex = t.examples
    per_epoch = (n_train * bool(ex.use_real) + n_docs * int(cfg.doc_queries.per_doc) * bool(ex.use_generated)
                 + n_docs * (bool(ex.doc_first) + int(ex.doc_windows or 0)))
    train = _training(t, model, n_ret, per_epoch, rates, gpus)
    beam = int(cfg.evaluate.beam)
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
                       f"{queries:,} test queries at beam {beam}: {_rate(rate)}/s ({frac:.1%} of the limit, {src}) + "
                       f"load {load:.0f} s + warm-up {warm:.0f} s per retriever")
    return [train, search]


def _training(t, model, n_ret: int, per_epoch: int, rates: _Rates, gpus: int) -> StagePlan:
    """Training ``n_ret`` retrievers of ``per_epoch`` examples an epoch: ``train.concurrent`` at once (``auto`` as
    the run resolves it for the device's memory), each example at its padded width (:data:`BUCKETED_PADDING`
    under ``length_buckets``), for ``max_epochs`` (``seconds``) down to the earliest stop the early-stopping rule
    allows (``low``)."""
    rc = model.config
    batch = 64 if rates.device == "cpu" else _train_batch(t.trainer.batch_size, rc, rates, per_epoch)
    params = sum(p.numel() for p in model.parameters())
    passes = 2 if float(t.optim.get("consistency_weight") or 0) > 0 else 1  # R-drop: two forward passes
    buckets = bool(t.trainer.get("length_buckets"))
    width = rc.max_query_len / BUCKETED_PADDING if buckets else rc.max_query_len
    flops = passes * cost.train_flops_per_example(model, width)
    nbytes = cost.training_bytes_per_example(params, cost.param_count(model), batch, rates.device != "cpu")
    frac, src = rates.training_fraction(batch)
    concurrent = _concurrent(t.get("concurrent") or 1, rc, batch, rates, n_ret, gpus)
    agg = min(concurrent * frac, 1.0)
    limit = rates.limit(flops, nbytes)
    rate = agg * limit
    steps, low_steps, stop = _train_steps(t.trainer, per_epoch, batch)
    warm = rates.cold("training", "training_small30m_warmup_s") * math.ceil(n_ret / concurrent)
    mem = concurrent * (batch * cost.train_memory_per_example(
        cost.dims(rc.encoder_hf_config), cost.dims(rc), rc.max_query_len, rc.max_code_len, rc.n_digits)
        + cost.TRAIN_BYTES_PER_PARAM * params)
    seconds = warm + n_ret * steps * batch / gpus / rate
    low = warm + n_ret * low_steps * batch / gpus / rate
    full = rates.limit(passes * cost.train_flops_per_example(model, rc.max_query_len), nbytes)
    width_note = (f"length buckets: padded width {rc.max_query_len}/{BUCKETED_PADDING:.1f} = {width:.1f} tokens "
                  f"(reports/training-speed.md), a limit {limit / full:.1f}x the full width's; assumed: the "
                  f"measured fraction of the limit holds at that width" if buckets
                  else f"padded to {rc.max_query_len} tokens")
    together = (f"{concurrent} at once{' (auto: what the memory holds)' if str(t.get('concurrent')) == 'auto' else ''}"
                + (f", {concurrent} x the single rate up to the limit: assumed: concurrent runs overlap their "
                   f"host-bound steps; not measured yet" if concurrent > 1 else ""))
    return StagePlan("training", seconds, mem,
                     f"{n_ret} retrievers x {steps:,} steps ({t.trainer.max_epochs} epochs, the cap) down to "
                     f"{low_steps:,} ({stop}) x batch {batch}{', two passes each' if passes == 2 else ''}; "
                     f"{width_note}; {together}: {_rate(rate)} examples/s ({agg:.1%} of the limit; one: {frac:.1%}, "
                     f"{src}) + warm-up {warm:.0f} s", low=low)


def _concurrent(setting, rc, batch: int, rates: _Rates, n_ret: int, gpus: int) -> int:
    """``train.concurrent`` for ``n_ret`` retrievers, as :func:`gdr.stages.train.retrievers_at_once` resolves it: 1
    where each retriever trains data-parallel over several ``gpus``; a number is kept (at most ``n_ret``); ``auto``
    is 1 on the CPU and on a GPU what :func:`training.concurrent.concurrent_for_memory` fits in its memory."""
    if gpus > 1:
        return 1
    if str(setting) != "auto":
        return max(1, min(int(setting), n_ret))
    if rates.device == "cpu":
        return 1
    return concurrent_for_memory(rc, batch, rates.peaks.memory or 16e9, n_ret)


def _train_steps(trainer, per_epoch: int, batch: int) -> tuple[int, int, str]:
    """(steps at the cap, steps at the earliest stop, what the earliest stop rests on) of one retriever: the cap is
    ``max_epochs`` (or ``max_steps``); the earliest stop is the first validation past both the floor
    (:func:`training.stopping.effective_min_steps`) and the patience (``patience_steps`` turned into validations,
    else ``patience`` validations) after the first validation (the best score at the first check), as
    training.train sets up its early stopping: no run of these settings stops sooner."""
    epoch_steps = math.ceil(per_epoch / batch)
    max_steps = int(trainer.get("max_steps") or -1)
    cap = epoch_steps * int(trainer.max_epochs)
    cap = min(cap, max_steps) if max_steps > 0 else cap
    check = steps_per_check(per_epoch, batch, trainer.get("check_val_every_n_epoch"),
                            trainer.get("val_check_interval"))
    patience = trainer.get("patience_steps")
    checks = patience_checks(int(patience), check) if patience else int(trainer.get("patience") or 0)
    if checks <= 0:
        return cap, cap, "no early stopping: the cap"
    floor = effective_min_steps(int(trainer.get("min_steps") or 0), per_epoch, batch, int(trainer.max_epochs),
                                max_steps)
    first = max(1 + checks, math.ceil(floor / check))
    return cap, min(cap, math.ceil(first * check)), (f"earliest stop: min_steps {floor}, patience {checks} "
                                                     f"validations, one every {check:g} steps")


def _train_batch(batch_size, rc, rates: _Rates, per_epoch: int) -> int:
    """``trainer.batch_size``; ``auto`` as training.train resolves it on a device of this memory."""
    if batch_size != "auto":
        return int(batch_size)
    return cuda_batch_size(rc, rates.peaks.memory or 16e9, per_epoch)


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
        return n_docs, int(fr[0] * n_docs), int(fr[2] * n_docs)
    scale = n_docs / CORPUS_DOCS.get(name, n_docs)
    return n_docs, int(TRAIN_QUERIES.get(name, 0) * scale), int(TEST_QUERIES.get(name, 1000) * scale)


def plan_run(cfg, device: str = "h200", gpus: int = 1, folder: Path = GPU_RUNS) -> list[StagePlan]:
    """Each stage of ``gdr run`` with the composed config ``cfg`` on ``gpus`` devices of kind ``device``."""
    if device not in DEVICES:
        raise ValueError(f"device={device!r}: use {' | '.join(DEVICES)}")
    rates = _Rates(device, folder)
    n_docs, n_train, n_test = _sizes(cfg)
    lm = _meta_lm(str(cfg.model.name))
    doc_tokens, J = int(cfg.model.max_doc_tokens), int(cfg.sample.n_queries)
    stages = [_lm_load(str(cfg.model.name), lm, rates),
              _sampling("sampling", lm, J, int(cfg.sample.max_new_tokens), doc_tokens, rates),
              _scoring(lm, n_docs, J, int(cfg.sample.max_new_tokens), doc_tokens, rates, gpus)]
    passes = sum(1 for i in cfg.indexers if i == "gc") + (int(cfg.cluster.get("repeats", 1))
                                                          if cfg.cluster.enabled and _labelled(cfg) else 0)
    others = [i for i in cfg.indexers if i in ("hkmi", "bmi")]
    stages.append(StagePlan("clustering_indexing", _clustering_seconds(n_docs, J, passes), None,
                            f"{passes} pass(es) over the {n_docs * J:,} P entries at "
                            f"{HOST_RATES['cluster_entries_per_s']:.2g}/s (GC indexing measured on a 2-core CPU)"
                            + (f"; {', '.join(others)} indexing not modelled (no measurement)" if others else "")))
    per_doc = int(cfg.doc_queries.per_doc)
    if per_doc:
        stages.append(_sampling("doc_queries", lm, n_docs * per_doc, int(cfg.doc_queries.max_new_tokens),
                                doc_tokens, rates))
    stages += _train_and_search(cfg, n_docs, n_train, n_test, rates, gpus)
    if lm.config.is_encoder_decoder and device != "cpu":  # the committed LM figures are SmolLM2's
        for st in stages:
            if st.name in ("lm_load", "sampling", "scoring", "doc_queries"):
                st.basis += "; measured on SmolLM2 (no seq2seq LM figure committed)"
    if cfg.get("bm25", True):
        stages.append(StagePlan("bm25", n_docs / HOST_RATES["bm25_docs_per_s"], None,
                                f"{n_docs:,} documents indexed at {HOST_RATES['bm25_docs_per_s']:.0e}/s "
                                "(assumed, not measured)"))
    return stages


def _clustering_seconds(n_docs: int, n_queries: int, passes: int) -> float:
    """Host seconds of ``passes`` clusterings (GC indexing, flat clustering) over a P of ``n_docs`` x ``n_queries``."""
    return n_docs * n_queries * passes / HOST_RATES["cluster_entries_per_s"]


def _lm_load(name: str, lm, rates: _Rates) -> StagePlan:
    """The LM's cold load: a bundled GGUF LM by the fast conversion (:data:`LM_LOAD_S`), another by the cold load
    the committed runs measured."""
    measured = rates.cold("lm_load", "sampling_load_s")
    src = "CPU default" if rates.device == "cpu" else rates.figures.get("sampling_load_s", (0, "none"))[1]
    if rates.device == "cpu" or name not in BUNDLED:
        return StagePlan("lm_load", measured, cost.weight_bytes(lm, 4), f"the cold load a benchmark measured ({src})")
    return StagePlan("lm_load", LM_LOAD_S, cost.weight_bytes(lm, 4),
                     f"the fast GGUF conversion: {LM_LOAD_S:.0f} CPU s measured on the 2-core development CPU "
                     f"(reports/lm-cold-start.md), not on the GPU machine's; its cold load before it: "
                     f"{measured:.1f} s ({src})")


def _labelled(cfg) -> bool:
    """Whether the corpus has class labels (flat clustering is evaluated only then)."""
    return str(cfg.data.name) in ("bbc", "reuters", "r2", "r5")


def predict(cfg, device: str = "h200", gpus: int = 1) -> dict[str, float]:
    """Predicted seconds per stage (:func:`plan_run`), for a report to set beside the measured ones."""
    return {s.name: round(s.seconds, 1) for s in plan_run(cfg, device, gpus)}


def run_device(cfg) -> tuple[str | None, int]:
    """(the plan's device kind a run of ``cfg`` runs on here: ``cpu``, or the GPU's model among :data:`DEVICES`,
    None for a GPU without figures; the number of GPUs)."""
    device = str(cfg.get("device") or "auto")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return "cpu", 1
    name = torch.cuda.get_device_name(0).lower()
    return next((k for k in DEVICES if k != "cpu" and k in name), None), torch.cuda.device_count()


def predict_stages(cfg, names: list[str], n_docs: int) -> dict[str, float | None]:
    """Predicted seconds of the ``gdr run`` stages ``names`` (``score``, ``cluster``, ``doc-queries``,
    ``index-<indexer>``, ``bm25``, ``train-<indexer>-s<seed>``, ``eval-<indexer>-s<seed>``) of ``cfg`` over
    ``n_docs`` documents on this machine (:func:`run_device`), from :func:`plan_run` (configs only, no model
    loaded): the LM's load, sampling and scoring make ``score``; training and evaluation are shared evenly by the
    retrievers. None for a stage the plan does not model (indexers other than GC), and for every stage where the
    plan cannot be made (a model without a local config, a GPU without figures), said in the log: a report never
    fails for want of a prediction."""
    device, gpus = run_device(cfg)
    try:
        if device is None:
            raise ValueError(f"no figures for {torch.cuda.get_device_name(0)}")
        sized = copy.deepcopy(cfg)
        sized.data.n_docs = int(n_docs)
        plan = {s.name: s.seconds for s in plan_run(sized, device, gpus)}
    except Exception as e:  # noqa: BLE001  (any reason the plan cannot be made leaves the predictions n/a)
        log.info("report: no predicted seconds (%s: %s)", type(e).__name__, e)
        return {name: None for name in names}
    n_ret = len(cfg.indexers) * len(cfg.seeds) * _n_folds(cfg)
    J = int(cfg.sample.n_queries)
    fixed = {"score": plan["lm_load"] + plan["sampling"] + plan["scoring"], "doc-queries": plan.get("doc_queries"),
             "bm25": plan.get("bm25"), "index-gc": _clustering_seconds(n_docs, J, 1),
             "cluster": _clustering_seconds(n_docs, J, int(cfg.cluster.get("repeats", 1)))}
    per_retriever = {"train": plan["training"] / n_ret, "eval": plan["evaluation"] / n_ret}
    out = {}
    for name in names:
        seconds = fixed.get(name, per_retriever.get(name.split("-", 1)[0]))
        out[name] = None if seconds is None else round(seconds, 1)
    return out


def format_plan(stages: list[StagePlan], device: str, gpus: int) -> str:
    """The plan as a table: stage, seconds, peak memory, basis; the total at the epoch caps, then at the earliest
    early stops."""
    lines = [f"gdr plan on {gpus} x {DEVICES[device]}:", f"{'stage':<20} {'seconds':>9} {'peak GB':>8}  basis"]
    for s in stages:
        mem = "-" if s.peak_bytes is None else f"{s.peak_bytes / 1e9:.1f}"
        lines.append(f"{s.name:<20} {s.seconds:>9.1f} {mem:>8}  {s.basis}")
    lines.append(f"{'total':<20} {sum(s.seconds for s in stages):>9.1f}  every retriever to its epoch cap")
    lines.append(f"{'total, early stop':<20} {sum(s.seconds_low for s in stages):>9.1f}  every retriever stopped at "
                 f"the earliest its early stopping allows")
    return "\n".join(lines)
