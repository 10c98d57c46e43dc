"""Stage ``sample``: J queries drawn from the corpus by the generative LM (Algorithm 1, line 1).

:func:`sample_queries` is the stage; :func:`sample_run` the resumable job that fills a run folder's
``queries.jsonl`` (the folder's format: :mod:`gdr.store`).
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from gdr.device import machine_record
from gdr.formats import FORMAT, require_format
from gdr.guard import holding
from gdr.io import (
    atomic_write_json,
    file_digest,
    hash_strings,
    read_jsonl,
    read_manifest,
    what_differs,
    write_jsonl,
    write_manifest,
)
from gdr.lm import SampledQueries, compiling
from gdr.lm.decode import SAMPLER_VERSION
from gdr.lm.numerics import describe_numerics
from gdr.lm.scoring import QUERY_END
from gdr.models import SamplingOptions
from gdr.stages.settings import MAX_P_PER_DOC, SampleSettings
from gdr.store import (
    P_FILE,
    P_MANIFEST,
    Q_FILE,
    Q_MANIFEST,
    Q_PARTIAL,
    TEXTS_FILE,
    match_strings,
    query_ended,
    read_queries,
    text_digests,
)

__all__ = ["sample_queries", "sample_run", "check_texts", "reusable_queries", "per_doc_draws"]

log = logging.getLogger(__name__)


def check_texts(corpus) -> None:
    """Refuse a document with nothing to prompt the LM with (an empty model input), unless its loader kept it
    on purpose (``on_empty=keep``: listed in ``corpus.info["empty_text"]``): its queries and its row of P
    would be the LM's unconditioned ones, not the document's."""
    kept = set(corpus.info.get("empty_text") or ())
    empty = [d for d, t in zip(corpus.doc_ids, corpus.model_inputs()) if not t.strip() and d not in kept]
    if empty:
        more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
        raise ValueError(f"corpus {corpus.name!r}: document {empty[0]!r}{more} has empty text, so nothing to "
                         "sample or score it by; fill it in, drop it (corpus.select(...), or load_corpus(..., "
                         "on_empty='drop')), or keep it on purpose with load_corpus(..., on_empty='keep')")


def sample_queries(lm, corpus, out: str | os.PathLike, settings: SampleSettings,
                   progress: bool = True, reuse_from: str | os.PathLike | None = None) -> list[dict]:
    """Sample ``settings.n_queries`` queries from ``corpus`` (a :class:`gdr.data.Corpus`) with ``lm`` (a
    :class:`gdr.lm.GenerativeLM`) into ``out/queries.jsonl``; returns them (``text``, ``source_doc_id``, ...).

    Resumable; a finished file with the same settings is reused, one with other settings is refused.
    ``reuse_from``: an older sampling whose unchanged documents' queries are taken as they are (:func:`sample_run`)."""
    s = settings
    check_texts(corpus)
    with holding(out):  # one writer per folder, as with `gdr sample`
        return sample_run(lm, corpus.model_inputs(), corpus.doc_ids, Path(out), n_queries=s.n_queries, seed=s.seed,
                          batch_size=s.batch_size, max_new_tokens=s.max_new_tokens, top_k=s.top_k, top_p=s.top_p,
                          temperature=s.temperature, progress=progress, compile=s.compile,
                          compile_min_queries=s.compile_min_queries, reuse_from=reuse_from, p_per_doc=s.p_per_doc)


def sample_run(lm, texts: Sequence[str], doc_ids: Sequence[str], out_dir: str | os.PathLike, n_queries: int,
               seed: int = 0, batch_size: int | str = SamplingOptions.batch_size,
               max_new_tokens: int = SamplingOptions.max_new_tokens, top_k: int = SamplingOptions.top_k,
               top_p: float = SamplingOptions.top_p, temperature: float = SamplingOptions.temperature,
               progress: bool = True, compile: bool | str = SamplingOptions.compile,
               compile_min_queries: int | str = SamplingOptions.compile_min_queries,
               reuse_from: str | os.PathLike | None = None, p_per_doc: int = SampleSettings.p_per_doc) -> list[dict]:
    """Sample ``n_queries`` queries from the corpus into ``out_dir/queries.jsonl`` (resumable).

    ``p_per_doc`` > 0: instead, that many queries from every document, in row order (``n_queries`` is then
    ``p_per_doc`` x documents), each document's on random streams keyed by its text (:func:`per_doc_draws`):
    a document's queries depend only on its text and the settings, never on the other documents, so an edited,
    added or removed document changes only its own queries (and, scored by source, :func:`gdr.stages.score.
    score_run`, only its row and columns of P).

    ``reuse_from``: the folder of an older sampling of as many documents with the same settings and numerics
    (the corpus before an edit). Query j's source document is the same there (it depends on the seed and the
    number of documents), and its text depends only on the seed, j and that document's text: where that text is
    unchanged, the query is taken from there, and only the others are decoded (:func:`reusable_queries`).

    An existing finished ``queries.jsonl`` with the same settings is reused; one with different settings,
    drawn by another sampler version, or decoded under other numerics (device kind, dtype, compiled or eager
    decode: :mod:`gdr.lm.numerics`, recorded as ``numerics``), is an error (never silently overwritten or
    mixed). ``batch_size`` (or ``auto``) changes only the speed: query j is the same at any batch size, and a
    resumed run equals an uninterrupted one. ``compile`` / ``compile_min_queries``: whether the decode step is
    compiled (:func:`gdr.lm.compiling.want_compile`), decided once for the folder's ``n_queries``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_queries = p_per_doc * len(texts) if p_per_doc else n_queries
    ident = {"sampler": SAMPLER_VERSION, "query_end": QUERY_END, "lm": lm.describe(),
             "doc_ids_hash": hash_strings(doc_ids), "texts_hash": hash_strings(texts), "n_queries": n_queries,
             "seed": seed, "max_new_tokens": max_new_tokens, "top_k": top_k, "top_p": top_p, "temperature": temperature,
             **({"p_per_doc": p_per_doc} if p_per_doc else {})}  # absent when 0: older manifests stay valid
    old = read_manifest(out, Q_MANIFEST)
    numerics = decode_numerics(lm, compiling.want_compile(compile, lm.device, n_queries, compile_min_queries))
    _check_folder(out, old, ident, numerics)
    if old is not None and old.get("status") == "complete" and (out / Q_FILE).exists():
        rows = read_queries(out, old)
        log.info("reusing %d sampled queries in %s", old["n_queries"], out / Q_FILE)
        return rows
    write_manifest(out, Q_MANIFEST, **ident, format=FORMAT, numerics=numerics, status="running")

    start = given = None
    partial = out / Q_PARTIAL
    digests = text_digests(texts)
    if reuse_from is not None and not partial.exists() and Path(reuse_from).resolve() != out.resolve():
        given = reusable_queries(reuse_from, ident, numerics, digests)
    if partial.exists():
        rows = read_jsonl(partial)[:n_queries]
        if rows:
            log.info("resuming sampling after %d queries", len(rows))
            start = SampledQueries([r["text"] for r in rows], np.array([r["source_index"] for r in rows]),
                                   int(rows[-1].get("n_redrawn", 0)), ended=query_ended(rows))

    def checkpoint(sq: SampledQueries) -> None:
        write_jsonl(partial, ({"text": t, "source_index": int(s), "n_redrawn": sq.n_redrawn, **_cut(e)}
                              for t, s, e in zip(sq.texts, sq.source_index, sq.ended)))

    t0 = time.perf_counter()
    sq = lm.sample_queries(texts, n_queries, seed=seed, batch_size=batch_size, max_new_tokens=max_new_tokens,
                           top_k=top_k, top_p=top_p, temperature=temperature, progress=progress,
                           start=start, on_batch=checkpoint, compile=compile,
                           compile_min_queries=compile_min_queries, given=given,
                           draws=per_doc_draws(digests, p_per_doc) if p_per_doc else None)
    rows = [{"qid": f"q{j}", "text": t, "source_doc_id": doc_ids[int(s)], "source_index": int(s), **_cut(e)}
            for j, (t, s, e) in enumerate(zip(sq.texts, sq.source_index, sq.ended))]
    write_jsonl(out / Q_FILE, rows)
    atomic_write_json(out / TEXTS_FILE, digests)  # what a later, edited corpus reuses these queries by
    reused = {} if given is None else {"reused_from": str(reuse_from),
                                       "queries_reused": sum(t is not None for t in given)}
    write_manifest(out, Q_MANIFEST, **ident, format=FORMAT, numerics=numerics, status="complete",
                   queries_hash=hash_strings(sq.texts), n_cut=int((~sq.ended).sum()),
                   n_redrawn=sq.n_redrawn, file=file_digest(out / Q_FILE),
                   seconds_last_call=round(time.perf_counter() - t0, 2), compile_last_call=sq.compile,
                   doc_texts_hash=hash_strings(digests), machine=machine_record(), **reused)
    partial.unlink(missing_ok=True)
    return rows


def _cut(ended: bool) -> dict:
    """A query record's ``cut`` key: present (True) only for a query cut at ``max_new_tokens`` before the model
    ended it (P scores no end for it, :data:`gdr.lm.scoring.QUERY_END`)."""
    return {} if ended else {"cut": True}


def _check_folder(out: Path, old: dict | None, ident: dict, numerics: dict) -> None:
    """Refuse, in one line, to sample into ``out`` over queries gdr did not sample there, copied ones, or ones of
    another sampler, numerics or settings (``old``: its manifest, ``ident``: this sampling's)."""
    if old is not None:
        require_format(old, out / Q_MANIFEST, out)
    if old is None and (out / Q_FILE).exists():  # never sampled over: someone put these queries here
        raise FileExistsError(
            f"{out / Q_FILE} has no {Q_MANIFEST}: gdr did not sample it here and will not sample over it; to score "
            f"documents against the queries of another run use `gdr score queries_from=<that run>` (it copies them "
            f"with their manifest), or delete {out / Q_FILE} to sample new queries")
    if old is not None and old.get("from_run"):
        raise FileExistsError(
            f"{out / Q_FILE} holds the queries of {old['from_run']}, copied by `gdr score queries_from=...`: pass "
            f"queries_from={old['from_run']} again to score against them, or use another out= folder to sample new "
            "ones")
    check_sampler(out, Q_MANIFEST, old, "queries.* (and P.*, scored on them)")
    check_numerics(out, Q_MANIFEST, old, numerics, "queries.* (and P.*, scored on them)")
    if old is not None and {k: old.get(k) for k in ident} != json.loads(json.dumps(ident)):
        raise FileExistsError(
            f"{out / Q_MANIFEST} was written with different settings ({what_differs(old, ident, ident)}); "
            f"use another out= folder, or delete {out / Q_FILE} and {out / Q_MANIFEST} (and any {P_FILE}, "
            f"{P_MANIFEST}, P.shards/ scored from them) to sample again")


def reusable_queries(old_dir: str | os.PathLike, ident: dict, numerics: dict, digests: list[str]
                     ) -> list[tuple[str, bool] | None] | None:
    """(n_queries,) the (text, ended) of ``old_dir``'s queries that this sampling would decode again, byte for byte,
    None for the others; None when nothing there can be taken (with one log line why): unfinished, sampled with other
    settings, sampler or numerics, or without its documents' digests (``digests``: this corpus's,
    :func:`gdr.store.text_digests`).

    Under the per-document sampler (``ident["p_per_doc"]``) a document's queries are those of an older document
    of the same text, whatever the number of documents. Under the global one query j's source document is a draw
    of the seed and the number of documents, so queries are taken only at the same number of documents, where
    query j's source text is unchanged."""
    old_dir = Path(old_dir)
    man = read_manifest(old_dir, Q_MANIFEST)
    per_doc = int(ident.get("p_per_doc", 0))
    inputs = {"doc_ids_hash", "texts_hash"} | ({"n_queries"} if per_doc else set())
    if man is None or man.get("status") != "complete" or man.get("from_run") or not (old_dir / TEXTS_FILE).is_file():
        log.info("not reusing the queries of %s: unfinished, copied, or without %s", old_dir, TEXTS_FILE)
        return None
    differs = [k for k in ident if k not in inputs and json.loads(json.dumps(ident[k])) != man.get(k)]
    differs += ["numerics"] * (man.get("numerics") != numerics) + ["p_per_doc"] * (man.get("p_per_doc", 0) != per_doc)
    if differs:
        log.info("not reusing the queries of %s: sampled with other %s", old_dir, ", ".join(differs))
        return None
    try:
        rows = read_queries(old_dir, man)
        with open(old_dir / TEXTS_FILE, encoding="utf-8") as f:
            old_digests = json.load(f)
    except (OSError, ValueError) as e:
        log.warning("not reusing the queries of %s: %s", old_dir, e)
        return None
    if hash_strings(old_digests) != man.get("doc_texts_hash"):
        log.warning("not reusing the queries of %s: %s does not match %s", old_dir, TEXTS_FILE, Q_MANIFEST)
        return None
    old_queries = np.empty(len(rows), dtype=object)  # (n_old_queries,) (text, ended)
    old_queries[:] = list(zip((r["text"] for r in rows), query_ended(rows).tolist()))
    if per_doc:  # query k of row i: the k-th of the older row of the same text
        old_row = match_strings(old_digests, digests)  # (n_docs,)
        take = (old_row.clip(min=0)[:, None] * per_doc + np.arange(per_doc)).ravel()  # (n_queries,)
        same = np.repeat(old_row >= 0, per_doc)  # (n_queries,)
    elif len(old_digests) != len(digests):
        log.info("not reusing the queries of %s: drawn from %d documents, not %d (every query's source differs)",
                 old_dir, len(old_digests), len(digests))
        return None
    else:
        src = np.array([int(r["source_index"]) for r in rows], dtype=np.int64)  # (n_queries,)
        take, same = np.arange(len(rows)), np.asarray(old_digests, dtype=object)[src] == np.asarray(
            digests, dtype=object)[src]
    log.info("reusing %d of %d queries of %s (their documents are unchanged)", int(same.sum()), len(same), old_dir)
    return [q if k else None for q, k in zip(old_queries[take], same)]


def per_doc_draws(digests: Sequence[str], p_per_doc: int) -> tuple[np.ndarray, np.ndarray]:
    """(source, stream), each (n_docs * p_per_doc,) int64, of the per-document sampler: ``p_per_doc`` queries of
    every row in row order, query k of a document on stream ``int(44 bits of its digest) * MAX_P_PER_DOC + k``
    (:func:`gdr.lm.decode.row_keys`), so that it depends on the document's text alone."""
    base = np.array([int(d[:11], 16) for d in digests], dtype=np.int64)  # (n_docs,) 44 bits of each text's digest
    source = np.repeat(np.arange(len(digests), dtype=np.int64), p_per_doc)
    stream = (base[:, None] * MAX_P_PER_DOC + np.arange(p_per_doc, dtype=np.int64)).ravel()
    return source, stream


def check_sampler(out: Path, manifest: str, old: dict | None, files: str) -> None:
    """Refuse queries drawn by another sampler version (other queries for the same seed), in one line."""
    if old is not None and old.get("sampler") != SAMPLER_VERSION:
        raise FileExistsError(
            f"{out / manifest}: these queries were drawn by sampler {old.get('sampler') or 'hf-generate'}, this "
            f"gdr samples with {SAMPLER_VERSION} (other queries for the same seed); to re-sample, delete "
            f"{files} in {out} or use another out= folder")


def decode_numerics(lm, compiled: bool) -> dict:
    """The numerics of ``lm``'s decode loop with the decode path ``compiled`` (set on it for the run)."""
    dec = lm.decoder()
    dec.set_compile(compiled)
    return dec.numerics()


def check_numerics(out: Path, manifest: str, old: dict | None, now: dict, files: str) -> None:
    """Refuse, in one line, queries decoded under other numerics than this run's (``old``: the folder's manifest,
    which records them): resuming would mix the two, reusing would hand out other queries."""
    was = old.get("numerics") if old is not None else now
    if was != now:
        raise FileExistsError(
            f"{out / manifest}: these queries were decoded on {describe_numerics(was or {})}, this run decodes on "
            f"{describe_numerics(now)} (other near-ties, so other queries for the same seed; never mixed in one "
            f"folder); run it where they were decoded (device=, sample.compile=), or to re-sample here delete "
            f"{files} in {out}, or use another out= folder")
