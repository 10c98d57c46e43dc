"""Tests for title queries (gdr.data.titles), drop_title, the Cranfield query split and conf/data/*.yaml:
toy corpora whose answers are known by construction, then the real BBC, Reuters and Cranfield files."""
from __future__ import annotations

import inspect
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

import gdr
from gdr.config import load_config
from gdr.data import (
    CORPORA,
    QUERY_KEYS,
    Corpus,
    DataError,
    corpus_from_config,
    drop_titles,
    load_corpus,
    load_queries,
    load_title_queries,
    title_queries,
)
from gdr.data.cranfield import query_splits
from gdr.data.titles import split_of

CONF = Path(gdr.__file__).resolve().parents[1] / "conf" / "data"
FRACTIONS = {"train": 0.8, "dev": 0.1, "test": 0.1}


def _near_fractions(splits: list[str], fractions: dict[str, float]) -> None:
    """Each split's share is within 4 binomial standard deviations of its fraction (hash splits are not exact)."""
    n, counts = len(splits), Counter(splits)
    for s, f in fractions.items():
        assert abs(counts[s] / n - f) < 4 * np.sqrt(f * (1 - f) / n), (s, counts[s], n)


# ----------------------------------------------------------------------------- toy corpus

@pytest.fixture
def toy() -> Corpus:
    return Corpus(
        name="toy",
        doc_ids=["a", "b", "c", "d", "e", "f"],
        texts=["alpha body", "beta body", "gamma body", "gamma body", "delta body", "epsilon body"],
        titles=["Alpha", "Twin", "Gamma one", "Gamma two", None, "Twin"],
        labels=["x", "x", "y", "y", "x", "y"],
    )


def test_title_queries_toy_drop_duplicates(toy):
    qs = title_queries(toy)
    # e: no title; b, f: the same title; c, d: the same text -> only a has a query that singles out its article
    assert qs.qids == ["a"] and qs.texts == ["Alpha"] and qs.relevant == [["a"]]
    assert qs.name == "toy-titles"
    assert qs.info["filtered"] == {"no_title": 1, "shared_title": 2, "shared_text": 2}


def test_title_queries_toy_keep_duplicates(toy):
    qs = title_queries(toy, duplicates="keep")
    assert qs.qids == ["a", "b", "c", "d", "f"]
    assert qs.texts == ["Alpha", "Twin", "Gamma one", "Gamma two", "Twin"]
    assert qs.relevant == [[d] for d in qs.qids]
    assert qs.splits == split_of(qs.qids, seed=0)
    assert qs.info["filtered"] == {"no_title": 1}


def _story(words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(f"w{i}" for i in rng.integers(0, 10_000, words))


def test_a_near_copy_of_another_text_or_title_gets_no_query():
    base, other = _story(200, 0), _story(200, 1)
    texts = [base, base.replace("w", "W", 1) + " One sentence more.", other, other[: len(other) // 2], _story(200, 2),
             _story(200, 3), _story(3, 4)]
    # 0 ~ 1: the same story, a word's case and a sentence changed (Jaccard 0.97); 2 ~ 3: a half is no near copy
    toy = Corpus.from_texts(texts, titles=["One", "Two", "Three", "Four", "Five, dogged", "five dogged", "Seven"])
    qs = title_queries(toy)
    assert qs.qids == ["2", "3", "6"]  # 4 ~ 5: one title but for case and punctuation; 6: too short to compare
    assert qs.info["filtered"] == {"shared_title": 2, "near_text": 2}
    assert title_queries(toy, duplicates="keep").qids == toy.doc_ids


def test_drop_titles_strips_a_repeated_title_in_any_script():
    for title in ("Cafe owners protest", "Café owners protest", "Προστασία δεδομένων"):
        out = drop_titles(Corpus.from_texts([f"{title}. Owners marched on Monday."], titles=[title]))
        assert out.texts == ["Owners marched on Monday."] and out.info["repeated_titles_stripped"] == 1, title
    # a longer word that begins like the title's last is no repeat of it
    out = drop_titles(Corpus.from_texts(["Café owners protestéd today."], titles=["Café owners protest"]))
    assert out.texts == ["Café owners protestéd today."]


def test_split_depends_on_doc_id_and_seed_only():
    ids = [f"doc{i}" for i in range(2000)]
    full = split_of(ids, seed=3)
    assert split_of(ids[::7], seed=3) == full[::7]  # other documents do not matter
    assert split_of(list(reversed(ids)), seed=3) == full[::-1]  # nor does their order
    assert split_of(ids, seed=3) == full and split_of(ids, seed=4) != full
    _near_fractions(full, FRACTIONS)
    assert set(split_of(ids, fractions=(1, 0, 0))) == {"train"}
    assert Counter(split_of(ids, fractions=(0.5, 0, 0.5))).keys() == {"train", "test"}


@pytest.mark.parametrize("kw, match", [
    ({"fractions": (0.8, 0.1)}, r"fractions=\(0\.8, 0\.1\); give three non-negative numbers"),
    ({"fractions": (0.8, 0.3, -0.1)}, "give three non-negative numbers"),
    ({"fractions": (0.5, 0.1, 0.1)}, "that sum to 1"),
    ({"duplicates": "merge"}, r"duplicates='merge'; use one of \('drop', 'keep'\)"),
])
def test_title_queries_bad_arguments(toy, kw, match):
    with pytest.raises(ValueError, match=match):
        title_queries(toy, **kw)


def test_title_queries_need_titles(toy):
    with pytest.raises(DataError, match="corpus 'toy' has no titles, so it has no title queries; load it without "
                                        "drop_title=True"):
        title_queries(drop_titles(toy))
    untitled_twins = Corpus("t", ["a", "b"], ["x", "y"], titles=["Same", "Same"])
    with pytest.raises(DataError, match="no document has a title of its own"):
        title_queries(untitled_twins)


def test_drop_titles_toy(toy):
    out = drop_titles(toy)
    assert out.titles is None and out.model_inputs() == toy.texts
    assert (out.doc_ids, out.texts, out.labels) == (toy.doc_ids, toy.texts, toy.labels)
    assert out.info["titles_dropped"] and "titles_dropped" not in toy.info and toy.titles is not None


# ----------------------------------------------------------------------------- BBC (real)

@pytest.fixture(scope="module")
def bbc() -> Corpus:
    return load_corpus("bbc")


@pytest.fixture(scope="module")
def bbc_queries():
    return load_title_queries("bbc")


def test_bbc_title_queries(bbc, bbc_queries):
    qs = bbc_queries
    # 2,225 articles; 130 titles are shared by two articles (260, one pair in its punctuation only), 68 more share
    # their body with another, and 6 more nearly (3 pairs: a word or a sentence changed)
    assert len(bbc) == 2225 and len(qs) == 2225 - 260 - 68 - 6 == 1891
    assert qs.info["filtered"] == {"shared_title": 260, "shared_text": 68, "near_text": 6}
    assert Counter(qs.splits) == {"train": 1536, "dev": 201, "test": 154}  # seed 0, pinned
    _near_fractions(qs.splits, FRACTIONS)
    # one query per document, each document in exactly one split, the title is the query
    assert len(set(qs.qids)) == len(qs) and all(r == [q] for q, r in zip(qs.qids, qs.relevant))
    pos = bbc.indices(qs.qids)
    assert qs.texts == [bbc.titles[i] for i in pos]
    assert sum(len(load_title_queries("bbc", s)) for s in ("train", "dev", "test")) == len(qs)
    assert set(load_title_queries("bbc", "test").qids).isdisjoint(load_title_queries("bbc", "train").qids)
    # "Jobs growth still slow in the US" heads two articles: neither gets a query
    twins = [d for d, t in zip(bbc.doc_ids, bbc.titles) if t == "Jobs growth still slow in the US"]
    assert len(twins) == 2 and not set(twins) & set(qs.qids)
    # "Federer claims Dubai crown" (sports/425) and "Dogged Federer claims Dubai crown" (sports/433) head one article
    # with a word changed; "Nasdaq planning $100m share sale" and "... $100m-share sale" one title: no query each
    assert not {"sports/425", "sports/433", "business/267", "business/365"} & set(qs.qids)


def test_bbc_html_character_references_are_decoded(bbc):
    assert not any("&#" in x or "&lt;" in x for x in (*bbc.texts, *bbc.titles))
    titles = dict(zip(bbc.doc_ids, bbc.titles))
    assert sorted(t for t in titles.values() if "£8m" in t or "£1.8m" in t) == [
        "Tottenham bid £8m for Forest duo", "£1.8m indecency fine for Viacom"]


def test_bbc_split_is_stable_under_subsampling(bbc_queries):
    full = dict(zip(bbc_queries.qids, bbc_queries.splits))
    sub = load_corpus("bbc", n_docs=100, seed=5)
    qs = title_queries(sub)
    # a subsample can only lose twins, so it drops at most the queries the full corpus drops
    assert len(qs) >= sum(d in full for d in sub.doc_ids) > 70
    assert all(full[q] == s for q, s in zip(qs.qids, qs.splits) if q in full)
    assert qs.splits == split_of(qs.qids)


def test_bbc_drop_title(bbc):
    art = load_corpus("bbc", drop_title=True)
    assert art.titles is None and art.doc_ids == bbc.doc_ids and art.texts == bbc.texts
    assert art.model_inputs() == bbc.texts
    # the title (the file's first line) is not repeated at the start of the article
    assert not any(x.lower().startswith(t.lower()) for t, x in zip(bbc.titles, bbc.texts))
    assert not any(t in x.split("\n", 1)[0] for t, x in zip(bbc.titles, bbc.texts))
    sub = load_corpus("bbc", drop_title=True, n_docs=50, seed=1)
    assert sub.titles is None and sub.doc_ids == load_corpus("bbc", n_docs=50, seed=1).doc_ids


def test_drop_title_from_config():
    cfg = load_config("score", ["data=bbc", "data.drop_title=true", "data.n_docs=20"])
    c = corpus_from_config(cfg.data)
    assert len(c) == 20 and c.titles is None
    assert corpus_from_config(load_config("score", ["data=bbc", "data.n_docs=20"]).data).titles is not None


# ----------------------------------------------------------------------------- Reuters (real)

@pytest.fixture(scope="module")
def r5() -> Corpus:
    return load_corpus("r5")


def test_reuters_title_queries(r5):
    qs = title_queries(r5)
    assert len(qs) == 6807 - 314 - 20 - 12 == 6461
    assert qs.info["filtered"] == {"shared_title": 314, "shared_text": 20, "near_text": 12}
    assert Counter(qs.splits) == {"train": 5136, "dev": 647, "test": 678}
    # "PARTNERS CALL GENCORP <GY> RESPONSE UNPRODUCTIVE" and "... GENCORP<GY> ...": one headline
    assert not {"11253", "11161"} & set(qs.qids)
    _near_fractions(qs.splits, FRACTIONS)
    # R2's queries: every R2 story keeps the split it has in R5 (splits are by doc id)
    r2 = load_title_queries("r2")
    assert len(r2) == 5676 and Counter(r2.splits) == {"train": 4525, "dev": 563, "test": 588}
    in_r5 = dict(zip(qs.qids, qs.splits))
    assert all(in_r5[q] == s for q, s in zip(r2.qids, r2.splits) if q in in_r5)


def test_reuters_drop_title(r5):
    art = load_corpus("r5", drop_title=True)
    assert art.titles is None and art.model_inputs() == r5.texts
    # the headline (TITLE tag) is not part of the BODY: no story starts with it
    assert not any(x.startswith(t) for t, x in zip(r5.titles, r5.texts))
    # one lead sentence reads like its headline in lower case; it is the story's own first sentence
    same_words = [d for d, t, x in zip(r5.doc_ids, r5.titles, r5.texts) if x.lower().startswith(t.lower())]
    assert same_words == ["5692"]


def test_load_title_queries_other_names():
    with pytest.raises(ValueError, match="'cranfield' has no title queries; title queries exist for bbc, r2, r5"):
        load_title_queries("cranfield")
    with pytest.raises(ValueError, match=r"'bbc' has no query set .*load_title_queries\('bbc'\)"):
        load_queries("bbc")


# ----------------------------------------------------------------------------- Cranfield split

def test_cranfield_query_split(data_dir):
    qs = load_queries("cranfield", path=data_dir / "cranfield")
    assert len(qs) == 225 and qs.qids == [str(i) for i in range(1, 226)]
    assert Counter(qs.splits) == {"train": 135, "dev": 22, "test": 68}
    parts = {s: load_queries("cranfield", s, path=data_dir / "cranfield").qids for s in ("train", "dev", "test")}
    assert sorted(sum(parts.values(), []), key=int) == qs.qids  # disjoint and complete
    assert [q for q, s in zip(qs.qids, qs.splits) if s == "test"] == parts["test"]
    again = load_queries("cranfield", path=data_dir / "cranfield")
    assert again.splits == qs.splits and qs.info["split"]["seed"] == 0
    assert query_splits(225, seed=1) != qs.splits and Counter(query_splits(225, seed=1)) == Counter(qs.splits)


def test_cranfield_query_split_sizes():
    assert Counter(query_splits(2)) == {"train": 1, "test": 1}
    assert Counter(query_splits(10)) == {"train": 6, "dev": 1, "test": 3}
    with pytest.raises(ValueError, match="sum to 1"):
        query_splits(10, fractions=(0.6, 0.1, 0.1))


# ----------------------------------------------------------------------------- conf/data

def test_conf_data_has_every_corpus():
    assert sorted(p.stem for p in CONF.glob("*.yaml")) == sorted(CORPORA)


@pytest.mark.parametrize("name", CORPORA)
def test_conf_data_composes(name):
    over = ["data.path=/some/beir/folder"] if name == "beir" else []
    data = load_config("score", [f"data={name}", *over]).data
    assert data.name == name and data.seed == 0 and data.n_docs is None
    # every key is a load_corpus keyword, so corpus_from_config can pass them through (but the query files of a
    # file of documents, which the query side reads)
    files = name in ("jsonl", "tsv", "trec", "irds")
    query_side = set(QUERY_KEYS) if files else {"drop_unknown_qrels", "min_relevance"} if name == "beir" else set()
    query_side |= {"id"} if name == "irds" else set()  # data.id: corpus_from_config makes it the name irds:<id>
    assert set(data) - {"name"} <= set(inspect.signature(load_corpus).parameters) | query_side
    assert ("drop_title" in data) == (name in ("bbc", "cranfield", "r2", "r5", "reuters") or files)
    assert ("docs_tsv" in data) == (name in ("msmarco-lite", "nq320k"))


def test_conf_beir_needs_a_path():
    assert OmegaConf.is_missing(OmegaConf.load(CONF / "beir.yaml"), "path")
    assert OmegaConf.is_missing(load_config("score", ["data=beir"]).data, "path")
