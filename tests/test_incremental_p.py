"""Incremental P: a P of an edited corpus built from an older P of the same model and settings scores only the
entries it does not find there (rows of new or edited documents, columns of new queries) and equals a full
rescore: byte for byte in every row scored whole (a new or edited document's) and every reused entry; the reused
rows' entries at new queries to float rounding (a query's last bits depend on where it sits among the queries
packed into one pass)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_models import DOCS, QUERIES, tiny_llama

from gdr.io import write_jsonl
from gdr.stages.score import score_run
from gdr.store import load_run

IDS = [f"d{i}" for i in range(len(DOCS))]


@pytest.fixture(scope="module")
def lm():
    return tiny_llama()


def _score(lm, texts, ids, queries, out, **kw):
    """``score_run`` into ``out`` beside the queries' file (what a folder's columns are read from)."""
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "queries.jsonl", ({"qid": f"q{j}", "text": q} for j, q in enumerate(queries)))
    score_run(lm, texts, ids, queries, out, shard_size=3, progress=False, **kw)


@pytest.fixture(scope="module")
def old(lm, tmp_path_factory):
    """The P of the corpus before any change."""
    out = tmp_path_factory.mktemp("old")
    _score(lm, DOCS, IDS, QUERIES, out)
    return out


def _incremental_and_full(lm, old, tmp_path, texts, ids, queries, **kw):
    """(pairs the incremental P scored, its P, a full rescore's P)."""
    _score(lm, texts, ids, queries, tmp_path / "inc", reuse_from=old, **kw)
    _score(lm, texts, ids, queries, tmp_path / "full", **kw)
    man = json.loads((tmp_path / "inc" / "P.manifest.json").read_text())
    full = json.loads((tmp_path / "full" / "P.manifest.json").read_text())
    assert full["pairs_scored_last_call"] == len(texts) * len(queries)
    return man["pairs_scored_last_call"], load_run(tmp_path / "inc").logp, load_run(tmp_path / "full").logp


def _assert_equal(inc, full, new_cols=()):
    """``inc`` equals ``full`` byte for byte outside ``new_cols``, to rounding inside them."""
    keep = np.setdiff1d(np.arange(full.shape[1]), new_cols)
    assert inc[:, keep].tobytes() == full[:, keep].tobytes()
    np.testing.assert_allclose(inc[:, new_cols], full[:, new_cols], rtol=1e-6, atol=0)


def test_one_edited_document_rescores_its_row_and_its_queries_columns(lm, old, tmp_path):
    texts = list(DOCS)
    texts[4] = "an edited document about rain in spain"
    queries = list(QUERIES)
    queries[1] = "rain spain"  # the query drawn from the edited document
    n, inc, full = _incremental_and_full(lm, old, tmp_path, texts, IDS, queries)
    assert n == len(queries) + (len(texts) - 1) * 1  # the edited row, then the new column of the others
    _assert_equal(inc, full, new_cols=[1])
    assert inc[4].tobytes() == full[4].tobytes()  # the edited row, scored whole
    man = json.loads((tmp_path / "inc" / "P.manifest.json").read_text())
    assert man["reused_from"] == str(old) and man["status"] == "complete"


def test_added_and_removed_documents_score_only_the_new_rows(lm, old, tmp_path):
    keep = [0, 2, 3, 5, 6]  # two documents removed, two added among them
    texts = [DOCS[i] for i in keep[:2]] + ["a new document on tennis"] + [DOCS[i] for i in keep[2:]] + ["one more"]
    ids = [IDS[i] for i in keep[:2]] + ["n1"] + [IDS[i] for i in keep[2:]] + ["n2"]
    n, inc, full = _incremental_and_full(lm, old, tmp_path, texts, ids, list(QUERIES))
    assert n == 2 * len(QUERIES)
    assert inc.tobytes() == full.tobytes()


def test_new_queries_alone_score_only_their_columns(lm, old, tmp_path):
    queries = list(QUERIES[::-1]) + ["tennis final", "cat"]  # the old queries in another order, two new
    n, inc, full = _incremental_and_full(lm, old, tmp_path, list(DOCS), IDS, queries)
    assert n == len(DOCS) * 2
    _assert_equal(inc, full, new_cols=[6, 7])


def test_float16_storage_reuses_its_own_bytes(lm, tmp_path):
    _score(lm, DOCS, IDS, QUERIES, tmp_path / "old16", dtype="float16")
    texts = list(DOCS)
    texts[0] = "the dog sat on the log"
    n, inc, full = _incremental_and_full(lm, tmp_path / "old16", tmp_path, texts, IDS, list(QUERIES),
                                         dtype="float16")
    assert n == len(QUERIES)
    assert inc.dtype == np.float16
    _assert_equal(inc, full)


def test_a_p_of_other_settings_is_not_reused(lm, old, tmp_path):
    texts = list(DOCS)
    texts[0] = "the dog sat on the log"
    # another storage dtype: its entries are not this P's bytes, so every pair is scored
    n, inc, full = _incremental_and_full(lm, old, tmp_path, texts, IDS, list(QUERIES), dtype="float16")
    assert n == len(DOCS) * len(QUERIES)
    assert "reused_from" not in json.loads((tmp_path / "inc" / "P.manifest.json").read_text())
    assert inc.tobytes() == full.tobytes()


def test_an_older_p_without_row_digests_is_not_reused(lm, old, tmp_path):
    import shutil

    legacy = tmp_path / "legacy"
    shutil.copytree(old, legacy)
    (legacy / "doc_texts.json").unlink()
    n, _, _ = _incremental_and_full(lm, legacy, tmp_path, list(DOCS), IDS, list(QUERIES))
    assert n == len(DOCS) * len(QUERIES)
