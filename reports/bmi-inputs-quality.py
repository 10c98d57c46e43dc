"""How topical BMI's document vectors are by ``index.bmi.inputs``, on the documents of a finished ``make demo``
(``gdr run +experiment=demo``: BBC articles, their SmolLM2 generated queries and the split's train titles): k-means
with k = the topics on each vector (10 seeds), ARI and NMI against the topic labels, beside HKmI's vector (the
article's own tf-idf + SVD). The vectors are tf-idf + SVD as in ``+experiment=bbc``.

    PYTHONPATH=$PWD python reports/bmi-inputs-quality.py [runs/demo-bbc]

Prints one JSON line per vector (mean and standard deviation over the seeds, in points).
"""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

from gdr.config import load_config
from gdr.data import corpus_from_config
from gdr.data.splits import QuerySplits
from gdr.indexing.kmeans import (
    bmi_document_texts,
    document_segments,
    query_mean_embeddings,
    read_doc_queries,
    tfidf_svd_embeddings,
)
from gdr.pipeline import queries_section, run_settings
from gdr.stages.index import queries_by_document


def main(argv=None) -> list[dict]:
    args = sys.argv[1:] if argv is None else list(argv)
    run = Path(args[0] if args else "runs/demo-bbc")
    cfg = load_config("run", ["+experiment=demo"])
    data = run_settings(cfg).data
    corpus = corpus_from_config(data)
    train = QuerySplits(data, corpus.doc_ids, None)(queries_section(cfg, cfg.queries.train_split))
    real = {r["doc_id"]: r["queries"] for r in queries_by_document(train)}
    generated = read_doc_queries(next(run.glob("doc-queries-*/doc_queries.jsonl")))
    ids, texts = corpus.doc_ids, corpus.model_inputs()
    embed = functools.partial(tfidf_svd_embeddings, dim=256, seed=0)
    segments = document_segments(ids, texts, seed=0)
    vectors = {"hkmi": embed(texts),
               "genq": query_mean_embeddings(ids, bmi_document_texts(ids, generated), embed),
               "genq_docseg": query_mean_embeddings(ids, bmi_document_texts(ids, generated, segments=segments), embed),
               "realq_genq_docseg": query_mean_embeddings(ids, bmi_document_texts(ids, generated, real, segments),
                                                          embed)}
    k = len(set(corpus.labels))
    print(json.dumps({"run": str(run), "docs": len(ids), "with_real_queries": sum(1 for d in ids if real.get(d)),
                      "generated_per_doc": round(float(np.mean([len(generated[d]) for d in ids])), 2), "k": k}))
    out = []
    for name, x in vectors.items():
        labels = [KMeans(k, n_init=1, random_state=s).fit_predict(x) for s in range(10)]
        ari = [100 * adjusted_rand_score(corpus.labels, lab) for lab in labels]
        nmi = [100 * normalized_mutual_info_score(corpus.labels, lab) for lab in labels]
        out.append({"vector": name, "ari": round(float(np.mean(ari)), 1), "ari_sd": round(float(np.std(ari)), 1),
                    "nmi": round(float(np.mean(nmi)), 1), "nmi_sd": round(float(np.std(nmi)), 1)})
        print(json.dumps(out[-1]))
    return out


if __name__ == "__main__":
    main()
