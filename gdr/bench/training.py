"""Benchmark: retriever training throughput (examples/s, tokens/s, MFU) on synthetic data.

    python -m gdr.bench.training [--presets mini,small30m] [--batch auto] [--steps 30] [--warmup 10]

For each preset of ``conf/stage/train.yaml`` the real training path runs: ``RetrieverModule`` (fused AdamW
on CUDA, bf16-mixed on CUDA, gradient clipping) fed by ``RetrievalDataModule`` (pre-tokenised tensors)
under a Lightning ``Trainer``, on random ``--seq-len``-token inputs (every one full length) and random
docids (K = ``--K`` digits, depth ``--depth``). ``--warmup`` steps are run first (allocator, kernels,
``torch.compile``), then ``--steps`` steps are timed between two device synchronisations (fewer after
``--seconds`` of them, or when ``--deadline`` comes near); ``--profile`` then profiles 3 more steps if the
deadline leaves time for them. A preset does not start within :data:`MIN_PRESET_S` of the deadline.

``--pawa --consistency-weight 0.15`` trains the retriever ``+experiment=bbc`` trains (NCI's PAWA decoder, R-drop: two
forward passes a step).

FLOPs (``gdr.cost``): training = 3 x the forward pass, per forward pass a step; the forward pass counts the encoder's
matmuls over the ``seq_len`` input tokens, the decoder's over its L + 1 docid positions (cross-attention
keys/values over the input tokens), attention scores, and the K + 1 slot logits. MFU is reported where
the chip's peak is known (not on a CPU).

Bytes (:func:`gdr.cost.training_bytes_per_example`): the optimiser step's weight, gradient and AdamW-state
traffic, shared by the batch (activations not counted); with the FLOPs they give the roofline limit
(:func:`gdr.cost.roofline`) and ``fraction_of_limit`` beside MFU, and what one H200 would reach.

The LAST line printed is one JSON object: ``device``, ``batch`` (the first preset's), ``seq_len``, and per preset
``batch``, ``examples_per_s``, ``tokens_per_s`` (input tokens), ``mfu``, ``params``, ``seconds``, ``steps``, and the
roofline of one example: ``flops_per_unit``, ``bytes_per_unit``, ``limit_per_s``, ``fraction_of_limit``,
``h200_limit_per_s`` (see :func:`gdr.cost.roofline`); what decides the GPU rate, counted on any device in the step
after the timed ones: ``syncs_per_step`` (host syncs it would make on a GPU, :class:`gdr.bench.syncs.SyncCounter`;
``sync_events`` names the first five), ``h2d_copies_per_step`` (the batch's tensors and any upload inside the step)
and ``compiles`` (graphs torch.compile built); the memory of one retriever: ``memory_estimate_bytes`` (what the
batch rule plans), ``saved_bytes_per_step`` (what the counted step saved for its backward; None with ``--compile``),
``activations_estimate_vs_saved`` and, on CUDA, ``peak_bytes`` (the allocator's peak); ``pawa`` and
``forward_passes``. With ``--concurrent N``, ``concurrent`` holds per preset the
aggregate ``examples_per_s`` of the N slots, ``starts`` (processes spawned), ``spawn_to_first_step_s`` per slot and
each slot's counts; the same line, with ``"partial": true``, follows each
preset's warm-up (its ``warmup_s``) and every preset but the last.
"""
from __future__ import annotations

import argparse
import logging
import time
from dataclasses import fields, replace
from functools import partial
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils._pytree import tree_leaves

from gdr.bench.common import (
    SavedBytes,
    add_time_args,
    check_docid_space,
    emit,
    preset_config,
    profile_failed,
    profile_skipped,
    random_codes,
    roofline,
    seconds_left,
    start_profiler,
    write_table,
)
from gdr.bench.syncs import SyncCounter
from gdr.cost import (
    TRAIN_BYTES_PER_PARAM,
    device_name,
    mfu,
    param_count,
    train_flops_per_example,
    training_bytes_per_example,
)
from gdr.indexing.trie import build_trie
from gdr.rules import NON_NEGATIVE, POSITIVE, auto_or, option_type, seed
from gdr.training.concurrent import run_concurrently
from gdr.training.data import RetrievalDataModule, RetrievalExamples, TokenStore
from gdr.training.model import meta_param_count
from gdr.training.module import RetrieverModule
from gdr.training.options import CONSISTENCY_VIEWS, OptimOptions, consistency_view
from gdr.training.train import resolve_batch_size, resolve_fused, train_memory_per_example, trainer_precision

log = logging.getLogger(__name__)

__all__ = ["main", "preset_config"]

MIN_PRESET_S = 15  # a preset does not start with less than this before the deadline (load, warm-up, a few steps)


class _Timer(pl.Callback):
    """Wall time of steps ``warmup`` .. ``warmup + steps`` between device syncs (the warm-up apart: from the
    start of training to step ``warmup``); fewer timed steps when ``seconds`` have passed or ``deadline`` (a
    Unix time) comes near. With ``profile``, ``profile_steps`` more steps then run under torch.profiler, if
    the deadline leaves time for them."""

    def __init__(self, warmup: int, steps: int, device: torch.device, batch: int = 1, profile: str | None = None,
                 title: str = "", seconds: float | None = None, deadline: float | None = None,
                 profile_steps: int = 3, report=lambda figures: None, count_saved: bool = True):
        self.report, self.count_saved = report, count_saved
        self.warmup, self.n, self.device, self.batch = warmup, steps, device, batch
        self.profile, self.title = profile, title
        self.seconds, self.deadline, self.profile_steps = seconds, deadline, profile_steps
        self.t_start = self.t0 = self.t1 = self.first_step = None
        self.steps = 0
        self.prof = self.prof_t0 = self.prof_stop = self.summary = None
        self.counter: SyncCounter | None = None  # the step after the timed ones, counted (see on_train_batch_end)
        self.saved: SavedBytes | None = None  # and the bytes its forward saved for the backward
        self.counted: dict | None = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.time()

    def on_train_start(self, trainer, pl_module):
        self.t_start = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step
        if self.first_step is None:
            self.first_step = time.time()  # Unix time: compared with the spawn in another process
        if step == self.warmup and self.t0 is None:
            self._sync()
            self.t0 = time.perf_counter()
            self.report({"warmup_s": round(self.t0 - self.t_start, 3)})
        elif self.t0 is not None and self.t1 is None and step > self.warmup:
            per_step = (time.perf_counter() - self.t0) / (step - self.warmup)  # (not synced: an estimate)
            out_of_time = ((self.seconds is not None and time.perf_counter() - self.t0 >= self.seconds)
                           or self._left() < 2 * per_step + 5)
            if step < self.warmup + self.n and not out_of_time:
                return None
            self._stop(trainer)
            need = 3 * self.profile_steps * per_step + 10
            if self.profile and self._left() > need:

                self.prof_stop = step + self.profile_steps - 1  # the batch of that step is the last one
                try:
                    self.prof = start_profiler(self.device)
                    self.prof.__enter__()
                    self.prof_t0 = time.perf_counter()
                except Exception as e:  # noqa: BLE001 - the profile is extra; the figures still come back
                    self.prof, self.prof_stop = None, None
                    self.summary = profile_failed(e, self.profile, self.title)
            elif self.profile:

                self.summary = profile_skipped(self.profile, self.title, self._left(), need)
            if self.prof is None:  # this untimed step is counted (a profiler beside the counter would count itself)
                self.counter = SyncCounter(self.device).__enter__()
                self.saved = SavedBytes(pl_module).__enter__() if self.count_saved else None
                self.counted = {"batch_tensors": sum(isinstance(t, torch.Tensor) for t in tree_leaves(batch))}
        if self.t1 is not None and (self.prof_stop is None or step >= self.prof_stop):
            trainer.should_stop = True  # after this batch (a callback cannot skip it)
        return None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        """The counted step's host syncs (:class:`gdr.bench.syncs.SyncCounter`: on the CPU, those it would make on a
        GPU) and host-to-device copies: the batch's tensors (the accelerator's batch transfer) and the uploads inside
        the step."""
        if self.counter is None:
            return
        c, self.counter = self.counter, None
        c.__exit__(None, None, None)
        saved, self.saved = self.saved, None
        if saved is not None:
            saved.__exit__(None, None, None)
        self.counted = {"syncs_per_step": c.count, "h2d_copies_per_step": self.counted["batch_tensors"] + c.uploads,
                        "sync_events": [str(e) for e in c.events[:5]],
                        "saved_bytes_per_step": None if saved is None else saved.total}

    def _stop(self, trainer) -> None:
        self._sync()
        self.t1 = time.perf_counter()
        self.steps = trainer.global_step - self.warmup

    def on_train_end(self, trainer, pl_module):
        if self.t1 is None:
            self._stop(trainer)
        elif self.prof is not None:

            try:
                self._sync()
                seconds = time.perf_counter() - self.prof_t0
                self.prof.__exit__(None, None, None)
                n = trainer.global_step - self.warmup - self.steps
                self.summary = write_table(self.prof, seconds, n * self.batch, "example", self.device, self.profile,
                                           title=f"{self.title}: {n} training steps of {self.batch}")
            except Exception as e:  # noqa: BLE001
                self.summary = profile_failed(e, self.profile, self.title)


def bench_preset(name: str, device: torch.device, batch: int, steps: int, warmup: int, seq_len: int, K: int,
                 depth: int, n_docs: int, compile: bool, seed: int = 0, fused: str | bool = OptimOptions.fused,
                 precision: str | None = None, profile: str | None = None, profile_steps: int = 3,
                 seconds: float | None = None, deadline: float | None = None, report=lambda figures: None,
                 pawa: bool = False, consistency_weight: float = OptimOptions.consistency_weight,
                 consistency_view: str = OptimOptions.consistency_view) -> dict:
    """Train ``warmup + steps`` steps of preset ``name`` (fewer timed ones after ``seconds`` or near
    ``deadline``, see :class:`_Timer`); returns its figures. ``report(figures)`` gets the warm-up's seconds.
    ``pawa``, ``consistency_weight`` and ``consistency_view``: the retriever the BBC protocol trains (NCI's PAWA
    decoder, R-drop on NCI's corrupted view)."""
    cfg = replace(preset_config(name, K, depth), pawa=pawa)
    passes = OptimOptions(consistency_weight=consistency_weight).forward_passes
    rng = np.random.default_rng(seed)
    extra = (profile_steps if profile else 0) + 1  # and the step after the timed ones, counted (_Timer)
    n = batch * (steps + warmup + extra)  # one epoch: no epoch boundary inside the timed steps
    ids = rng.integers(1000, 20000, size=(n, seq_len), dtype=np.int32)
    store = TokenStore(ids.ravel(), np.arange(n + 1, dtype=np.int64) * seq_len)
    ex = RetrievalExamples(store, rng.integers(0, n_docs, size=n), TokenStore.concat([]), [])
    trie = build_trie(random_codes(n_docs, K, depth, seed), n_digits=K)
    cuda = device.type == "cuda"
    dm = RetrievalDataModule(ex, trie, pad_token_id=0, batch_size=batch, pin_memory=cuda, seed=seed)
    prec = trainer_precision(precision, "auto" if cuda else "cpu")
    module = RetrieverModule(cfg.to_dict(), warmup_steps=warmup, seed=seed, fused=resolve_fused(fused, cuda, prec),
                             consistency_weight=consistency_weight, consistency_view=consistency_view)
    if compile and cuda:
        module.model.compile()
    timer = _Timer(warmup, steps, device, batch, profile, title=f"training {name}", seconds=seconds,
                   deadline=deadline, profile_steps=profile_steps, report=report,
                   count_saved=not (compile and cuda))  # saved-tensor hooks inside a compiled graph: not counted
    trainer = pl.Trainer(
        accelerator="gpu" if cuda else "cpu", devices=[device.index or 0] if cuda else 1,
        precision=prec, max_steps=warmup + steps + extra, max_epochs=-1,
        gradient_clip_val=1.0, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[timer],
        log_every_n_steps=50,
    )
    graphs = _compiled_graphs()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    trainer.fit(module, datamodule=dm)
    compiles = _compiled_graphs() - graphs
    seconds = timer.t1 - timer.t0
    examples = timer.steps * batch
    fpe = passes * train_flops_per_example(module.model, seq_len)
    flops = fpe * examples
    util = mfu(flops, seconds, device)
    n_params = module.model.n_params()["total"]
    bpe = training_bytes_per_example(n_params, param_count(module.model), batch, str(prec).startswith("bf16"))
    roof = roofline(fpe, bpe, examples / seconds, device)
    clock = time.time() - time.perf_counter()  # the timed steps in Unix time: compared across processes
    return {"timed_from": clock + timer.t0, "timed_to": clock + timer.t1, "first_step_at": timer.first_step,
            "batch": batch, "examples_per_s": round(examples / seconds, 1),
            "tokens_per_s": round(examples * seq_len / seconds, 1),
            "mfu": None if util is None else round(util, 4), "params": module.model.n_params()["total"],
            "tflops_per_s": round(flops / seconds / 1e12, 3), "seconds": round(seconds, 3), "steps": timer.steps,
            "warmup_s": round(timer.t0 - timer.t_start, 3), "precision": prec,
            "fused": bool(trainer.optimizers[0].defaults.get("fused")),
            "launches_per_example": timer.summary and timer.summary["launches_per_unit"],
            "syncs_per_step": (timer.counted or {}).get("syncs_per_step"),
            "h2d_copies_per_step": (timer.counted or {}).get("h2d_copies_per_step"),
            "sync_events": (timer.counted or {}).get("sync_events"), "compiles": compiles,
            "pawa": pawa, "forward_passes": passes,
            **_memory(replace(cfg, max_query_len=seq_len), batch, passes, device, timer.counted), **roof}


def _memory(cfg, batch: int, passes: int, device: torch.device, counted: dict | None) -> dict:
    """The memory the batch rule plans for one retriever at ``batch`` (``memory_estimate_bytes``: weights, gradients,
    AdamW states and bf16 copies plus the activations of ``batch`` examples, :func:`gdr.training.train.
    train_batch_for_memory`'s sum), beside what the counted step's forward saved for the backward
    (``saved_bytes_per_step``, any device) and, on CUDA, the allocator's peak over the whole training
    (``peak_bytes``); ``activations_estimate_vs_saved``: the estimate's activations over the saved bytes (the rule
    is safe while it is >= 1)."""
    activations = batch * train_memory_per_example(cfg, passes)
    saved = (counted or {}).get("saved_bytes_per_step")
    return {"memory_estimate_bytes": int(TRAIN_BYTES_PER_PARAM * meta_param_count(cfg) + activations),
            "saved_bytes_per_step": saved,
            "activations_estimate_vs_saved": round(activations / saved, 3) if saved else None,
            "peak_bytes": int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None}


def _compiled_graphs() -> int:
    """The graphs torch.compile has compiled in this process so far (each a compile: seconds of the first steps)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _at_once(n: int, alone: dict, bench) -> dict:
    """``n`` copies of ``bench()`` (one preset's :func:`bench_preset`) at once, one process each
    (:func:`gdr.training.concurrent.run_concurrently`): the examples of all of them over the wall time from the first
    timed step to the last, and the MFU that is at the FLOPs of one example (against ``alone``, the same preset
    run by itself)."""
    spawned, t0 = time.time(), time.perf_counter()
    runs = run_concurrently([bench] * n, n)
    starts = min(n, len(runs))  # one spawned process per slot (gdr.training.concurrent)
    first = [round(r["first_step_at"] - spawned, 2) for r in runs]  # spawn, imports, device, data, model, 1st batch
    examples = sum(r["examples_per_s"] * r["seconds"] for r in runs)
    wall = max(r["timed_to"] for r in runs) - min(r["timed_from"] for r in runs)
    rate = examples / wall
    ratio = rate / alone["examples_per_s"]
    mfu = None if alone["mfu"] is None else round(alone["mfu"] * ratio, 4)
    each = ", ".join(f"{r['examples_per_s']:,.0f}" for r in runs)
    print(f"  {n} at once: {rate:,.0f} examples/s in all ({ratio:.2f}x one alone), MFU {mfu}; each {each} examples/s; "
          f"spawn to first step {', '.join(f'{s:.1f}' for s in first)} s; {starts} process starts, "
          f"{time.perf_counter() - t0:.1f} s from the first spawn to the last slot's end", flush=True)
    return {"examples_per_s": round(rate, 1), "vs_one": round(ratio, 3), "mfu": mfu, "wall_s": round(wall, 3),
            "starts": starts, "spawn_to_first_step_s": first,
            "syncs_per_step": [r["syncs_per_step"] for r in runs],
            "h2d_copies_per_step": [r["h2d_copies_per_step"] for r in runs],
            "compiles": sum(r["compiles"] for r in runs),
            "per_process_examples_per_s": [r["examples_per_s"] for r in runs]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gdr bench training", description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="mini,small30m", help="comma-separated presets (default mini,small30m)")
    ap.add_argument("--batch", type=option_type(auto_or(POSITIVE)), default="auto",
                    help="examples per step; auto = what fits on CUDA (<= 4096), 64 on the CPU")
    ap.add_argument("--steps", type=option_type(POSITIVE),
                    default=None, help="timed steps (default 50 on CUDA, 5 on the CPU)")
    ap.add_argument("--warmup", type=option_type(NON_NEGATIVE),
                    default=None, help="untimed steps first (default 10 on CUDA, 2 on the CPU)")
    ap.add_argument("--seq-len", type=option_type(POSITIVE), default=64, help="input tokens per example (default 64)")
    ap.add_argument("--K", type=option_type(POSITIVE), default=30)
    ap.add_argument("--depth", type=option_type(POSITIVE), default=4)
    ap.add_argument("--docs", type=option_type(POSITIVE),
                    default=10_000, help="random docids the targets are drawn from")
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the retriever (CUDA only)")
    ap.add_argument("--threads", type=option_type(POSITIVE), default=None, help="torch CPU threads")
    ap.add_argument("--concurrent", type=option_type(POSITIVE), default=1,
                    help="N > 1: then train N copies of each preset at once, one process each (train.concurrent), "
                         "and print their aggregate examples/s and MFU against the one alone")
    ap.add_argument("--seed", type=option_type(seed), default=0)
    ap.add_argument("--fused", default="auto", choices=["auto", "true", "false"],
                    help="fused AdamW (optim.fused); auto = on CUDA")
    ap.add_argument("--precision", default=None,
                    help="Lightning precision (default: bf16-mixed on CUDA, 32-true on CPU)")
    ap.add_argument("--profile", default=None,
                    help="write a torch.profiler table of 3 more steps here (per preset), if time is left")
    ap.add_argument("--pawa", action="store_true", help="NCI's PAWA decoder (train.model.pawa; +experiment=bbc's)")
    weight_rule = next(f for f in fields(OptimOptions) if f.name == "consistency_weight").metadata["rule"]
    ap.add_argument("--consistency-weight", type=option_type(weight_rule, float),  # the setting's rule: >= 0
                    default=OptimOptions.consistency_weight,
                    help="R-drop's weight (train.optim.consistency_weight; 0.15 in +experiment=bbc): > 0 makes two "
                         "forward passes a step")
    ap.add_argument("--consistency-view", default=OptimOptions.consistency_view, choices=CONSISTENCY_VIEWS,
                    help="R-drop's second view (train.optim.consistency_view; corrupted in +experiment=bbc)")
    add_time_args(ap)
    args = ap.parse_args(argv)
    if problem := consistency_view(args.consistency_view, {"optim": {"consistency_weight": args.consistency_weight}}):
        ap.error(f"--consistency-view: {args.consistency_view}: {problem}")  # the setting's rule
    check_docid_space(ap, args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("pytorch_lightning").setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gdr bench training: --device cuda but CUDA is not available on this machine")
    cuda = device.type == "cuda"
    if cuda:
        torch.set_float32_matmul_precision("high")

    acc = "auto" if cuda else "cpu"
    # auto: per preset, from the free memory (gdr.training.train.train_batch_for_memory); an int for all
    passes = OptimOptions(consistency_weight=args.consistency_weight).forward_passes
    batches = {p: resolve_batch_size(args.batch, acc, config=replace(preset_config(p, args.K, args.depth),
                                                                     max_query_len=args.seq_len, pawa=args.pawa),
                                     passes=passes)
               for p in args.presets.split(",") if p}
    batch = next(iter(batches.values()), None)
    steps = args.steps if args.steps is not None else (50 if cuda else 5)
    warmup = args.warmup if args.warmup is not None else (10 if cuda else 2)
    out: dict = {"device": device_name(device), "batch": batch, "seq_len": args.seq_len, "steps": steps,
                 "precision": trainer_precision(args.precision, "auto" if cuda else "cpu"),
                 "compile": bool(args.compile and cuda), "pawa": args.pawa,
                 "consistency_weight": args.consistency_weight, "consistency_view": args.consistency_view}
    fused = {"auto": "auto", "true": True, "false": False}[args.fused]
    presets = [p for p in args.presets.split(",") if p]
    for name in presets:
        prof = args.profile
        if prof and len(presets) > 1:
            prof = str(Path(prof).with_name(f"{Path(prof).stem}-{name}{Path(prof).suffix}"))
        if seconds_left(args) < MIN_PRESET_S:
            print(f"{name}: skipped, {seconds_left(args):.0f} s left before the deadline", flush=True)
            continue
        r = bench_preset(name, device, batches[name], steps, warmup, args.seq_len, args.K, args.depth, args.docs,
                         args.compile, args.seed, fused=fused, precision=args.precision, profile=prof,
                         seconds=args.seconds, deadline=args.deadline, pawa=args.pawa,
                         consistency_weight=args.consistency_weight, consistency_view=args.consistency_view,
                         report=lambda r, name=name: emit({**out, name: r, "partial": True}))
        print(f"{name}: {r['examples_per_s']:,.0f} examples/s, {r['tokens_per_s']:,.0f} tokens/s, "
              f"{r['tflops_per_s']} TFLOP/s, MFU {r['mfu']}, {r['params'] / 1e6:.1f}M parameters", flush=True)
        out[name] = r
        if args.concurrent > 1 and seconds_left(args) >= MIN_PRESET_S:
            out.setdefault("concurrent", {"n": args.concurrent})[name] = _at_once(
                args.concurrent, r, partial(bench_preset, name, device, batches[name], steps, warmup, args.seq_len,
                                            args.K, args.depth, args.docs, args.compile, args.seed, fused=fused,
                                            precision=args.precision, seconds=args.seconds, deadline=args.deadline,
                                            pawa=args.pawa, consistency_weight=args.consistency_weight,
                                            consistency_view=args.consistency_view))
        if name != presets[-1]:
            emit({**out, "partial": True})  # a step stopped at its limit keeps the presets it finished
    emit({**out, "partial": False})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
