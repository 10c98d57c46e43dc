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

from gdr.data import Corpus
from gdr.io import write_jsonl
from gdr.stages.score import score_corpus, score_run
from gdr.stages.settings import SampleSettings, ScoreSettings
from gdr.store import load_run, text_digests

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


# ---------------------------------------------------------------------------- sampling and scoring together
SAMPLE = SampleSettings(n_queries=12, batch_size=4, max_new_tokens=5, seed=3)
SCORE = ScoreSettings(shard_size=3, doc_batch_size=1, max_query_tokens=2048)


def _counting(lm, monkeypatch):
    """Counters of the queries decoded and the (document, query) pairs scored through ``lm``."""
    seen = {"decoded": 0, "scored": 0}
    decode, score = lm.decode_queries, lm.score

    def decoding(docs, rows, *a, **k):
        seen["decoded"] += len(rows)
        return decode(docs, rows, *a, **k)

    def scoring(docs, queries, *a, **k):
        seen["scored"] += len(docs) * len(queries)
        return score(docs, queries, *a, **k)

    monkeypatch.setattr(lm, "decode_queries", decoding)
    monkeypatch.setattr(lm, "score", scoring)
    return seen


def test_an_edited_document_resamples_its_queries_and_rescores_its_row_and_their_columns(lm, tmp_path,
                                                                                         monkeypatch):
    before = Corpus(name="toy", doc_ids=IDS, texts=list(DOCS))
    score_corpus(before, lm, tmp_path / "before", SAMPLE, SCORE, progress=False)
    texts = list(DOCS)
    texts[0] = "the dog slept under the table all day"
    after = Corpus(name="toy", doc_ids=IDS, texts=texts)
    seen = _counting(lm, monkeypatch)
    score_corpus(after, lm, tmp_path / "inc", SAMPLE, SCORE, progress=False, reuse_from=tmp_path / "before")
    counts = dict(seen)
    score_corpus(after, lm, tmp_path / "full", SAMPLE, SCORE, progress=False)
    inc, full = load_run(tmp_path / "inc"), load_run(tmp_path / "full")
    assert inc.queries == full.queries  # the same queries, sampled again only where drawn from document 0
    from_edited = [j for j, q in enumerate(full.queries) if q["source_doc_id"] == "d0"]
    assert 0 < len(from_edited) < SAMPLE.n_queries  # the seed draws document 0 for some queries, not all
    assert counts["decoded"] == len(from_edited)
    # columns are matched by text: a re-drawn query the tiny model wrote before too keeps its column
    old_texts = {q["text"] for q in load_run(tmp_path / "before").queries}
    new_cols = [j for j, q in enumerate(full.queries) if q["text"] not in old_texts]
    assert new_cols and set(new_cols) <= set(from_edited)
    # its row against every query, then every other row against the columns of its new queries
    assert counts["scored"] == SAMPLE.n_queries + (len(DOCS) - 1) * len(new_cols)
    assert seen["scored"] - counts["scored"] == len(DOCS) * SAMPLE.n_queries  # what the full rescore scored
    _assert_equal(np.asarray(inc.logp), np.asarray(full.logp), new_cols=new_cols)
    assert inc.logp[0].tobytes() == full.logp[0].tobytes()


def test_index_add_scores_only_the_new_documents_rows(lm, tmp_path, monkeypatch):
    """``gdr index add``'s P (new documents over an indexed run's queries, ``queries_from=``) taking the rows of
    the documents that run scored already."""
    base = Corpus(name="toy", doc_ids=IDS[:5], texts=list(DOCS[:5]))
    score_corpus(base, lm, tmp_path / "run", SAMPLE, SCORE, progress=False)
    grown = Corpus(name="toy", doc_ids=IDS, texts=list(DOCS))
    seen = _counting(lm, monkeypatch)
    score_corpus(grown, lm, tmp_path / "add", SAMPLE, SCORE, progress=False, queries_from=tmp_path / "run",
                 reuse_from=tmp_path / "run")
    assert seen == {"decoded": 0, "scored": 2 * SAMPLE.n_queries}
    score_corpus(grown, lm, tmp_path / "full", SAMPLE, SCORE, progress=False, queries_from=tmp_path / "run")
    assert load_run(tmp_path / "add").logp.tobytes() == load_run(tmp_path / "full").logp.tobytes()


def test_a_changed_row_digest_file_is_not_trusted(lm, old, tmp_path):
    """``doc_texts.json`` edited after scoring (here: claiming an edited document is unchanged) reuses nothing."""
    import shutil

    forged = tmp_path / "forged"
    shutil.copytree(old, forged)
    digests = json.loads((forged / "doc_texts.json").read_text())
    texts = list(DOCS)
    texts[2] = "a document whose digest is forged below"
    digests[2] = text_digests(texts)[2]
    (forged / "doc_texts.json").write_text(json.dumps(digests))
    n, inc, full = _incremental_and_full(lm, forged, tmp_path, texts, IDS, list(QUERIES))
    assert n == len(DOCS) * len(QUERIES)
    assert inc.tobytes() == full.tobytes()


def test_queries_of_a_changed_digest_file_or_another_corpus_size_are_decoded_again(lm, tmp_path, monkeypatch):
    before = Corpus(name="toy", doc_ids=IDS, texts=list(DOCS))
    score_corpus(before, lm, tmp_path / "before", SAMPLE, SCORE, progress=False)
    (tmp_path / "before" / "doc_texts.json").write_text(json.dumps(text_digests(["forged"] + list(DOCS[1:]))))
    texts = ["forged"] + list(DOCS[1:])
    seen = _counting(lm, monkeypatch)
    score_corpus(Corpus(name="toy", doc_ids=IDS, texts=texts), lm, tmp_path / "forged", SAMPLE, SCORE,
                 progress=False, reuse_from=tmp_path / "before")
    assert seen["decoded"] == SAMPLE.n_queries
    seen["decoded"] = 0
    fewer = Corpus(name="toy", doc_ids=IDS[:-1], texts=list(DOCS[:-1]))  # other sources for every query
    score_corpus(fewer, lm, tmp_path / "fewer", SAMPLE, SCORE, progress=False, reuse_from=tmp_path / "forged")
    assert seen["decoded"] == SAMPLE.n_queries
