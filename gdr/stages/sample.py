"""Stage ``sample``: J queries drawn from the corpus by the generative LM (Algorithm 1, line 1)."""
from __future__ import annotations

import os
from pathlib import Path

from gdr.stages.settings import SampleSettings

__all__ = ["sample_queries"]


def sample_queries(lm, corpus, out: str | os.PathLike, settings: SampleSettings,
                   progress: bool = True) -> list[dict]:
    """Sample ``settings.n_queries`` queries from ``corpus`` (a :class:`gdr.data.Corpus`) with ``lm`` (a
    :class:`gdr.lm.GenerativeLM`) into ``out/queries.jsonl``; returns them (``text``, ``source_doc_id``, ...).

    Resumable; a finished file with the same settings is reused, one with other settings is refused."""
    from gdr.store import sample_run

    s = settings
    return sample_run(lm, corpus.model_inputs(), corpus.doc_ids, Path(out), n_queries=s.n_queries, seed=s.seed,
                      batch_size=s.batch_size, max_new_tokens=s.max_new_tokens, top_k=s.top_k, top_p=s.top_p,
                      temperature=s.temperature, progress=progress, compile=s.compile,
                      compile_min_queries=s.compile_min_queries)
