"""Incremental P: a P of an edited corpus built from an older P of the same model and settings samples and scores
only what it does not find there, and equals a full rescore of the new corpus byte for byte.

Under the per-document sampler (``sample.p_per_doc``) a document's queries depend only on its text, and P is
scored by source document (a packed chunk never mixes two documents' queries) one document per pass, so entry
(i, j) depends only on document i's text and the queries of j's source document: an edited document re-samples
its queries and re-scores its row and their columns, everything else is copied. Under the global sampler
(Algorithm 1's draws, all queries packed together) only the rows are reused, and only where the query list is
the same."""
from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
from tiny_models import DOCS, QUERIES, tiny_llama, tiny_t5

from gdr.data import Corpus
from gdr.io import write_jsonl
from gdr.stages.score import score_corpus, score_run
from gdr.stages.settings import SampleSettings, ScoreSettings
from gdr.store import load_run, text_digests

IDS = [f"d{i}" for i in range(len(DOCS))]
PER_DOC = SampleSettings(p_per_doc=2, batch_size=4, max_new_tokens=5, seed=3)
GLOBAL = SampleSettings(n_queries=12, batch_size=4, max_new_tokens=5, seed=3)
SCORE = ScoreSettings(shard_size=3, doc_batch_size=1, max_query_tokens=2048)


@pytest.fixture(scope="module")
def lm():
    return tiny_llama()


def _same_bytes(a, b) -> bool:
    """Equal bytes (NaN and -0.0 included), not equal to rounding."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------- the scorer, content-local
@pytest.mark.parametrize("make", [tiny_llama, tiny_t5], ids=["causal", "seq2seq"])
def test_a_query_groups_columns_depend_only_on_its_own_queries(make):
    """Scored by group, the columns of a group are the bytes of that group's queries scored alone, whatever
    other groups' queries are scored beside them; one group of all equals the default packing."""
    lm = make()
    groups = np.array([2, 0, 2, 1, 0, 1])  # (n_queries,) e.g. source documents, in any order
    kw = dict(doc_batch_size=1, max_query_tokens=2048, progress=False)
    P = lm.score(DOCS, QUERIES, groups=groups, **kw)
    for g in np.unique(groups):
        cols = np.flatnonzero(groups == g)
        alone = lm.score(DOCS, [QUERIES[j] for j in cols], groups=groups[cols], **kw)
        assert _same_bytes(P[:, cols], alone), g
    assert _same_bytes(lm.score(DOCS, QUERIES, groups=np.zeros(6, dtype=np.int64), **kw), lm.score(DOCS, QUERIES, **kw))


# ---------------------------------------------------------------------------- sampling and scoring together
def _counting(lm, monkeypatch):
    """Counters of the queries decoded and the (document, query) pairs scored through ``lm``."""
    seen = {"decoded": 0, "scored": 0}
    decode, score = lm.decode_ended, lm.score

    def decoding(docs, rows, *a, **k):
        seen["decoded"] += len(rows)
        return decode(docs, rows, *a, **k)

    def scoring(docs, queries, *a, **k):
        seen["scored"] += len(docs) * len(queries)
        return score(docs, queries, *a, **k)

    monkeypatch.setattr(lm, "decode_ended", decoding)
    monkeypatch.setattr(lm, "score", scoring)
    return seen


@pytest.fixture(scope="module")
def before(lm, tmp_path_factory):
    """The per-document run of the corpus before any change."""
    out = tmp_path_factory.mktemp("before")
    score_corpus(Corpus(name="toy", doc_ids=IDS, texts=list(DOCS)), lm, out, PER_DOC, SCORE, progress=False)
    return out


def _incremental_and_full(lm, old, tmp_path, monkeypatch, ids, texts, sample=PER_DOC, score=SCORE):
    """(what the incremental run decoded and scored, its run, a full rescore's run) of the corpus ``ids, texts``."""
    corpus = Corpus(name="toy", doc_ids=ids, texts=texts)
    seen = _counting(lm, monkeypatch)
    score_corpus(corpus, lm, tmp_path / "inc", sample, score, progress=False, reuse_from=old)
    counts = dict(seen)
    score_corpus(corpus, lm, tmp_path / "full", sample, score, progress=False)
    assert seen["scored"] - counts["scored"] == len(texts) * len(load_run(tmp_path / "full").queries)
    return counts, load_run(tmp_path / "inc"), load_run(tmp_path / "full")


def _check(counts, inc, full, n_new_docs: int, n_docs: int):
    """The incremental run equals the full one byte for byte and did only ``n_new_docs`` documents' work: their
    queries decoded, their rows against every query, the other rows against their queries."""
    assert inc.queries == full.queries
    assert _same_bytes(inc.logp, full.logp)
    k = PER_DOC.p_per_doc
    assert counts["decoded"] == k * n_new_docs
    assert counts["scored"] == n_new_docs * k * n_docs + (n_docs - n_new_docs) * k * n_new_docs
    assert inc.manifest["pairs_scored_last_call"] == counts["scored"]


def test_one_edited_document_rescores_its_row_and_its_queries_columns(lm, before, tmp_path, monkeypatch):
    texts = list(DOCS)
    texts[4] = "an edited document about rain in spain"
    counts, inc, full = _incremental_and_full(lm, before, tmp_path, monkeypatch, IDS, texts)
    _check(counts, inc, full, n_new_docs=1, n_docs=len(DOCS))
    assert inc.manifest["reused_from"] == str(before) and inc.manifest["query_chunks"] == "by_source"
    q_man = json.loads((tmp_path / "inc" / "queries.manifest.json").read_text())
    assert q_man["queries_reused"] == PER_DOC.p_per_doc * (len(DOCS) - 1)


def test_two_added_documents_score_their_rows_and_columns(lm, before, tmp_path, monkeypatch):
    ids, texts = IDS[:3] + ["n1"] + IDS[3:] + ["n2"], list(DOCS[:3]) + ["a new document on tennis"] + list(
        DOCS[3:]) + ["one more about golf"]
    counts, inc, full = _incremental_and_full(lm, before, tmp_path, monkeypatch, ids, texts)
    _check(counts, inc, full, n_new_docs=2, n_docs=len(texts))


def test_a_removed_document_scores_nothing(lm, before, tmp_path, monkeypatch):
    keep = [0, 1, 2, 4, 5, 6]
    counts, inc, full = _incremental_and_full(lm, before, tmp_path, monkeypatch, [IDS[i] for i in keep],
                                              [DOCS[i] for i in keep])
    _check(counts, inc, full, n_new_docs=0, n_docs=len(keep))


def test_other_settings_or_batched_rows_reuse_nothing_and_say_why(lm, before, tmp_path, monkeypatch, caplog):
    texts = list(DOCS)
    texts[0] = "the dog sat on the log"
    ids_texts = (IDS, texts)
    with caplog.at_level(logging.INFO, logger="gdr.store"):
        counts, inc, full = _incremental_and_full(lm, before, tmp_path / "f16", monkeypatch, *ids_texts,
                                                  score=SCORE.replace(dtype="float16"))
    assert counts["scored"] == len(DOCS) * len(full.queries) and "reused_from" not in inc.manifest
    assert _same_bytes(inc.logp, full.logp)
    assert "scored with other dtype" in caplog.text
    with caplog.at_level(logging.INFO, logger="gdr.stages.score"):
        counts, inc, full = _incremental_and_full(lm, before, tmp_path / "b2", monkeypatch, *ids_texts,
                                                  score=SCORE.replace(doc_batch_size=2))
    assert counts["scored"] == len(DOCS) * len(full.queries) and _same_bytes(inc.logp, full.logp)
    assert "score.doc_batch_size=2: a row's bytes depend on the documents padded beside it" in caplog.text


def test_a_changed_row_digest_file_or_an_older_p_without_one_is_not_trusted(lm, before, tmp_path, monkeypatch):
    """``doc_texts.json`` edited after scoring (here: claiming an edited document is unchanged) reuses nothing."""
    forged = tmp_path / "forged"
    shutil.copytree(before, forged)
    texts = list(DOCS)
    texts[2] = "a document whose digest is forged below"
    digests = json.loads((forged / "doc_texts.json").read_text())
    digests[2] = text_digests(texts)[2]
    (forged / "doc_texts.json").write_text(json.dumps(digests))
    counts, inc, full = _incremental_and_full(lm, forged, tmp_path / "a", monkeypatch, IDS, texts)
    assert counts["decoded"] == len(full.queries) and counts["scored"] == len(DOCS) * len(full.queries)
    assert _same_bytes(inc.logp, full.logp)
    (forged / "doc_texts.json").unlink()
    counts, _, full = _incremental_and_full(lm, forged, tmp_path / "b", monkeypatch, IDS, texts)
    assert counts["scored"] == len(DOCS) * len(full.queries)


# ---------------------------------------------------------------------------- the global sampler
def test_global_sampler_reuses_rows_only_for_the_same_queries(lm, tmp_path, monkeypatch):
    """Algorithm 1's draws: all queries are packed together, so rows are reused only where the query list is
    the same (an edited document no query was drawn from, or one that gave the same queries again); an edit that
    changes a query reuses no entry."""
    few = GLOBAL.replace(n_queries=4)  # fewer queries than documents: some document is no query's source
    score_corpus(Corpus(name="toy", doc_ids=IDS, texts=list(DOCS)), lm, tmp_path / "old", few, SCORE,
                 progress=False)
    old = [q["text"] for q in load_run(tmp_path / "old").queries]
    sources = {q["source_index"] for q in load_run(tmp_path / "old").queries}
    for k, edited in enumerate((min(set(range(len(DOCS))) - sources), min(sources))):
        texts = list(DOCS)
        texts[edited] = "a rewritten story on tennis and golf"
        counts, inc, full = _incremental_and_full(lm, tmp_path / "old", tmp_path / str(k), monkeypatch, IDS,
                                                  texts, sample=few)
        assert inc.queries == full.queries and _same_bytes(inc.logp, full.logp)
        same = [q["text"] for q in full.queries] == old
        assert same or k == 1  # the unsourced document's edit leaves every query as it was
        assert counts["scored"] == len(old) * (1 if same else len(DOCS))


def test_index_add_scores_only_the_new_documents_rows(lm, tmp_path, monkeypatch):
    """``gdr index add``'s P (new documents over an indexed run's queries, ``queries_from=``) taking the rows of
    the documents that run scored already."""
    base = Corpus(name="toy", doc_ids=IDS[:5], texts=list(DOCS[:5]))
    score_corpus(base, lm, tmp_path / "run", GLOBAL, SCORE, progress=False)
    grown = Corpus(name="toy", doc_ids=IDS, texts=list(DOCS))
    seen = _counting(lm, monkeypatch)
    score_corpus(grown, lm, tmp_path / "add", GLOBAL, SCORE, progress=False, queries_from=tmp_path / "run",
                 reuse_from=tmp_path / "run")
    assert seen == {"decoded": 0, "scored": 2 * GLOBAL.n_queries}
    score_corpus(grown, lm, tmp_path / "full", GLOBAL, SCORE, progress=False, queries_from=tmp_path / "run")
    assert _same_bytes(load_run(tmp_path / "add").logp, load_run(tmp_path / "full").logp)


def test_score_run_reuses_rows_of_the_same_query_list_only(lm, tmp_path, caplog):
    """``score_run`` with given queries packed together: the rows of unchanged documents are copied, the others
    scored; another query list reuses nothing, with one log line why."""
    def run(out, texts, queries=QUERIES, **kw):
        out.mkdir(parents=True)
        write_jsonl(out / "queries.jsonl", ({"qid": f"q{j}", "text": q} for j, q in enumerate(queries)))
        score_run(lm, texts, IDS, queries, out, shard_size=3, progress=False, **kw)
        return load_run(out)

    run(tmp_path / "old", list(DOCS))
    texts = list(DOCS)
    texts[1] = "stocks rose on tuesday"
    inc, full = run(tmp_path / "inc", texts, reuse_from=tmp_path / "old"), run(tmp_path / "full", texts)
    assert inc.manifest["pairs_scored_last_call"] == len(QUERIES) and _same_bytes(inc.logp, full.logp)
    queries = list(QUERIES[:-1]) + ["tennis final"]
    with caplog.at_level(logging.INFO, logger="gdr.store"):
        inc = run(tmp_path / "other", texts, queries, reuse_from=tmp_path / "old")
    assert inc.manifest["pairs_scored_last_call"] == len(DOCS) * len(QUERIES) and "reused_from" not in inc.manifest
    assert "no query group of it is this P's (all queries packed together: other queries)" in caplog.text
