"""The language-model layer: sample queries from documents and score log p(query | doc).

Where things are:

- :mod:`gdr.lm.model`: :class:`GenerativeLM`, loading a model (hub id, path, bundled name) and its prompt.
- :mod:`gdr.lm.prompts`: :class:`PromptConfig`, how a document becomes model input; ``clean_query``.
- :mod:`gdr.lm.sampling`: sampling queries (Algorithm 1 line 1).
- :mod:`gdr.lm.decode`: the decode loop behind it (static KV cache, per-query random streams, sampler version).
- :mod:`gdr.lm.scoring`: the matrix P of log p(query | doc) (Eq. 1).
- :mod:`gdr.lm.attention`: the attention function of the scoring and decode passes (flex, grouped SDPA).
- :mod:`gdr.lm.numerics`: what decides the bytes beyond the settings (device kind, dtype, decode path).
"""
from gdr.lm.model import GenerativeLM
from gdr.lm.prompts import GENERATOR_FILE, PromptConfig, clean_query, saved_generator
from gdr.lm.sampling import SampledQueries

__all__ = ["GenerativeLM", "PromptConfig", "SampledQueries", "clean_query", "saved_generator", "GENERATOR_FILE"]
