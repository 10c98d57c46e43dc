"""TREC test collections as distributed (data=trec): SGML documents, topics and trec_eval qrels with the quirks real
collections have, read wherever documents, queries and judgements are read; a Cranfield slice in TREC form through
`gdr run data=trec`. Offline, CPU, tiny models."""
from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import pytest
from test_pipeline import _args, setup  # noqa: F401  (module fixture: a saved tiny LM and a 30-document corpus)

from gdr.cli import main
from gdr.data import Corpus, DataError, QuerySet, load_corpus, load_cranfield, load_cranfield_queries, write_beir
from gdr.data.beir import load_beir_queries
from gdr.data.files import load_docs_file, load_file_queries
from gdr.data.trec import load_trec, qrels_form, read_trec_topics, sniff

FT = """<DOC>
<DOCNO> FT911-1 </DOCNO>
<PROFILE>_AN-BEOA7AAIFT</PROFILE>
<HEADLINE>Foreign
   minorities &amp; Germany</HEADLINE>
<TEXT>
<P>The first paragraph.</P>
<P>Second   one.</P>
</TEXT>
</DOC>
"""
LA = """<doc id="la-1">
  <docno>LA010189-0001</docno>
  <HEAD lang="en">Hospital   costs</HEAD>
  <TEXT>Part one.</TEXT>
  <GRAPHIC>a chart</GRAPHIC>
  <TEXT>Part two.</TEXT>
</doc>

<DOC>
<DOCNO>LA010189-0002</DOCNO>
<TITLE>Title beats headline</TITLE><HEADLINE>not this</HEADLINE>
<TEXT>Body.</TEXT>
</DOC>
"""
TOPICS = """<top>
<num> Number: 401
<title> foreign minorities,
Germany

<desc> Description:
What language and cultural differences impede the integration?

<narr> Narrative:
A relevant document will focus on the causes.
</top>

<top>
<num> Number: 402 </num>
<title> Topic: behavioral genetics </title>
<desc> Description: </desc>
</top>
"""


@pytest.fixture
def collection(tmp_path):
    """A folder of two SGML files (one gzipped) and a README, topics and trec_eval qrels (graded)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ft911.sgml").write_text(FT)
    (docs / "la010189.gz").write_bytes(gzip.compress(LA.encode()))
    (docs / "README").write_text("Disk 4 and 5, read me first\n")
    (tmp_path / "topics.401-402").write_text(TOPICS)
    (tmp_path / "qrels.401-402.txt").write_text(
        "401 0 FT911-1 2\n401 0 LA010189-0001 0\n401 0 LA010189-0002 1\n402 0 LA010189-0001 1\n")
    return tmp_path


def test_trec_documents_with_real_quirks(collection, caplog):
    caplog.set_level(logging.INFO, logger="gdr.data.trec")
    c = load_corpus("trec", path=collection / "docs")
    assert c.doc_ids == ["FT911-1", "LA010189-0001", "LA010189-0002"] and c.name == "docs"
    assert c.texts == ["The first paragraph. Second one.", "Part one. Part two.", "Body."]
    assert c.titles == ["Foreign minorities & Germany", "Hospital costs", "Title beats headline"]
    assert "1 files hold no TREC SGML (e.g. README)" in caplog.text
    # a file or a folder given as the corpus is recognised by its content
    assert load_corpus(str(collection / "docs" / "la010189.gz")).doc_ids == ["LA010189-0001", "LA010189-0002"]
    assert load_corpus(str(collection / "docs")).doc_ids == c.doc_ids
    # fields chosen by name
    g = load_trec(collection / "docs" / "la010189.gz", text_fields=["GRAPHIC", "TEXT"], title_fields=None)
    assert g.texts[0] == "Part one. a chart Part two." and g.titles is None


@pytest.mark.parametrize("text, message", [
    ("<DOC>\n<TEXT>x</TEXT>\n</DOC>\n", r"bad\.sgml:1: <DOC> without a <DOCNO>"),
    ("<DOC><DOCNO>a</DOCNO><TEXT>x</TEXT></DOC>\n<DOC>\n<DOCNO>b</DOCNO>\n", r"bad\.sgml:2: <DOC> is never closed"),
    ("<DOC><DOCNO>a</DOCNO>\n<DOC><DOCNO>b</DOCNO></DOC>\n", r"bad\.sgml:2: <DOC> inside a <DOC>"),
    ("<DOC>\n<DOCNO>a</DOCNO>\n<TITLE>x</TITLE>\n</DOC>\n",
     r"bad\.sgml:1: document 'a' has no <TEXT> nor text of its own \(its fields: DOCNO, TITLE\); "
     r".*data\.text_fields"),
    ("<DOC>\n<DOCNO> D\t023 </DOCNO>\n<TEXT>x</TEXT>\n</DOC>\n",
     r"bad\.sgml:2: <DOCNO> 'D\\t023' holds whitespace; a DOCNO is one token"),
    ("<DOC>\n<DOCNO>a</DOCNO>\n<TEXT>x</TEXT>\n<DOCNO>b</DOCNO>\n</DOC>\n",
     r"bad\.sgml:4: a second <DOCNO> \('b'\) in document 'a' \(its <DOC> is at line 1\)"),
    ("<DOC>\n<DOCNO>a</DOCNO><TEXT>x</TEXT></DOC>\n<DOC><DOCNO>a</DOCNO><TEXT>y</TEXT></DOC>\n",
     r"bad\.sgml:3: duplicate doc_id 'a' \(first seen at .*bad\.sgml:1\)"),
    ("<DOC><DOCNO>a</DOCNO><TEXT>caf\xe9</TEXT></DOC>\n", r"bad\.sgml:1: byte .* data\.encoding=latin-1"),
    ("<DOC>\n<DOCNO> A1 </DOCNO>\n<TEXT>hello world\n</DOC>\n",  # not an empty document: its field is unclosed
     r"bad\.sgml:1: document 'A1' opens <TEXT> 1 time\(s\) and closes it 0; close each field \(</TEXT>\)"),
])
def test_bad_trec_documents_name_the_line_and_the_fix(tmp_path, text, message):
    (tmp_path / "bad.sgml").write_bytes(text.encode("latin-1"))
    with pytest.raises(DataError, match=message):
        load_trec(tmp_path / "bad.sgml")


def _cranfield_forms(folder: Path, n_docs: int = 40) -> dict[str, Path]:
    """The first ``n_docs`` non-empty Cranfield documents as one TREC file in each form a collection comes in: the
    text in <TEXT> (title in <TITLE>), the text in <P> markup directly in <DOC> (title in <HEAD>), and the bare text
    directly in <DOC> (title in <HEADLINE>)."""
    c = load_cranfield()
    c = c.select([i for i, x in enumerate(c.texts) if x.strip()][:n_docs])
    rows = list(zip(c.doc_ids, c.titles, c.texts))
    forms = {
        "text": "".join(f"<DOC>\n<DOCNO> {d} </DOCNO>\n<TITLE>{t}</TITLE>\n<TEXT>\n{x}\n</TEXT>\n</DOC>\n"
                        for d, t, x in rows),
        "body": "".join(f"<DOC>\n<DOCNO>{d}</DOCNO>\n<HEAD>{t}</HEAD>\n<P>\n{x}\n</P>\n</DOC>\n" for d, t, x in rows),
        "bare": "".join(f"<DOC>\n<DOCNO>{d}</DOCNO>\n<HEADLINE>{t}</HEADLINE>\n{x}\n</DOC>\n" for d, t, x in rows),
    }
    out = {}
    for form, text in forms.items():
        out[form] = folder / f"cran.{form}"
        out[form].write_text(text)
    return out


def test_any_trec_body_gives_the_same_corpus(tmp_path, caplog):
    """with or without <TEXT>, with <HEAD>/<TITLE>/<HEADLINE> titles, one Cranfield slice reads to
    the same documents; a <DOC> without a text field gives its body (minus DOCNO and the title), said in the log."""
    caplog.set_level(logging.INFO, logger="gdr.data.trec")
    files = _cranfield_forms(tmp_path)
    with_text = load_trec(files["text"])
    assert len(with_text) == 40 and all(x.strip() for x in with_text.texts)
    assert "have no <TEXT>" not in caplog.text
    for form in ("body", "bare"):
        got = load_corpus("trec", path=files[form])
        assert got.doc_ids == with_text.doc_ids and got.titles == with_text.titles
        assert got.texts == with_text.texts, form
        assert f"{files[form]}: 40 of 40 documents have no <TEXT>: their text is the body of <DOC>" in caplog.text
    # a mixed file: documents with <TEXT> keep only it, the others give their body
    (tmp_path / "mixed.sgml").write_text("<DOC><DOCNO>a</DOCNO><DATE>1990</DATE><TEXT>inside</TEXT>outside</DOC>\n"
                                         "<DOC><DOCNO>b</DOCNO><HEAD>t</HEAD>just &amp; this</DOC>\n")
    mixed = load_trec(tmp_path / "mixed.sgml")
    assert mixed.texts == ["inside", "just & this"] and mixed.titles == [None, "t"]


@pytest.mark.parametrize("fields, message", [
    (["DOCNO"], r"text_fields=\['DOCNO'\]: DOCNO is the document's id, not its text"),
    (["docno", "TEXT"], r"text_fields=\['docno', 'TEXT'\]: DOCNO is the document's id"),
    (["DOCID"], r"ids\.sgml:1: data\.text_fields=\[DOCID\]: every document's text is one id-like token \(here "
                r"'FBIS3-1' of 'a'\): these fields hold ids"),
])
def test_a_text_field_of_ids_is_refused(tmp_path, fields, message):
    (tmp_path / "ids.sgml").write_text("<DOC>\n<DOCNO>a</DOCNO><DOCID>FBIS3-1</DOCID><TEXT>words here</TEXT></DOC>\n"
                                       "<DOC><DOCNO>b</DOCNO><DOCID>FBIS3-2</DOCID><TEXT>more</TEXT></DOC>\n")
    with pytest.raises(ValueError, match=message):
        load_trec(tmp_path / "ids.sgml", text_fields=fields)


def test_text_fields_docno_is_refused_at_the_door(collection):
    from gdr.config import load_config
    from gdr.validate import ConfigError, validate

    with pytest.raises(ConfigError, match=r"data\.text_fields=\[DOCNO\]: DOCNO is the document's id, not its text"):
        validate("run", load_config("run", ["data=trec", f"data.path={collection / 'docs'}",
                                            "data.text_fields=[DOCNO]"]))


def test_a_truncated_archive_is_refused_naming_it_anywhere(tmp_path):
    """a .gz cut short is refused with its file and line, as a single file, in a folder of
    TREC SGML (where it used to be left out with an INFO line) and as a .jsonl.gz of documents."""
    sgml = "".join(f"<DOC>\n<DOCNO>d{i}</DOCNO>\n<TEXT>document {i} {'word ' * 40}</TEXT>\n</DOC>\n"
                   for i in range(100))
    gz = gzip.compress(sgml.encode())
    (tmp_path / "one.gz").write_bytes(gz[: len(gz) // 2])
    with pytest.raises(DataError, match=r"one\.gz:\d+: the gzip archive ends early or is damaged here"):
        load_trec(tmp_path / "one.gz")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.sgml").write_text(sgml)
    for cut in (len(gz) // 2, 12):  # cut in the middle, and inside the first block (nothing to sniff)
        (docs / "b.gz").write_bytes(gz[:cut])
        with pytest.raises(DataError, match=r"docs/b\.gz:\d+: the gzip archive ends early"):
            load_corpus("trec", path=docs)
    jsonl = "".join(f'{{"id": "d{i}", "text": "document {i} {"word " * 40}"}}\n' for i in range(100)).encode()
    gj = gzip.compress(jsonl)
    (tmp_path / "docs.jsonl.gz").write_bytes(gj[: len(gj) // 2])
    with pytest.raises(DataError, match=r"docs\.jsonl\.gz:\d+: the gzip archive ends early"):
        load_docs_file(tmp_path / "docs.jsonl.gz")


def test_missing_text_is_an_empty_document_by_choice(tmp_path):
    (tmp_path / "d.sgml").write_text("<DOC><DOCNO>a</DOCNO><TITLE>Only a title</TITLE></DOC>\n"
                                     "<DOC><DOCNO>b</DOCNO><TEXT>text</TEXT></DOC>\n")
    assert load_trec(tmp_path / "d.sgml", on_empty="drop").doc_ids == ["b"]
    assert load_trec(tmp_path / "d.sgml", on_empty="title").texts == ["Only a title", "text"]
    latin = tmp_path / "l.sgml"
    latin.write_bytes("<DOC><DOCNO>c</DOCNO><TEXT>caf\xe9</TEXT></DOC>\n".encode("latin-1"))
    assert load_trec(latin, encoding="latin-1").texts == ["caf\xe9"]


def test_trec_topics_numbers_multiline_titles_and_fields(collection, tmp_path):
    rows = read_trec_topics(collection / "topics.401-402")
    assert rows == [(1, {"_id": "401", "text": "foreign minorities, Germany"}),
                    (13, {"_id": "402", "text": "behavioral genetics"})]
    both = read_trec_topics(collection / "topics.401-402", ["title", "desc"])
    assert both[0][1]["text"] == "foreign minorities, Germany What language and cultural differences impede the " \
                                 "integration?"
    assert both[1][1]["text"] == "behavioral genetics"  # an empty <desc> adds nothing
    (tmp_path / "one").write_text(TOPICS.split("</top>")[0] + "</top>\n")
    assert read_trec_topics(tmp_path / "one", ["narr"])[0][1]["text"] == "A relevant document will focus on the causes."
    with pytest.raises(DataError, match=r"topics\.401-402:13: topic '402' has no <narr>; .*data\.topic_fields"):
        read_trec_topics(collection / "topics.401-402", ["narr"])
    with pytest.raises(ValueError, match=r"data\.topic_fields=\['summary'\]: choose among title, desc, narr"):
        read_trec_topics(collection / "topics.401-402", ["summary"])
    (tmp_path / "nonum").write_text("<top>\n<title> x\n</top>\n")
    with pytest.raises(DataError, match=r"nonum:1: <top> without a <num>"):
        read_trec_topics(tmp_path / "nonum")


def test_trec_qrels_keep_grades_and_take_a_threshold(collection):
    ids = ["FT911-1", "LA010189-0001", "LA010189-0002"]
    qs = load_file_queries(collection / "topics.401-402", collection / "qrels.401-402.txt", doc_ids=ids)
    assert qs.split_names == ["test"] and qs.qids == ["401", "402"]
    assert qs.relevant == [["FT911-1", "LA010189-0002"], ["LA010189-0001"]] and qs.grades == [[2, 1], [1]]
    strict = load_file_queries(collection / "topics.401-402", collection / "qrels.401-402.txt", doc_ids=ids,
                               min_relevance=2)
    assert strict.qids == ["401"] and strict.relevant == [["FT911-1"]]
    assert qrels_form("401 0 FT911-1 2") == "trec" and qrels_form("q1\td1\t1") == "beir"
    assert qrels_form("401 0 FT911-1") is None


def test_trec_qrels_are_read_where_beir_qrels_are_expected(tmp_path, caplog):
    corpus = Corpus.from_texts(["a", "b", "c"], ids=["d1", "d2", "d3"])
    qs = QuerySet("q", ["q1", "q2"], ["one", "two"], [["d1"], ["d2"]], ["test", "test"])
    folder = write_beir(corpus, qs, tmp_path / "beir")
    (folder / "qrels" / "test.tsv").write_text("q1 0 d1 1\nq1 0 d3 3\nq2 Q0 d2 -1\n")
    caplog.set_level(logging.INFO, logger="gdr.data.beir")
    got = load_beir_queries(folder)
    assert got.qids == ["q1"] and got.relevant == [["d1", "d3"]] and got.grades == [[1, 3]]
    assert "test.tsv: read as trec_eval qrels" in caplog.text
    (folder / "qrels" / "test.tsv").write_text("q1 0 d1 1\nq2 0 d2\n")
    with pytest.raises(DataError, match=r"test\.tsv:2: expected 4 whitespace-separated columns of trec_eval qrels"):
        load_beir_queries(folder)
    (folder / "qrels" / "test.tsv").write_text("q1,d1,1\n")
    with pytest.raises(DataError, match=r"test\.tsv:1: neither BEIR qrels .* nor trec_eval qrels"):
        load_beir_queries(folder)


def test_messages_name_the_trec_form_they_found(collection):
    from gdr.config import load_config
    from gdr.validate import ConfigError, validate

    sgml = collection / "docs" / "ft911.sgml"
    trec_named_jsonl = collection / "doc-text.jsonl"
    trec_named_jsonl.write_text(FT)
    assert sniff(sgml) == "trec-docs" and sniff(collection / "topics.401-402") == "trec-topics"
    assert sniff(collection / "qrels.401-402.txt") == "trec-qrels" and sniff(collection / "nothing") is None
    with pytest.raises(DataError, match=r"doc-text\.jsonl:1: not valid JSON .*this looks like TREC SGML documents: "
                                        r"use data=trec"):
        load_docs_file(trec_named_jsonl)
    with pytest.raises(DataError, match=r"ft911\.sgml: not a \.jsonl or \.tsv file; this looks like TREC SGML"):
        load_docs_file(sgml)
    (collection / "queries.jsonl").write_text(TOPICS)
    ids = ["FT911-1", "LA010189-0001", "LA010189-0002"]  # topics are known by their content, whatever the name
    assert load_file_queries(collection / "queries.jsonl", collection / "qrels.401-402.txt", doc_ids=ids).qids == \
        ["401", "402"]
    (collection / "notes.txt").write_text("hello\n")
    with pytest.raises(DataError, match=r"notes\.txt: a queries file is a \.jsonl, a \.tsv or TREC topics"):
        load_file_queries(collection / "notes.txt", collection / "qrels.401-402.txt", doc_ids=["FT911-1"])
    validate("run", load_config("run", ["data=trec", f"data.path={collection / 'docs'}",
                                        f"data.queries={collection / 'topics.401-402'}",
                                        f"data.qrels={collection / 'qrels.401-402.txt'}"]))
    validate("score", load_config("score", [f"data.name={sgml}"]))
    with pytest.raises(ConfigError, match=r"data.name=.*topics.401-402: is a file, but not .* nor TREC SGML; this "
                                          r"looks like TREC topics"):
        validate("score", load_config("score", [f"data.name={collection / 'topics.401-402'}"]))
    with pytest.raises(DataError, match=r"topics\.401-402: no <DOC> .. </DOC> in this file; this looks like TREC "
                                        r"topics: pass it as data\.queries"):
        load_trec(collection / "topics.401-402")
    with pytest.raises(ConfigError, match=r"data.path=\?\?\?: missing mandatory value"):
        validate("run", load_config("run", ["data=trec"]))
    with pytest.raises(ConfigError, match=r"data.topic_fields=\[summary\]: must be a non-empty list of title, "
                                          r"desc, narr"):
        validate("run", load_config("run", ["data=trec", f"data.path={sgml}", "data.topic_fields=[summary]"]))
    with pytest.raises(ConfigError, match=r"data.encoding=latin9x: must be a text encoding Python knows"):
        validate("run", load_config("run", ["data=trec", f"data.path={sgml}", "data.encoding=latin9x"]))


def _cranfield_in_trec_form(folder: Path, n_queries: int = 6, n_docs: int = 80) -> tuple[Path, Path, Path]:
    """A slice of Cranfield written as TREC distributes a collection: the judged documents of its first
    ``n_queries`` queries (and others up to ``n_docs``) in two SGML files, one gzipped, the first with <TEXT> fields
    and the second, as older collections are, with the text directly in <DOC> (title in <HEAD>); topics with
    ``Number:`` and titles over two lines; qrels with Cranfield's grades (4 = most relevant, as TREC's)."""
    corpus, qs = load_cranfield(), load_cranfield_queries()
    qs = qs.select(range(n_queries))
    judged = list(dict.fromkeys(d for rel in qs.relevant for d in rel))
    assert len(judged) < n_docs
    others = [d for d, x in zip(corpus.doc_ids, corpus.texts) if d not in set(judged) and x.strip()]
    docs = corpus.select(corpus.indices(sorted(judged + others[: n_docs - len(judged)], key=int)))
    rows = list(zip(docs.doc_ids, docs.titles, docs.texts))
    fields = [f"<DOC>\n<DOCNO> {d} </DOCNO>\n<TITLE>{t}</TITLE>\n<TEXT>\n{x}\n</TEXT>\n</DOC>\n"
              for d, t, x in rows[: n_docs // 2]]
    bodies = [f"<DOC>\n<DOCNO>{d}</DOCNO>\n<HEAD>{t}</HEAD>\n{x}\n</DOC>\n" for d, t, x in rows[n_docs // 2:]]
    (folder / "docs").mkdir()
    (folder / "docs" / "cran.1").write_text("".join(fields))
    (folder / "docs" / "cran.2.gz").write_bytes(gzip.compress("".join(bodies).encode()))
    topics = folder / "topics.cran"
    topics.write_text("".join(f"<top>\n<num> Number: {q}\n<title> {t[: len(t) // 2]}\n{t[len(t) // 2:]}\n\n"
                              f"<desc> Description:\n{t}\n</top>\n\n" for q, t in zip(qs.qids, qs.texts)))
    qrels = folder / "qrels.cran.txt"
    qrels.write_text("".join(f"{q} 0 {d} {g}\n" for q, rel, gr in zip(qs.qids, qs.relevant, qs.grades)
                             for d, g in zip(rel, gr)))
    return folder / "docs", topics, qrels


def test_cranfield_in_trec_form_runs_with_one_gdr_run(setup, tmp_path, capsys):
    """The classic collection as TREC files, no converter and no edit (half of it with the text directly in <DOC>):
    `gdr run data=trec` trains, evaluates and reports Success@k, R@k and RR@k, BM25's equal to ir_measures on its
    run file (several relevant documents a query)."""
    import ir_measures

    root, folder = setup
    docs, topics, qrels = _cranfield_in_trec_form(tmp_path)
    out = tmp_path / "run"
    args = [a for a in _args(root, folder, out, "indexers=[random]", "doc_queries.per_doc=1")
            if not a.startswith("data.name=")]
    assert main(args[:1] + ["data=trec", f"data.path={docs}", f"data.queries={topics}", f"data.qrels={qrels}"]
                + args[1:]) == 0
    assert set(json.loads(capsys.readouterr().out.strip().splitlines()[-1])) == {
        "seconds", "random_recall_at_1", "bm25_recall_at_1"}
    report = json.loads((out / "report.json").read_text())
    md = (out / "report.md").read_text()
    assert md.startswith("# gdr run: docs, 80 documents") and report["n_test_queries"] == 6
    assert "| docids | Success@1 | Success@10 | R@10 | RR@10 |" in md
    assert "what NCI and the GDR papers call Recall@k" in md
    assert "6 test queries of `topics.cran`" in md and "## Retrieval (one seed, in %)" in md
    row = next(line for line in md.splitlines() if line.startswith("| random |"))
    assert "(" not in row  # no std of one seed
    bm25_dir = out / next(s["folder"] for s in report["stages"] if s["name"] == "bm25")
    measures = [ir_measures.Success @ 1, ir_measures.Success @ 10, ir_measures.R @ 10, ir_measures.RR @ 10]
    ref = ir_measures.calc_aggregate(measures, ir_measures.read_trec_qrels(str(qrels)),
                                     ir_measures.read_trec_run(str(bm25_dir / "bm25.trec")))
    got = report["bm25"]
    assert [got["recall@1"], got["recall@10"], got["R@10"], got["mrr@10"]] == pytest.approx(
        [round(100 * ref[m], 2) for m in measures], abs=0.006)
    assert got["R@10"] < got["recall@10"]  # several relevant documents a query: recall below the hit rate
    # every measure named at the depth evaluated (evaluate.k=10): metrics.json, report.md, the comparisons
    ev_dir = out / next(s["folder"] for s in report["stages"] if s["name"] == "eval-random-s0")
    for folder, system in ((ev_dir, "gdr"), (bm25_dir, "bm25")):
        row = json.loads((folder / "metrics.json").read_text())["systems"][system]
        assert {"Success@10", "R@10", "RR@10", "mrr@10"} <= set(row), folder
        assert not [key for key in row if "@100" in key], folder
    assert {c["metric"] for c in report["comparisons"]} == {"recall@1", "recall@10", "mrr@10"}
    assert "| random | bm25 | RR@10 |" in md and "@100" not in md and "@100" not in json.dumps(report)
