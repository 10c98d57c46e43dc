# What the decoding of the generated training queries does to them, without a retriever:
# per decoding, the share of documents whose queries are all distinct, the mean query length in words, and how
# often BM25 over the corpus puts a query's own source document first (Recall@1) or in the top 10: a query that
# does not point at its document teaches the retriever noise. Only documents present in every file count.
#   python reports/ablation/query_quality.py <out.md> <doc_queries folder>... -- <gdr run overrides>
import sys
from pathlib import Path

import numpy as np

from gdr.config import load_config, to_container
from gdr.data import corpus_from_config
from gdr.eval.bm25 import bm25_run
from gdr.eval.compare import mean_interval, paired_test
from gdr.eval.retrieval import evaluate_run, per_query_metrics
from gdr.io import read_jsonl

cut = sys.argv.index("--")
out, folders, argv = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:cut]], sys.argv[cut + 1:]
corpus = corpus_from_config(to_container(load_config("run", argv).data))
per_file = []
lines = ["| decoding (folder) | queries | distinct within a document | words per query | BM25 R@1 of the source "
         "document (95% CI) | BM25 R@10 |", "|---|---|---|---|---|---|"]
files = {f: read_jsonl(f / "doc_queries.jsonl") for f in folders}  # unfinished files: their whole lines
common_docs = set.intersection(*({r["doc_id"] for r in rows} for rows in files.values()))
for f, rows in files.items():
    rows = [r for r in rows if r["doc_id"] in common_docs]  # the same documents for every decoding
    qids, texts, qrels, distinct = [], [], {}, []
    for row in rows:
        qs = row["queries"]
        distinct.append(len(set(qs)) == len(qs))
        for j, q in enumerate(qs):
            qid = f"{row['doc_id']}#{j}"
            qids.append(qid)
            texts.append(q)
            qrels[qid] = [row["doc_id"]]
    run = bm25_run(corpus.doc_ids, corpus.model_inputs(), qids, texts, k=10)
    _, first = evaluate_run(run, qrels, ks=(1, 10))
    pq = per_query_metrics(np.array(list(first.values())), ks=(1, 10))
    per_file.append(dict(zip(qids, 100 * pq["recall@1"])))
    mu, lo, hi = mean_interval(100 * pq["recall@1"])
    words = np.mean([len(t.split()) for t in texts])
    lines.append(f"| `{f.name}` | {len(texts)} | {100 * np.mean(distinct):.0f}% | {words:.1f} | {mu:.1f} "
                 f"[{lo:.1f}, {hi:.1f}] | {100 * pq['recall@10'].mean():.1f} |")
if len(per_file) == 2:  # query j of document d under each decoding: paired
    common = [q for q in per_file[0] if q in per_file[1]]
    diff, lo, hi, p = paired_test(np.array([per_file[0][q] for q in common]),
                                  np.array([per_file[1][q] for q in common]))
    lines += ["", f"Paired over the {len(common)} (document, j) pairs: BM25 R@1 difference (first - second) "
                  f"{diff:+.1f} points, 95% CI [{lo:+.1f}, {hi:+.1f}], paired permutation p = {p:.2g}."]
out.write_text("\n".join(lines) + "\n", encoding="utf-8")
print("\n".join(lines))
