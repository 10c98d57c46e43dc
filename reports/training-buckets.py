"""Length-bucketed training batches on the CPU, with and without, side by side in one run (reports/training-buckets.md).

    PYTHONPATH=. python reports/training-buckets.py --docs 300 --epochs 8 --preset mini --seeds 0

A slice of BBC News (``--docs`` articles, titles dropped from the text) and the bbc experiment's title split
(conf/experiment/bbc.yaml): the training titles, 3 windows of each article (``doc_first`` + 2 random ones) and,
standing in for the 10 generated queries per article (no LM runs here), 10 random 4-10-word spans of each article;
so, as in the BBC run, most examples are short queries beside 64-token windows. Random 3-digit docids (K = 10).
The trainer holds out 30% of the training titles as its dev split and tops it up to 100 queries with held-out spans
(one per article, ``train.examples.dev_min``). For each seed, the same retriever is trained
twice through ``gdr.training.train.train`` (``trainer.length_buckets`` false, then true): examples/s over the training
batches (validation left out), padded tokens per example (counted on one epoch of the data module's batches), and
the best dev R@1 and the step it was reached at. The last line printed is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch

from gdr.bench.common import random_codes
from gdr.data import load_corpus, load_title_queries
from gdr.indexing.trie import build_trie
from gdr.stages.settings import TrainSettings
from gdr.stages.train import model_config_from
from gdr.training.data import RetrievalDataModule, build_examples
from gdr.training.model import load_tokenizer
from gdr.training.train import ExampleOptions, OptimOptions, TrainerOptions, train

FRACTIONS = (0.5, 0.05, 0.45)  # conf/experiment/bbc.yaml


class _BatchClock(pl.Callback):
    """Seconds spent in training batches (forward, backward, optimiser step), validation left out."""

    def __init__(self):
        self.seconds, self.examples, self._t = 0.0, 0, 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seconds += time.perf_counter() - self._t
        self.examples += len(batch["input_ids"])


def spans(texts: list[str], per_doc: int, seed: int) -> tuple[list[str], np.ndarray]:
    """``per_doc`` random 4-10-word spans of each text (stand-ins for generated queries) and their documents."""
    rng = np.random.default_rng(seed)
    out, docs = [], []
    for i, text in enumerate(texts):
        words = text.split()
        n = rng.integers(4, 11, per_doc)
        start = rng.integers(0, np.maximum(len(words) - n, 0) + 1)
        out += [" ".join(words[s:s + k]) for s, k in zip(start, n)]
        docs += [i] * per_doc
    return out, np.asarray(docs)


def padded_per_example(tokenizer, inputs: dict, examples: ExampleOptions, max_query_len: int, trie, batch: int,
                       buckets: bool, seed: int) -> tuple[float, float]:
    """(pad positions, input positions: real tokens plus pad) per training example over one epoch of the data
    module's batches. The second is the width the encoder computes on."""
    ex = build_examples(tokenizer, max_query_len=max_query_len, seed=seed, **inputs, **asdict(examples))
    dm = RetrievalDataModule(ex, trie, pad_token_id=tokenizer.pad_token_id or 0, batch_size=batch, seed=seed,
                             length_buckets=buckets)
    masks = [b["attention_mask"] for b in dm.train_dataloader()]
    pad = sum(int((m == 0).sum()) for m in masks)
    width = sum(m.numel() for m in masks)
    return pad / len(ex.train), width / len(ex.train)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--widths", default="", help="comma-separated batch sizes: print only the input positions per "
                    "example (real plus pad) at each, with and without buckets; no training")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    corpus = load_corpus("bbc", n_docs=args.docs, drop_title=True)
    ids = set(corpus.doc_ids)
    titles = load_title_queries("bbc", "train", fractions=FRACTIONS)
    keep = [i for i, rel in enumerate(titles.relevant) if rel[0] in ids]
    pos = {d: i for i, d in enumerate(corpus.doc_ids)}
    gen_q, gen_d = spans(corpus.model_inputs(), 10, seed=1)
    inputs = {"n_docs": len(corpus), "doc_texts": corpus.model_inputs(),
              "train_queries": [titles.texts[i] for i in keep],
              "train_rel": [[pos[titles.relevant[i][0]]] for i in keep], "gen_queries": gen_q, "gen_docs": gen_d}
    s = TrainSettings()
    config = model_config_from({**s.model, "size": args.preset}, s.model_presets)
    codes = random_codes(len(corpus), 10, 3, seed=0)
    examples = ExampleOptions(dev_fraction=0.3, dev_min=100, doc_windows=2, window=64)
    tokenizer = load_tokenizer(config.tokenizer_name)
    trie = build_trie(codes, n_digits=10)
    if args.widths:
        rows = [{"batch": b, "length_buckets": buckets, **dict(zip(("pad_per_example", "tokens_per_example"), (
                    round(v, 2) for v in padded_per_example(tokenizer, inputs, examples, config.max_query_len, trie, b,
                                                            buckets, 0))))}
                for b in (int(x) for x in args.widths.split(",")) for buckets in (False, True)]
        for row in rows:
            print(row, flush=True)
        print(json.dumps({"docs": len(corpus), "max_query_len": config.max_query_len, "widths": rows}))
        return
    out: dict = {"docs": len(corpus), "preset": args.preset, "epochs": args.epochs, "batch": args.batch,
                 "threads": args.threads, "titles": len(keep), "runs": []}
    for seed in [int(x) for x in args.seeds.split(",")]:
        for buckets in (False, True):
            clock = _BatchClock()
            with tempfile.TemporaryDirectory() as tmp:
                res = train(Path(tmp) / "run", config, corpus.doc_ids, codes, **{k: v for k, v in inputs.items()
                                                                                if k != "n_docs"},
                            examples=examples, optim=OptimOptions(warmup_steps=100), seed=seed, callbacks=[clock],
                            trainer_opts=TrainerOptions(max_epochs=args.epochs, batch_size=args.batch, patience=0,
                                                        enable_progress_bar=False, tensorboard=False, resume=False,
                                                        val_beam=10, length_buckets=buckets))
                best_step = Path(res.best_checkpoint).stem.split("-")[-1] if res.best_checkpoint else None
            row = {"seed": seed, "length_buckets": buckets, "examples_per_s": round(clock.examples / clock.seconds, 1),
                   "padded_tokens_per_example": round(padded_per_example(
                       tokenizer, inputs, examples, config.max_query_len, trie, args.batch, buckets, seed)[0], 2),
                   "train_examples": res.counts["train_examples"], "dev_queries": res.counts["dev_queries"],
                   "dev_recall_at_1": res.best_val_recall1, "best_step": best_step, "steps": res.global_step}
            print(row, flush=True)
            out["runs"].append(row)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
