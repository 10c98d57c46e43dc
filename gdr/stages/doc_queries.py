"""Stage ``doc-queries``: generated training queries for every document (the retriever's and BMI's input)."""
from __future__ import annotations

import os
from pathlib import Path

from gdr.rules import check_values
from gdr.stages.settings import PER_DOC_RULE, SampleSettings

__all__ = ["sample_doc_queries"]


def sample_doc_queries(lm, corpus, out: str | os.PathLike, settings: SampleSettings,
                       progress: bool = True) -> Path:
    """``settings.per_doc`` queries for every document into ``out/doc_queries.jsonl`` (resumable); its path."""
    from gdr.guard import holding
    from gdr.stages.sample import check_texts
    from gdr.store import sample_per_doc_run

    s = settings
    check_values({"per_doc": s.per_doc}, (PER_DOC_RULE,), nest="sample", shown="sample.")
    check_texts(corpus)
    with holding(out):  # one writer per folder, as with `gdr sample`
        return sample_per_doc_run(lm, corpus.model_inputs(), corpus.doc_ids, Path(out), n_per_doc=s.per_doc,
                                  seed=s.seed, batch_size=s.batch_size, max_new_tokens=s.max_new_tokens,
                                  top_k=s.top_k, top_p=s.top_p, temperature=s.temperature, progress=progress,
                                  compile=s.compile, compile_min_queries=s.compile_min_queries)
