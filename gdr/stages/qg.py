"""``gdr qg``: fine-tune a query generator on (document, query) pairs; see ``conf/qg.yaml``."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from gdr.config import save_config, to_container

log = logging.getLogger(__name__)


def _exclude_ids(names) -> set[str]:
    from gdr.data import load_corpus

    ids: set[str] = set()
    for name in names or ():
        ids.update(load_corpus(name).doc_ids)
    return ids


def _title_pairs(cfg, corpus, excluded: set[str]):
    from gdr.data.titles import drop_titles, title_queries
    from training.qg import QGPairs

    qs = title_queries(corpus, seed=int(cfg.seed), fractions=(1.0, 0.0, 0.0))
    texts = dict(zip(corpus.doc_ids, drop_titles(corpus).model_inputs()))
    keep = [i for i, d in enumerate(qs.qids) if d not in excluded]
    return QGPairs([texts[qs.qids[i]] for i in keep], [qs.texts[i] for i in keep], [qs.qids[i] for i in keep])


def _query_pairs(cfg, corpus):
    from gdr.data import load_queries
    from training.qg import QGPairs

    q = cfg.queries
    qs = load_queries(q.name or cfg.data.name, **({"path": q.path} if q.path else {}))
    if q.split not in qs.split_names:
        raise SystemExit(f"queries.split={q.split}: query set {qs.name} has splits {qs.split_names}")
    qs = qs.filter(q.split)
    texts = dict(zip(corpus.doc_ids, corpus.model_inputs()))
    docs, queries, ids = [], [], []
    for text, rel in zip(qs.texts, qs.relevant):  # pair assembly, once
        for d in rel:
            if d in texts:
                docs.append(texts[d]), queries.append(text), ids.append(d)
    return QGPairs(docs, queries, ids)


def read_pairs_jsonl(path: str, corpus=None, load_corpus=None):
    """Pairs from a jsonl file: ``{"doc": ..., "query": ...}`` or ``{"doc_id": ..., "query": ...}``.

    ``doc_id`` lines look the text up in ``corpus``, or in ``load_corpus()``, called at the first such line."""
    from training.qg import QGPairs

    texts = None
    docs, queries, ids = [], [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg}); one object per line") from None
            query = rec.get("query") if isinstance(rec, dict) else None
            if not isinstance(query, str) or not query.strip():
                raise ValueError(f"{path}:{n}: needs a non-empty string \"query\"")
            if isinstance(rec.get("doc"), str) and rec["doc"].strip():
                doc, did = rec["doc"], str(rec.get("doc_id", f"{Path(path).name}:{n}"))
            elif "doc_id" in rec and (corpus is not None or load_corpus is not None):
                if texts is None:
                    corpus = corpus if corpus is not None else load_corpus()
                    texts = dict(zip(corpus.doc_ids, corpus.model_inputs()))
                did = str(rec["doc_id"])
                if did not in texts:
                    raise ValueError(f"{path}:{n}: doc_id {did!r} is not in the corpus {getattr(corpus, 'name', '')!r}; "
                                     "give the text as \"doc\" or pick the corpus with data=...")
                doc = texts[did]
            else:
                raise ValueError(f"{path}:{n}: needs \"doc\" (the text), or \"doc_id\" of a document of the corpus "
                                 "given as data=...")
            docs.append(doc), queries.append(query.strip()), ids.append(did)
    return QGPairs(docs, queries, ids)


def build_pairs(cfg):
    """The training pairs of ``cfg.qg`` and a summary of where they came from."""
    from gdr.stages.score import load_data

    src = str(cfg.qg.pairs)
    excluded = _exclude_ids(cfg.qg.exclude)
    if src == "titles":
        if cfg.data.drop_title:
            raise SystemExit("data.drop_title=true: qg.pairs=titles needs the titles; leave data.drop_title false")
        pairs = _title_pairs(cfg, load_data(cfg), excluded)
    elif src == "queries":
        pairs = _query_pairs(cfg, load_data(cfg))
    else:
        pairs = read_pairs_jsonl(src, load_corpus=lambda: load_data(cfg))
    n_all = len(pairs)
    if excluded and src != "titles":
        keep = np.flatnonzero([d not in excluded for d in pairs.doc_ids])
        pairs = pairs.take(keep)
    if cfg.qg.lowercase:
        pairs.queries = [q.lower() for q in pairs.queries]
    if cfg.qg.max_pairs and len(pairs) > cfg.qg.max_pairs:
        rng = np.random.default_rng(int(cfg.seed))
        pairs = pairs.take(np.sort(rng.choice(len(pairs), int(cfg.qg.max_pairs), replace=False)))
    info = {"source": src, "data": cfg.data.name, "excluded_corpora": list(cfg.qg.exclude or []),
            "excluded_docs": len(excluded), "pairs_before_sampling": n_all, "pairs": len(pairs),
            "documents": len(set(pairs.doc_ids)),
            "mean_query_words": float(np.mean([len(q.split()) for q in pairs.queries])) if len(pairs) else 0.0}
    if excluded:
        leak = sum(d in excluded for d in pairs.doc_ids)
        if leak:
            raise RuntimeError(f"{leak} pairs of excluded documents survived; this is a bug")
    return pairs, info


def qg_main(argv: list[str]) -> int:
    from gdr.stages.score import _compose, build_lm
    from gdr.io import atomic_write_json as write_json
    from gdr.lm import PromptConfig
    from training.qg import QGOptions, fine_tune_qg

    cfg = _compose("qg", argv)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out, "qg.config.yaml")
    t0 = time.time()
    pairs, info = build_pairs(cfg)
    if len(pairs) == 0:
        raise SystemExit(f"qg.pairs={cfg.qg.pairs}: no training pairs left (after qg.exclude / the split filter)")
    lm = build_lm(cfg)
    if not lm.is_seq2seq and lm.prompt.shots:
        p = lm.prompt
        lm.prompt = PromptConfig(style=p.style, prefix=p.prefix, system=p.system, user=p.user,
                                 shots=[list(s) for s in p.shots[:int(cfg.qg.shots)]])
    write_json(out / "pairs.manifest.json", {**info, "examples": [
        {"doc": d[:200], "query": q} for d, q in zip(pairs.docs[:5], pairs.queries[:5])]})
    log.info("qg pairs: %s", info)
    res = fine_tune_qg(out, lm, pairs, QGOptions(**to_container(cfg.qg.train)), dev_fraction=cfg.qg.dev_fraction,
                       dev_max=cfg.qg.dev_max, seed=int(cfg.seed))
    manifest = {"command": "qg", "base_model": cfg.model.name, "model_dir": str(res.model_dir),
                "prompt": lm.describe()["prompt"], "max_doc_tokens": lm.max_doc_tokens, "pairs": info,
                "n_train": res.n_train, "n_dev": res.n_dev, "n_params": res.n_params, "global_step": res.global_step,
                "dev_loss_per_token_before": res.dev_loss_before, "dev_loss_per_token": res.dev_loss,
                "dev_nll_per_query_before": res.dev_nll_per_query_before, "dev_nll_per_query": res.dev_nll_per_query,
                "seconds": round(time.time() - t0, 1)}
    write_json(out / "qg.manifest.json", manifest)
    print(json.dumps({k: manifest[k] for k in ("model_dir", "n_train", "n_dev", "global_step",
                                               "dev_loss_per_token_before", "dev_loss_per_token", "seconds")}))
    return 0
