"""Stage ``doc-queries``: generated training queries for every document (the retriever's and BMI's input).

:func:`sample_doc_queries` is the stage; :func:`sample_per_doc_run` the resumable job that writes
``doc_queries.jsonl``.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from gdr.formats import FORMAT, require_format
from gdr.guard import holding
from gdr.io import (
    check_manifest_files,
    hash_strings,
    read_jsonl,
    read_manifest,
    what_differs,
    write_jsonl,
    write_manifest,
)
from gdr.lm import compiling
from gdr.lm.decode import PER_DOC_SAMPLER, SAMPLER_VERSION
from gdr.models import SamplingOptions
from gdr.rerun import RerunCommand
from gdr.signals import check as check_stop
from gdr.stages.sample import check_numerics, check_sampler, check_texts, decode_numerics
from gdr.stages.settings import SampleSettings
from gdr.store import DOCQ_FILE, DOCQ_MANIFEST

__all__ = ["sample_doc_queries", "sample_per_doc_run"]

log = logging.getLogger(__name__)


def sample_doc_queries(lm, corpus, out: str | os.PathLike, settings: SampleSettings,
                       progress: bool = True) -> Path:
    """``settings.per_doc`` queries for every document into ``out/doc_queries.jsonl`` (resumable); its path.
    ``settings.per_doc`` >= 1 was checked at the door (:func:`gdr.sample_doc_queries`; ``gdr sample`` and ``gdr run``
    call this only for a positive one)."""
    s = settings
    check_texts(corpus)
    with holding(out):  # one writer per folder, as with `gdr sample`
        return sample_per_doc_run(lm, corpus.model_inputs(), corpus.doc_ids, Path(out), n_per_doc=s.per_doc,
                                  seed=s.seed, batch_size=s.batch_size, max_new_tokens=s.max_new_tokens,
                                  top_k=s.top_k, top_p=s.top_p, temperature=s.temperature, progress=progress,
                                  compile=s.compile, compile_min_queries=s.compile_min_queries)


def sample_per_doc_run(lm, texts: Sequence[str], doc_ids: Sequence[str], out_dir: str | os.PathLike, n_per_doc: int,
                       seed: int = 0, batch_size: int | str = SamplingOptions.batch_size,
                       max_new_tokens: int = SamplingOptions.max_new_tokens, top_k: int = SamplingOptions.top_k,
                       top_p: float = SamplingOptions.top_p, temperature: float = SamplingOptions.temperature,
                       progress: bool = True, compile: bool | str = SamplingOptions.compile,
                       compile_min_queries: int | str = SamplingOptions.compile_min_queries) -> Path:
    """Generate ``n_per_doc`` queries for every document into ``out_dir/doc_queries.jsonl``.

    One line ``{"doc_id", "queries": [...]}`` per document, in corpus order: the training data of the
    retriever (NCI/BMI's generated queries) and the input of the BMI indexer. Resumable: finished
    documents are appended (and flushed) batch by batch; a rerun continues after the last whole line.
    ``batch_size`` counts queries (``batch_size // n_per_doc`` documents per batch); the queries of
    document i depend only on (seed, i), so neither it nor a resume changes the file. ``compile`` /
    ``compile_min_queries`` and the recorded ``numerics`` as in :func:`gdr.stages.sample.sample_run`
    (decided for all the corpus's queries).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / DOCQ_FILE
    ident = {"sampler": SAMPLER_VERSION, "per_doc_sampler": PER_DOC_SAMPLER, "lm": lm.describe(),
             "doc_ids_hash": hash_strings(doc_ids),
             "texts_hash": hash_strings(texts), "n_per_doc": n_per_doc, "seed": seed,
             "max_new_tokens": max_new_tokens, "top_k": top_k, "top_p": top_p, "temperature": temperature}
    old = read_manifest(out, DOCQ_MANIFEST)
    if old is not None:
        require_format(old, out / DOCQ_MANIFEST, out)
    check_sampler(out, DOCQ_MANIFEST, old, "doc_queries.*")
    compiled = compiling.want_compile(compile, lm.device, len(texts) * n_per_doc, compile_min_queries)
    numerics = decode_numerics(lm, compiled)
    check_numerics(out, DOCQ_MANIFEST, old, numerics, "doc_queries.*")
    if old is not None:
        changed = [k for k in ident if json.loads(json.dumps(old.get(k))) != json.loads(json.dumps(ident[k]))]
        if changed:
            raise FileExistsError(f"{out / DOCQ_MANIFEST} was written with different settings "
                                  f"({what_differs(old, ident, changed)}); use another out= folder or delete "
                                  f"{path} and {out / DOCQ_MANIFEST}")
    if old is not None and old.get("status") == "complete":
        check_manifest_files(out, name=DOCQ_MANIFEST, fix=RerunCommand("sample", out, f"re-sample: delete {path} and "
                                                                       f"{out / DOCQ_MANIFEST}, then run `{{}}`"))
    write_manifest(out, DOCQ_MANIFEST, **ident, format=FORMAT, numerics=numerics, status="running")
    done = 0
    if path.exists():
        rows = read_jsonl(path, drop_torn_tail=True)[:len(texts)]
        done = len(rows)
        write_jsonl(path, rows)  # whole lines only; a torn line is redone
        if done:
            log.info("resuming per-document generation after %d documents", done)
    bs = lm.auto_batch_size(max_new_tokens) if batch_size == "auto" else int(batch_size)
    docs_per_batch = max(1, bs // n_per_doc)
    t0 = time.perf_counter()
    bar = tqdm(total=len(texts), initial=done, desc="queries per doc", unit="doc",
               disable=not progress or done >= len(texts))
    with open(path, "a", encoding="utf-8") as f:
        for b0 in range(done, len(texts), docs_per_batch):
            check_stop()  # a stop whose raise was lost (gdr.signals): the next batch does not start
            batch = list(texts[b0:b0 + docs_per_batch])
            gen = lm.sample_per_doc(batch, n_per_doc, first=b0, seed=seed, max_new_tokens=max_new_tokens,
                                    top_k=top_k, top_p=top_p, temperature=temperature,
                                    max_rows=bs)
            for i, qs in enumerate(gen):
                f.write(json.dumps({"doc_id": doc_ids[b0 + i], "queries": qs}, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(batch))
    bar.close()
    write_manifest(out, DOCQ_MANIFEST, **ident, format=FORMAT, numerics=numerics, status="complete", files=[DOCQ_FILE],
                   seconds_last_call=round(time.perf_counter() - t0, 2),
                   compile_last_call=lm.decoder().compile_record())
    return path
