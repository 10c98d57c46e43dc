"""Stage ``sample``: J queries drawn from the corpus by the generative LM (Algorithm 1, line 1)."""
from __future__ import annotations

import os
from pathlib import Path

from gdr.stages.settings import SampleSettings

__all__ = ["sample_queries", "check_texts"]


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
                   progress: bool = True) -> list[dict]:
    """Sample ``settings.n_queries`` queries from ``corpus`` (a :class:`gdr.data.Corpus`) with ``lm`` (a
    :class:`gdr.lm.GenerativeLM`) into ``out/queries.jsonl``; returns them (``text``, ``source_doc_id``, ...).

    Resumable; a finished file with the same settings is reused, one with other settings is refused."""
    from gdr.guard import holding
    from gdr.store import sample_run

    s = settings
    check_texts(corpus)
    with holding(out):  # one writer per folder, as with `gdr sample`
        return sample_run(lm, corpus.model_inputs(), corpus.doc_ids, Path(out), n_queries=s.n_queries, seed=s.seed,
                          batch_size=s.batch_size, max_new_tokens=s.max_new_tokens, top_k=s.top_k, top_p=s.top_p,
                          temperature=s.temperature, progress=progress, compile=s.compile,
                          compile_min_queries=s.compile_min_queries)
