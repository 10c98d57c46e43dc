"""gdr's Python API: every step of the pipeline as a function of plain arguments, for notebooks and scripts.

>>> import gdr
>>> corpus = gdr.load_corpus("bbc", n_docs=80, drop_title=True)                 # doctest: +SKIP
>>> lm = gdr.load_lm("smollm2-135m", max_doc_tokens=64)                          # doctest: +SKIP
>>> p = gdr.score(corpus, lm, "runs/api/score", n_queries=64)                    # doctest: +SKIP
>>> labels = gdr.GenerativeClustering(n_clusters=5, alpha="auto").fit_predict(p.logp)   # doctest: +SKIP
>>> gc = gdr.build_index("runs/api/index-gc", run=p.path, method="gc", n_clusters=8, leaf_size=8)   # doctest: +SKIP
>>> report = gdr.run({"data": {"n_docs": 80}, "seeds": [0]}, experiment="demo")  # doctest: +SKIP

Each function writes its outputs into the folder it is given, in the layout of the matching command
(``gdr score``, ``gdr index`` ...), and resumes there after a kill. Settings not given take the defaults of
``conf/`` (the settings dataclasses of :mod:`gdr.stages.settings` spell them out). Hydra is the command
line's configuration system; nothing here needs it except :func:`run`, which reads the defaults of
``conf/run.yaml`` (and an experiment) through it and takes the changes as a plain dict.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from gdr import guard
from gdr.carry import MAX_PIECES, PIECE_MIB, pack_run, prune_run, unpack_run
from gdr.config import conf_dir, load_config
from gdr.data import (
    DROP_UNKNOWN_RULE,
    FOLD_RULE,
    FOLDS_RULE,
    QUERY_RULES,
    SPLIT_RULE,
    Corpus,
    DataError,
    QuerySet,
    write_beir,
)
from gdr.data import splits as query_splits
from gdr.data.options import DataOptions
from gdr.guard import claim_folder
from gdr.lm import GenerativeLM
from gdr.models import DEVICE_RULE
from gdr.pipeline import run_pipeline
from gdr.rules import ConfigError, Rule, boolean, check_values
from gdr.stages import doc_queries as doc_queries_stage
from gdr.stages import index as index_stage
from gdr.stages import report as report_stage
from gdr.stages import sample as sample_stage
from gdr.stages import train as train_stage
from gdr.stages.bm25 import bm25_baseline
from gdr.stages.cluster import cluster_run
from gdr.stages.command_keys import DocQueries, EvaluateQueries, RunQueries
from gdr.stages.evaluate import evaluate_model
from gdr.stages.score import score_corpus
from gdr.stages.settings import (
    PER_DOC_RULE,
    RESULTS_RULE,
    ClusterSettings,
    EvaluateSettings,
    IndexSettings,
    LMSettings,
    SampleSettings,
    ScoreSettings,
    TrainSettings,
)
from gdr.stages.train import check_not_trained_on, trained_splits
from gdr.store import TEXTS_FILE, PRun, load_run, text_digests
from gdr.upgrade import refuse_format_0_retriever, refuse_format_0_training
from gdr.validate import error_line, validate

__all__ = ["load_lm", "sample_queries", "sample_doc_queries", "score", "split_queries", "evaluate_clusters",
           "build_index", "train_retriever", "evaluate", "bm25", "run", "headline", "prune", "pack", "unpack"]

PathLike = str | os.PathLike


def load_lm(name: str = LMSettings.name, *, max_doc_tokens: int = LMSettings.max_doc_tokens,
            prompt: Mapping[str, Any] | None = None, device: str = LMSettings.device,
            threads: int | None = None) -> GenerativeLM:
    """The query generator: a hub id, a local path, or a bundled name (``smollm2-135m``).

    ``prompt``: :class:`gdr.lm.PromptConfig` fields (``style``, ``system``, ``user``, ``shots`` ...); None takes
    the model's own default (a fine-tuned ``gdr qg`` model brings the prompt it was trained with)."""
    return _lm_settings(name, max_doc_tokens, prompt, device, threads).build()


def _lm_settings(name, max_doc_tokens, prompt, device, threads) -> LMSettings:
    prompt = _need_mapping(prompt, "prompt", '{"style": "chat"}') or None
    return LMSettings(name=name, max_doc_tokens=max_doc_tokens, prompt=prompt, device=device, threads=threads)


def sample_queries(lm: GenerativeLM, corpus: Corpus, out: PathLike, *, n_queries: int = SampleSettings.n_queries,
                   seed: int = SampleSettings.seed, progress: bool = False, **sampling: Any) -> list[dict]:
    """Sample ``n_queries`` queries from ``corpus`` with ``lm`` into ``out/queries.jsonl``; returns them.

    ``sampling``: ``top_k``, ``top_p``, ``temperature``, ``max_new_tokens``, ``batch_size`` (see
    :class:`~gdr.stages.settings.SampleSettings`). The same seed gives the same queries at any batch size.
    Queries for every document (``per_doc``) come from :func:`sample_doc_queries`."""
    _need_corpus(corpus)
    _need_path(out, "out", "the folder to write into")
    if sampling.get("per_doc"):
        raise TypeError(f"sample_queries: per_doc={sampling['per_doc']} is not a setting of J sampled queries; "
                        f"for {sampling['per_doc']} queries of every document call "
                        f"gdr.sample_doc_queries(lm, corpus, out, per_doc={sampling['per_doc']})")
    settings = _sample_settings(sampling, n_queries=n_queries, seed=seed)
    return sample_stage.sample_queries(_built_lm(lm), corpus, out, settings, progress=progress)


def sample_doc_queries(lm: GenerativeLM | LMSettings | str, corpus: Corpus, out: PathLike, *,
                       per_doc: int = DocQueries.per_doc, seed: int = SampleSettings.seed, progress: bool = False,
                       **sampling: Any) -> Path:
    """Generate ``per_doc`` queries for every document of ``corpus`` into ``out/doc_queries.jsonl`` (one line
    ``{"doc_id", "queries": [...]}`` per document, as ``gdr sample sample.per_doc=N``): the retriever's generated
    training queries (:func:`train_retriever`'s ``generated=``) and BMI's input. Returns the file's path.

    ``sampling``: ``top_k``, ``top_p``, ``temperature``, ``max_new_tokens``, ``batch_size``; the queries of a
    document depend on ``seed`` and its position only."""
    _need_corpus(corpus)
    _need_path(out, "out", "the folder to write into")
    check_values({"per_doc": per_doc}, (PER_DOC_RULE,), nest="sample")
    settings = _sample_settings(sampling, per_doc=per_doc, seed=seed)
    return doc_queries_stage.sample_doc_queries(_built_lm(lm), corpus, out, settings, progress=progress)


def score(corpus: Corpus, lm: GenerativeLM | LMSettings | str, out: PathLike, *,
          n_queries: int = SampleSettings.n_queries, seed: int = SampleSettings.seed,
          processes: int = ScoreSettings.processes, sampling: Mapping[str, Any] | None = None,
          scoring: Mapping[str, Any] | None = None, progress: bool = False,
          queries_from: PRun | PathLike | None = None, reuse_from: PRun | PathLike | None = None) -> PRun:
    """Sample J = ``n_queries`` queries (unless ``out/queries.jsonl`` exists) and score log p(query | doc) for
    every pair: the matrix P (Algorithm 1, lines 1-2). Returns the run (``.logp`` (N, J), ``.queries``,
    ``.doc_ids``, ``.path``).

    ``lm``: a loaded :class:`gdr.lm.GenerativeLM`, a model name, or :class:`~gdr.stages.settings.LMSettings`
    (needed for ``processes > 1``: each process loads its own copy). ``sampling``/``scoring``: the fields of
    :class:`~gdr.stages.settings.SampleSettings` / :class:`~gdr.stages.settings.ScoreSettings`.

    ``processes > 1`` starts that many processes with ``multiprocessing``'s *spawn*, which imports the calling
    script again in each of them: a script must make the call under ``if __name__ == "__main__":`` (as
    ``examples/demo_api.py`` does in ``main()``), or every process would start the work over.

    ``queries_from``: a finished run (what :func:`score` returned, or a ``gdr score`` / ``gdr run`` folder) whose
    queries are scored instead of sampling new ones, with the model that scored it: the P of new documents for
    ``gdr index add`` into an index built on that run (``gdr score queries_from=<run>``).

    ``reuse_from``: an older run of the same model and settings (the corpus before an edit): its queries and P
    entries that a full rescore would give byte for byte are taken, only the rest sampled and scored; with
    ``sampling={"p_per_doc": k}`` (k queries from every document) that is all but an edited document's own
    queries, row and columns (``gdr score reuse_from=<run>``)."""
    _need_corpus(corpus)
    _need_lm(lm)
    _need_path(out, "out", "the folder to write into")
    if isinstance(lm, str):
        lm = LMSettings(name=lm)
    sampling = _need_mapping(sampling, "sampling", '{"temperature": 1.0}')
    scoring = _need_mapping(scoring, "scoring", '{"dtype": "float16"}')
    sample = _sample_settings(sampling, n_queries=n_queries, seed=seed)
    settings = ScoreSettings(**{"processes": processes, **scoring})
    J, key = sample.n_total(len(corpus))
    settings.check_size(len(corpus), J, key="n_queries" if key == "sample.n_queries" else 'sampling["p_per_doc"]')
    source = getattr(queries_from, "path", queries_from)
    older = getattr(reuse_from, "path", reuse_from)
    score_corpus(corpus, lm, out, sample, settings, progress=progress, queries_from=source, reuse_from=older)
    return load_run(out)


def split_queries(corpus: Corpus, split: str, *, name: str | None = None, data: Mapping[str, Any] | None = None,
                  path: PathLike | None = None, seed: int = RunQueries.seed, fractions: Sequence[float] | None = None,
                  folds: int | None = None, fold: int | None = None) -> QuerySet | None:
    """The real queries of one ``split`` whose relevant documents are in ``corpus`` (others dropped); None when
    there are none.

    ``name``: a query set (cranfield, msmarco-lite, nq320k, a BEIR folder; default: the corpus's own) or
    ``"titles"`` (each title is the query of its own article: bbc, r2, r5; ``seed`` and ``fractions`` split
    them). ``fractions`` (train/dev/test shares) splits real topics too, by a seeded hash of the topic id
    (``queries.fractions``); None: the query set's own splits (titles: 0.8/0.1/0.1). ``folds`` (K) and ``fold``
    cross-validate as ``queries.folds`` does: the topics of ``fold`` are the test split, the other folds' the train
    split (``fold=None``: every topic). ``data``: how the corpus
    was loaded (``{"name": "bbc", "path": ...}``; default its name): title queries read the titles from there,
    since a corpus loaded with ``drop_title=True`` has none; the default is
    where :func:`gdr.load_corpus` read it (a BEIR folder's own queries and qrels). ``data["drop_unknown_qrels"]``:
    judgements of documents not in that folder's or file's corpus are dropped (counted in ``info["unknown_qrels"]``,
    which :func:`bm25` and :func:`evaluate` report) rather than refused, as ``data.drop_unknown_qrels=true`` does."""
    _need_corpus(corpus)
    check_values({"split": split}, (SPLIT_RULE,))
    fractions = None if fractions is None else list(fractions)
    check_values({"seed": seed, "fractions": fractions, "folds": folds, "fold": fold},
                 (*QUERY_RULES, FOLDS_RULE, FOLD_RULE),
                 {"fractions": "queries.fractions", "folds": "queries.folds", "fold": "queries.fold"})
    if folds is not None and fractions is not None:
        raise ValueError(f"folds={folds}: the folds split the topics, so fractions must be None")
    if fold is not None and (folds is None or fold >= folds):
        raise ValueError(f"fold={fold}: must be one of the folds 0 .. folds-1 (folds={folds})")
    data = _need_mapping(data, "data", '{"name": "bbc"}') or dict(corpus.info.get("data") or {"name": corpus.name})
    q = {"name": name or data["name"], "split": split, "path": str(path) if path else data.get("path"),
         "seed": int(seed), "fractions": fractions, "folds": folds, "fold": fold}
    return query_splits.split_queries(q, data, set(corpus.doc_ids), data.get("docs_tsv"))


def evaluate_clusters(corpus: Corpus, run: PRun | PathLike, out: PathLike, *, device: str = LMSettings.device,
                      **settings: Any) -> dict:
    """Flat generative clustering of a scored corpus, against its labels with the k-means baselines (tf-idf,
    sentence embeddings, log P): ``metrics.json``, ``results.md``, ``clusters.md``, ``labels.tsv`` in ``out``.

    ``run``: what :func:`score` returned, or its folder. ``settings``: the fields of
    :class:`~gdr.stages.settings.ClusterSettings` (``n_clusters``, ``repeats``, ``gc={"alpha": "auto"}`` ...).
    Returns per method (``GC``, ``k-means (tfidf)`` ...) its mean ACC/NMI/ARI and GC's labels and cluster
    descriptions. For GC alone on a matrix, use :class:`gdr.GenerativeClustering`."""
    _need_corpus(corpus)
    _need_path(out, "out", "the folder to write into")
    check_values({"device": device}, (DEVICE_RULE,))
    settings = ClusterSettings.merged(settings)
    settings.check_corpus(corpus)
    prun = _p_run(run)
    _need_same_documents(corpus, prun)
    result, _ = cluster_run(corpus, prun, out, settings, device=device)
    return result


def build_index(out: PathLike, *, method: str = IndexSettings.method, run: PRun | PathLike | None = None,
                corpus: Corpus | None = None, **settings: Any) -> dict:
    """Prefix-code docids by one indexer into ``out`` (``docids.tsv``, ``tree.json``, ``summary.json``).

    ``method``: ``gc`` (hierarchical generative clustering, Algorithm 2: needs ``run``, a scored corpus),
    ``hkmi`` (hierarchical k-means on sentence embeddings: needs ``corpus``), ``bmi`` (k-means on the mean
    embedding of generated queries: ``kmeans={"doc_queries": <doc_queries.jsonl>}``; BMI's own vector averages
    real training queries and text segments too: ``bmi={"inputs": "realq_genq_docseg", "real_queries": <jsonl>}``
    with ``corpus``), ``random``, ``atomic``. ``settings``: the fields of
    :class:`~gdr.stages.settings.IndexSettings` (``n_clusters``, ``leaf_size``, ``seed``; ``gc``, ``kmeans`` and
    ``bmi`` dicts are merged onto their defaults). Returns the summary (depth,
    balance, leaves) with ``docids``: the path of ``docids.tsv``."""
    _need_path(out, "out", "the folder to write into")
    _need_corpus(corpus, optional=True)
    run_path = getattr(run, "path", run)
    if corpus is not None and run is not None:  # the documents come from the run: the corpus must be its own
        _need_same_documents(corpus, run)
    settings.setdefault("progress", False)
    index_settings = IndexSettings.merged(settings, method=method)
    run_arg = str(run_path) if run_path is not None else None
    summary = index_stage.build_index(index_settings, out, corpus=corpus, run=run_arg)
    return {**summary, "docids": str(Path(out) / "docids.tsv")}


def train_retriever(corpus: Corpus, docids: PathLike, out: PathLike, *, queries: QuerySet | None = None,
                    generated: PathLike | None = None, size: str | None = None, seed: int = TrainSettings.seed,
                    **sections: Any):
    """Train an NCI-style seq2seq retriever on ``docids`` (from :func:`build_index`) into ``out``.

    ``queries``: real training queries over the corpus (:func:`split_queries`; its dev part is held out to
    pick the checkpoint), ``generated``: a ``doc_queries.jsonl``; documents' own windows are always used.
    ``size``: a preset of ``conf/stage/train.yaml`` (``tiny``, ``mini``, ``small30m`` ...). ``sections``:
    ``examples``, ``model``, ``optim``, ``trainer`` dicts merged onto the defaults (e.g.
    ``trainer={"max_epochs": 5, "batch_size": 32}``; a progress bar shows by default:
    ``trainer={"enable_progress_bar": False}`` turns it off). Returns ``gdr.training.train.TrainResult``
    (``model_dir``, ``best_score`` of the dev metric ``monitor``, ``global_step`` ...)."""
    _need_corpus(corpus)
    _need_path(out, "out", "the folder to write into")
    _need_queries(queries, optional=True)
    _need_path(docids, "docids", "the docids.tsv of gdr.build_index (its result's ['docids'])")
    sections = {**sections, "model": {**(sections.get("model") or {}), **({"size": size} if size is not None else {})}}
    settings = TrainSettings.merged(sections, seed=seed)
    refuse_format_0_training(out, bool(settings.trainer.resume))
    return train_stage.train_retriever(corpus, docids, out, settings, queries=queries, generated=generated)


def evaluate(run_dir: PathLike, corpus: Corpus, queries: QuerySet, out: PathLike, *,
             split: str = EvaluateQueries.split, drop_unknown_qrels: bool = DataOptions.drop_unknown_qrels,
             allow_train_split: bool = False, **settings: Any) -> dict:
    """Success@1/10/k, R@10/k and RR@k (k: the results per query, 100 unless ``k``) of the retriever trained in
    ``run_dir`` on the ``split`` queries of ``queries``
    (BM25 beside it unless ``bm25=False``): ``metrics.json``, ``metrics.md``, ``run.trec`` in ``out``; returns
    ``metrics.json``'s content (``systems``: ``{"gdr": {...}, "bm25": {...}}``). ``settings``: the fields of
    :class:`~gdr.stages.settings.EvaluateSettings` (``k``, ``beam``, ``batch_size`` ...). A relevant id not in
    ``corpus`` is refused, or dropped with ``drop_unknown_qrels=True`` (a subset; ``unknown_qrels`` counts them).
    A split the retriever was trained on is refused unless ``allow_train_split=True`` (``metrics.json`` then says
    ``trained_on_this_split``)."""
    _need_path(run_dir, "run_dir", "the out folder of gdr.train_retriever")
    _need_corpus(corpus)
    _need_path(out, "out", "the folder to write into")
    _need_queries(queries)
    _check_split(split, drop_unknown_qrels)
    check_values({"allow_train_split": allow_train_split}, (Rule("allow_train_split", boolean),))
    refuse_format_0_retriever(run_dir)
    check_not_trained_on(run_dir, split, allow_train_split, key="split")
    metrics, _ = evaluate_model(run_dir, corpus, queries, out, EvaluateSettings.from_dict(settings), split=split,
                                drop_unknown_qrels=drop_unknown_qrels,
                                on_train_split=split in trained_splits(run_dir))
    return metrics


def bm25(corpus: Corpus, queries: QuerySet, out: PathLike, *, k: int = EvaluateSettings.k,
         split: str = EvaluateQueries.split, drop_unknown_qrels: bool = DataOptions.drop_unknown_qrels) -> dict:
    """BM25 over ``corpus`` for the ``split`` queries of ``queries`` (the reference of every retriever):
    ``bm25.trec`` and ``metrics.json`` in ``out``; returns its metrics (``recall@1`` ... ``mrr@k``, fractions).
    ``drop_unknown_qrels``: as in :func:`evaluate`."""
    _need_corpus(corpus)
    _need_path(out, "out", "the folder to write into")
    _need_queries(queries)
    check_values({"k": k}, (RESULTS_RULE,))
    _check_split(split, drop_unknown_qrels)
    return bm25_baseline(corpus, queries, out, k=k, split=split, drop_unknown_qrels=drop_unknown_qrels)["metrics"]


def run(settings: Mapping[str, Any] | None = None, *, experiment: str | None = None, corpus: Corpus | None = None,
        queries: QuerySet | None = None) -> dict:
    """The whole pipeline (``gdr run``) from a dict of settings; returns the report (``report.json``).

    ``settings``: nested like ``conf/run.yaml`` and changing only what it names, e.g.
    ``{"data": {"n_docs": 80}, "sample": {"n_queries": 64}, "indexers": ["gc", "hkmi"], "seeds": [0],
    "out": "runs/mine"}``. A ``name`` under ``data`` or ``model`` that is a config file picks that file, as
    ``data=beir`` does on the command line: ``{"data": {"name": "beir", "path": "my-beir"}}`` is ``gdr run
    data=beir data.path=my-beir`` (the same stages, so either reuses the other's run folder); so does a string
    (``"data": "r5"``, ``"model": "doc2query-t5"``). ``experiment``: a ``conf/experiment/`` preset applied
    first (``"demo"``, ``"bbc"``). A bad value is refused before anything loads, naming the key. Every stage is
    cached in the run folder as with the command, so a second call reuses it. ``gdr.headline(report)`` is the
    command's JSON line.

    ``corpus``, ``queries``: a corpus in memory (:meth:`gdr.Corpus.from_texts`, ``from_pandas``,
    ``from_dataset``) and its queries (a :class:`gdr.QuerySet` with a ``test`` split, and a ``train`` split
    if there is one) instead of ``data``: they are written as a BEIR folder ``<out>/corpus/<corpus.name>/``
    and run as ``data=beir`` on it, so an in-memory corpus gets the same stages, cache and report."""
    overrides = [f"+experiment={experiment}"] if experiment else []
    settings = _need_mapping(settings, "settings", '{"data": {"n_docs": 80}, "out": "runs/mine"}')
    try:
        return _run(settings, overrides, corpus, queries)
    finally:
        guard.release_all()


def _run(settings: dict, overrides: list[str], corpus, queries) -> dict:
    """:func:`run` inside its locks (released by the caller, whatever happens)."""
    if corpus is not None or queries is not None:
        settings = _in_memory_data(settings, corpus, queries)
    groups = []
    for k in ("data", "model"):
        v = settings.get(k)
        if v is not None and not isinstance(v, (str, Mapping)):
            raise TypeError(f"settings[{k!r}]: got {type(v).__name__} {v!r:.60}; pass a name ({k}='"
                            f"{'bbc' if k == 'data' else 'smollm2-135m'}') or a dict of {k} settings "
                            f"({{'name': ..., ...}})")
        if isinstance(v, str):
            groups.append(f"{k}={settings.pop(k)}")
        elif isinstance(v, Mapping) and _is_group(k, v.get("name")):  # {"data": {"name": "beir", ...}}: data=beir
            rest = {key: x for key, x in v.items() if key != "name"}
            groups.append(f"{k}={v['name']}")
            settings.pop(k)
            if rest:
                settings[k] = rest
    try:  # Hydra's refusals (an unknown key or experiment) in the commands' one line, with its did-you-mean
        base = load_config("run", overrides + groups)  # the defaults the changes apply to
        overrides += groups + hydra_overrides(settings, known=base)
        cfg = load_config("run", overrides)
    except (HydraException, OmegaConfBaseException) as e:
        line = error_line(e, overrides + groups)
        if line is None:
            raise
        raise ConfigError(line) from None
    validate("run", cfg)
    guard.claim_out("run", cfg)
    return run_pipeline(cfg, overrides)


def prune(run_dir: PathLike) -> dict:
    """``gdr prune``: drop the model weights and optimiser states of the evaluated retrievers of the run folder
    ``run_dir``, keeping every result (:func:`gdr.carry.prune_run`); returns ``{"pruned": [folders], "bytes"}``."""
    _need_path(run_dir, "run_dir", "a `gdr run` folder")
    return prune_run(run_dir)


def pack(run_dir: PathLike, out: PathLike, *, prune: bool = False, piece_mib: float = PIECE_MIB,
         max_pieces: int = MAX_PIECES) -> dict:
    """``gdr pack``: the pruned run folder ``run_dir`` as checksummed pieces in ``out`` (:func:`gdr.carry.pack_run`;
    ``prune=True`` prunes it first instead of refusing it); returns the pack's manifest."""
    for name, value, integer in (("piece_mib", piece_mib, False), ("max_pieces", max_pieces, True)):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and value > 0 and (not integer or float(value).is_integer())):
            raise ValueError(f"{name}={value!r}: must be a positive {'integer' if integer else 'number'}")
    _need_path(run_dir, "run_dir", "a `gdr run` folder")
    return pack_run(run_dir, out, prune=prune, piece_mib=piece_mib, max_pieces=max_pieces)


def unpack(packed: PathLike, dest: PathLike) -> dict:
    """``gdr unpack``: the run packed into the folder ``packed``, its pieces checked, rebuilt at ``dest``
    (:func:`gdr.carry.unpack_run`); ``gdr.run({..., "out": dest})`` carries on with it. Returns the manifest."""
    _need_path(packed, "packed", "the folder a `gdr pack` wrote")
    return unpack_run(packed, dest)


def _is_group(group: str, name: Any) -> bool:
    """Whether ``conf/<group>/<name>.yaml`` exists (``data/beir``, ``model/doc2query-t5``)."""
    return isinstance(name, str) and "/" not in name and (conf_dir() / group / f"{name}.yaml").is_file()


def _in_memory_data(settings: dict, corpus, queries) -> dict:
    """``settings`` with ``data`` pointing at a BEIR folder written from ``corpus`` and ``queries``."""
    _need_corpus(corpus, hint="(gdr.run(settings, corpus=..., queries=...))")
    if queries is None:
        raise ValueError("gdr.run(corpus=...) needs queries= too: a gdr.QuerySet with a 'test' split to score the "
                         "retrievers on (docids alone: gdr.score + gdr.build_index)")
    _need_queries(queries)
    data = settings.get("data") or {}
    if not isinstance(data, Mapping) or {"name", "path"} & set(data):
        raise ValueError("gdr.run(corpus=...): the corpus replaces data.name and data.path; keep other data "
                         "settings (n_docs, drop_title ...) under 'data'")
    out = Path(str(settings.get("out") or f"runs/run-{corpus.name}"))
    folder = out / "corpus" / "".join(c if c.isalnum() or c in "-_." else "_" for c in corpus.name)
    claim_folder(out, "out")  # the run folder's lock before its first write: a busy folder is left untouched
    write_beir(corpus, queries, folder)
    return {**settings, "out": str(out), "data": {**data, "name": "beir", "path": str(folder)}}


# ------------------------------------------------------------------------------------------ argument types
def _sample_settings(sampling: Mapping[str, Any], **given: Any) -> SampleSettings:
    """The sampling settings of a function's ``sampling`` keywords and its own arguments ``given``: an unknown
    name refused with the known ones, a name given twice refused."""
    twice = sorted(set(sampling) & set(given))
    if twice:
        raise TypeError(f"sampling: {twice[0]} is an argument of its own; pass {twice[0]}=... once")
    return SampleSettings.from_dict(sampling, **given)


def _p_run(run: Any) -> PRun:
    """``run``: what :func:`score` returned or its folder, as a P run; a TypeError naming what to pass otherwise
    (a matrix: :class:`gdr.GenerativeClustering` clusters one)."""
    if isinstance(run, (str, os.PathLike)):
        return load_run(run)
    if isinstance(run, PRun):
        return run
    raise TypeError(f"run: got {type(run).__name__}; pass what gdr.score returned or its folder (for GC alone on a "
                    "matrix of log-probabilities, use gdr.GenerativeClustering(n_clusters).fit(logp))")


def _need_corpus(value: Any, arg: str = "corpus", optional: bool = False, hint: str = "") -> None:
    """A TypeError naming ``arg`` and the constructor to call, unless ``value`` is a :class:`gdr.Corpus`
    (checked before any model loads)."""
    if isinstance(value, Corpus) and len(value) == 0:
        raise ValueError(f"{arg}: the gdr.Corpus {value.name!r} holds no document; pass one with at least one")
    if isinstance(value, Corpus) or (optional and value is None):
        return
    kind = type(value).__module__.split(".")[0]
    if isinstance(value, (list, tuple)) or kind == "numpy":
        how = "gdr.Corpus.from_texts(texts, ids=None)"
    elif kind == "pandas":
        how = "gdr.Corpus.from_pandas(df, id_column=..., text_column=...)"
    elif kind == "datasets":
        how = "gdr.Corpus.from_dataset(ds, id_column=..., text_column=...)"
    elif isinstance(value, (str, os.PathLike)):
        how = f"gdr.load_corpus({os.fspath(value)!r})"
    else:
        how = "gdr.load_corpus(name or path), gdr.Corpus.from_texts / from_pandas / from_dataset"
    raise TypeError(f"{arg}: got {type(value).__name__}; pass a gdr.Corpus: {how}" + (f" {hint}" if hint else ""))


def _need_same_documents(corpus: Corpus, run: Any) -> None:
    """Refuse a corpus that is not the documents of ``run`` (a :class:`PRun` or a ``gdr score`` folder), naming
    the count or the first row that differs in id or in text (the model input each row was scored on, as the run's
    ``doc_texts.json`` records its digest); a folder without ``doc_ids.json`` is left to the stage to refuse."""
    folder = Path(getattr(run, "path", run))
    doc_ids = getattr(run, "doc_ids", None)
    if doc_ids is None and isinstance(run, (str, os.PathLike)) and (folder / "doc_ids.json").is_file():
        doc_ids = json.loads((folder / "doc_ids.json").read_text(encoding="utf-8"))
    if doc_ids is None:
        return
    corpus.check_same_ids(doc_ids, f"run {folder}")
    if (folder / TEXTS_FILE).is_file():
        scored = json.loads((folder / TEXTS_FILE).read_text(encoding="utf-8"))
        row = next((i for i, (a, b) in enumerate(zip(scored, text_digests(corpus.model_inputs()))) if a != b), None)
        if row is not None:
            raise DataError(f"run {folder}: document {corpus.doc_ids[row]!r} (row {row}) was scored on another text "
                            f"than corpus {corpus.name!r} holds: pass the corpus the run was scored on, or score "
                            "this one")


def _need_queries(value: Any, arg: str = "queries", optional: bool = False) -> None:
    if isinstance(value, QuerySet) and len(value) == 0:
        raise ValueError(f"{arg}: the gdr.QuerySet {value.name!r} holds no query; pass one with at least one query")
    if isinstance(value, QuerySet) or (optional and value is None):
        return
    raise TypeError(f"{arg}: got {type(value).__name__}; pass a gdr.QuerySet: gdr.split_queries(corpus, 'test'), "
                    "gdr.load_queries(...), or gdr.QuerySet(name=, qids=, texts=, relevant=, splits=)")


def _check_split(split: Any, drop_unknown_qrels: Any) -> None:
    check_values({"split": split, "drop_unknown_qrels": drop_unknown_qrels}, (SPLIT_RULE, DROP_UNKNOWN_RULE),
                 {"drop_unknown_qrels": "data.drop_unknown_qrels"})


def _need_mapping(value: Any, arg: str, example: str) -> dict:
    """``value`` (a mapping of settings, or None) as a dict; anything else is a TypeError naming ``arg``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{arg}: got {type(value).__name__} {value!r}; pass a dict of settings, e.g. {example}")
    return dict(value)


def _need_path(value: Any, arg: str, what: str) -> None:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{arg}: got {type(value).__name__}; pass a path: {what}")


def _need_lm(value: Any, arg: str = "lm") -> None:
    if not isinstance(value, (GenerativeLM, LMSettings, str)):
        raise TypeError(f"{arg}: got {type(value).__name__}; pass gdr.load_lm(name), a gdr.LMSettings or a model "
                        "name ('smollm2-135m', a hub id or a local path)")


def _built_lm(lm: Any):
    """A loaded model for ``lm`` (a GenerativeLM, LMSettings or name), its type checked first."""
    _need_lm(lm)
    if isinstance(lm, str):
        lm = LMSettings(name=lm)
    return lm.build() if isinstance(lm, LMSettings) else lm


def headline(report: dict) -> dict:
    """The one JSON line ``gdr run`` prints last, from a report of :func:`run`."""
    return report_stage.headline(report)


# Mappings of conf/run.yaml whose keys are names the user chooses: a new key is added there (``+key=``);
# anywhere else a key the config does not have is refused by Hydra, naming it.
FREE_FORM = ("cluster.variants.", "train.model_presets.", "model.prompt.")


def hydra_overrides(settings: Mapping[str, Any], prefix: str = "", known: Any = None) -> list[str]:
    """Command-line overrides (``sample.n_queries=64``) for a nested dict of settings; a string under ``data``
    or ``model`` at the top selects that config group (``data=r5``). ``known``: the composed config the
    overrides apply to; a key it lacks is added only under :data:`FREE_FORM` mappings."""
    out: list[str] = []
    for key, value in settings.items():
        path = f"{prefix}{key}"
        if not prefix and key in ("data", "model") and isinstance(value, str):
            out.insert(0, f"{key}={value}")
        elif isinstance(value, Mapping) and value:
            out += hydra_overrides(value, path + ".", known)
        else:
            new = known is not None and _lookup(known, path) is _MISSING and path.startswith(FREE_FORM)
            out.append(f"{'+' if new else ''}{path}={_hydra_value(value)}")
    return out


_MISSING = object()


def _lookup(cfg: Any, path: str) -> Any:
    node = cfg
    for part in path.split("."):
        if not hasattr(node, "keys") or part not in node:
            return _MISSING
        node = node[part]
    return node


def _hydra_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (str, os.PathLike)):
        return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(v, Mapping):
        return "{" + ",".join(f"{k}:{_hydra_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_hydra_value(x) for x in v) + "]"
    raise TypeError(f"setting value {v!r} ({type(v).__name__}): use numbers, strings, booleans, None, lists, dicts")
