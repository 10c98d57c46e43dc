"""The key of every stage of ``gdr run`` for every ``conf/experiment/*.yaml`` (and a few overrides that reach the
branches the experiments leave out), computed from the stage specs of :mod:`gdr.pipeline` without running them.

Upstream stages are stand-in records with fixed keys, the corpus a stand-in with labels, the query splits empty,
the digests of model files a hash of the model's name and the machine a CPU with one thread, so the keys depend on
the settings and the code that turns them into stage inputs alone. ``tests/test_stage_keys.py`` compares them
with ``tests/fixtures/stage_keys.json``; a change of settings handling that changes no result leaves every key as
it was.

    PYTHONPATH=$PWD python -m tests.stage_keys            # print the keys as JSON
    PYTHONPATH=$PWD python -m tests.stage_keys --write    # rewrite the fixture (only for a key change you intend)
"""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from gdr import device, pipeline
from gdr.config import conf_dir, load_config
from gdr.formats import stage_key
from gdr.stages import train as train_stage

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "stage_keys.json"
EXPERIMENTS = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))
# overrides that take the branches the experiments do not: a fine-tuned generator, folds, J columns of P,
# a batch size given as a number, BMI on generated queries, the cluster stage's variants
VARIANTS = {
    "demo": [["qg.enabled=true", "doc_queries.per_doc=2", "train.trainer.batch_size=32", "index.gc.n_queries=8"],
             ["queries.folds=3", "train.examples.use_generated=false", "cluster.gc.alpha=auto"],
             ["indexers=[gc,hkmi,bmi,random,atomic]", "doc_queries.per_doc=3", "index.kmeans.embedding=tfidf-svd"]],
}
def _digest(name) -> str:
    return f"digest-of:{name}"


def _record(name: str, key: str):
    return pipeline.StageRecord(name, Path(f"/stand-in/{name}-{key}"), key, 0.0, True)


class _Corpus:
    name = "stand-in"
    labels = ["a", "b", "a"]
    doc_ids = ["d1", "d2", "d3"]

    def __len__(self):
        return 3


class _Pairs:
    """Stand-in (document, query) pairs of the qg stage."""

    doc_ids = ["d1", "d2"]
    queries = ["q one", "q two"]
    docs = ["text one", "text two"]

    def __len__(self):
        return 2


def _context(cfg):
    """A :class:`gdr.pipeline.RunContext` over stand-ins (see the module's doc)."""
    splits = lambda section: None  # noqa: E731 - no real queries: each split keys by its name alone
    sig = {"doc_ids": "ids", "texts": "texts", "n_docs": 3, "bodies": "bodies", "titles": None, "labels": "labels"}
    test_q = pipeline.queries_section(cfg, cfg.queries.test_split)
    queries_sig = {s: pipeline.queries_signature(None, s) for s in (cfg.queries.train_split, cfg.queries.test_split)}
    args = dict(cfg=cfg, corpus=_Corpus(), pipe=SimpleNamespace(root=Path("/stand-in")), corpus_sig=sig,
                lm_spec=pipeline.lm_settings(cfg), test_q=test_q, t_start=0.0, splits=splits, argv=(),
                queries_sig=queries_sig)
    params = inspect.signature(pipeline.RunContext).parameters
    if "settings" in params:  # the run's settings built once at the door
        args["settings"] = pipeline.run_settings(cfg)
    return pipeline.RunContext(**args)


def stage_keys(cfg) -> dict[str, str]:
    """Stage name -> its key, for the composed ``gdr run`` config ``cfg``."""
    run = _context(cfg)
    out: dict[str, str] = {}

    def note(spec, name=None):
        if spec is not None:
            out[name or spec.name] = stage_key(json.loads(json.dumps(spec.inputs, default=str)))
        return spec

    # the score stage of the base model (qg off, or compare_two_shot), then with the fine-tuned generator
    run.score = _record("score", "S0") if note(pipeline.score_spec(run), "score(base)") else None
    note(pipeline.doc_queries_spec(run), "doc-queries(base)")
    if cfg.get("qg") is not None and cfg.qg.enabled:
        note(pipeline.qg_spec(run))
        run.qg = _record("qg", "Q0")
        run.score = _record("score", "S1") if note(pipeline.score_spec(run)) else None
    note(pipeline.cluster_spec(run))
    run.doc_queries = _record("doc-queries", "D0") if note(pipeline.doc_queries_spec(run)) else None
    for method, seed in pipeline.run_indexes(cfg):  # index_seed=retriever: one a seed
        name = note(pipeline.index_spec(run, method, seed)).name
        run.add_index(method, seed, _record(name, f"I{method}" if seed is None else f"I{method}-s{seed}"))
    note(pipeline.bm25_spec(run))
    batches = [None] + ([256] if cfg.train.trainer.batch_size == "auto" else [])
    for batch in batches:  # the batch as given, and `auto` as a run resolves it
        run.train_batch = batch
        for ms in pipeline.retriever_order(run):
            spec = pipeline.train_spec(run, *ms)
            note(spec, spec.name if batch is None else f"{spec.name}@batch{batch}")
            if batch is None:  # an evaluation is keyed by its retriever's key, whatever its batch
                train = _record(spec.name, "T" + "-".join(map(str, ms)))
                note(pipeline.eval_spec(run, ms[0], ms[1], train, *ms[2:]))
    return out


def stand_ins(patch=setattr) -> None:
    """Model digests and the qg stage's pairs as stand-ins (see the module's doc); ``patch``: how they are set
    (a test's ``monkeypatch.setattr``, which undoes them after it)."""
    patch(pipeline, "model_digest", _digest)  # the files of models this machine may not hold
    patch(train_stage, "model_digest", _digest)
    patch(pipeline, "_qg_pairs", lambda run: (_Pairs(), _Pairs()))  # the training split's pairs need the corpus
    patch(train_stage, "training_threads", lambda: 1)  # a CPU retriever is keyed by this machine's cores
    patch(device, "cpu_threads", lambda: 1)  # ... and a CPU P (gdr.stages.settings.LMSettings.scoring_threads)
    patch(torch.cuda, "is_available", lambda: False)  # keyed as on a CPU-only machine, whatever this one has


def runs(names=EXPERIMENTS) -> list[tuple[str, list[str]]]:
    """(``<experiment>[ <overrides>]``, the overrides of ``gdr run``) of the experiments ``names`` and their
    :data:`VARIANTS`."""
    return [(" ".join([n, *extra]), [f"+experiment={n}", *extra])
            for n in names for extra in [[], *VARIANTS.get(n, [])]]


def all_keys(names=EXPERIMENTS, patch=setattr) -> dict[str, dict[str, str]]:
    """``<experiment>[ <overrides>]`` -> :func:`stage_keys` of its composed ``gdr run`` config (the data paths as the
    experiment names them: no stage key reads a path)."""
    stand_ins(patch)
    return {name: stage_keys(load_config("run", overrides)) for name, overrides in runs(names)}


def main(argv: list[str]) -> None:
    keys = all_keys()
    text = json.dumps(keys, indent=1, sort_keys=True) + "\n"
    if "--write" in argv:
        FIXTURE.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
