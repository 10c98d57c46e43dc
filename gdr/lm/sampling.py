"""Sampling queries from documents (Algorithm 1 line 1, Section 4.3)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from gdr.lm.prompts import clean_query

log = logging.getLogger(__name__)

__all__ = ["SampledQueries", "SamplingMixin"]


@dataclass
class SampledQueries:
    """Queries sampled from a corpus: ``texts[j]`` was generated from document ``source_index[j]``."""

    texts: list[str]
    source_index: np.ndarray  # (n_queries,) int64, row of the source document
    n_redrawn: int = 0



class SamplingMixin:
    """Query sampling for :class:`gdr.lm.GenerativeLM`."""

    def _stop_ids(self) -> list[int]:
        stop = {self.eos_id}
        if not self.is_seq2seq:
            # A query is one line: stop at the first newline the model writes.
            for tok_id in self.tokenizer("\n", add_special_tokens=False)["input_ids"]:
                stop.add(int(tok_id))
        return sorted(stop)

    @torch.inference_mode()
    def generate(self, docs: Sequence[str], seed: int, max_new_tokens: int = 32, top_k: int = 50,
                 top_p: float = 0.99, temperature: float = 1.0, num_return_sequences: int = 1) -> list[str]:
        """One batched ``generate`` call; returns ``len(docs) * num_return_sequences`` cleaned queries."""
        ids = self.prompt_ids(docs)
        batch = self._pad(ids, left=not self.is_seq2seq)
        torch.manual_seed(seed)
        out = self.model.generate(
            **batch, do_sample=True, top_k=top_k, top_p=top_p, temperature=temperature,
            max_new_tokens=max_new_tokens, num_return_sequences=num_return_sequences,
            eos_token_id=self._stop_ids(), pad_token_id=self.pad_id,
        )
        if not self.is_seq2seq:
            out = out[:, batch["input_ids"].shape[1]:]
        return [clean_query(t) for t in self.tokenizer.batch_decode(out, skip_special_tokens=True)]

    def sample_queries(self, docs: Sequence[str], n: int, seed: int = 0, batch_size: int = 16,
                       max_new_tokens: int = 32, top_k: int = 50, top_p: float = 0.99,
                       temperature: float = 1.0, max_redraws: int = 10, progress: bool = True,
                       start: "SampledQueries | None" = None, on_batch=None) -> SampledQueries:
        """Algorithm 1 line 1 / Section 4.3: draw ``n`` documents uniformly (with replacement, i.i.d. from
        the prior) and generate one query from each. Empty generations are re-drawn from the same document
        with a new seed. ``start`` resumes from already finished batches; ``on_batch(partial)`` is called
        after every batch (used to checkpoint)."""
        rng = np.random.default_rng(seed)
        source = rng.integers(0, len(docs), size=n)
        texts = list(start.texts) if start is not None else []
        redrawn = start.n_redrawn if start is not None else 0
        done = len(texts)
        if done % batch_size and done != n:
            raise ValueError(f"resume point {done} is not a multiple of batch_size={batch_size}")
        bar = tqdm(total=n, initial=done, desc="sample queries", unit="q", disable=not progress)
        for b0 in range(done, n, batch_size):
            idx = source[b0:b0 + batch_size]
            gen = self.generate([docs[i] for i in idx], seed=seed * 1_000_003 + b0, max_new_tokens=max_new_tokens,
                                top_k=top_k, top_p=top_p, temperature=temperature)
            for attempt in range(1, max_redraws + 1):
                empty = [k for k, g in enumerate(gen) if not g]
                if not empty:
                    break
                redrawn += len(empty)
                again = self.generate([docs[idx[k]] for k in empty], seed=seed * 1_000_003 + b0 + 7919 * attempt,
                                      max_new_tokens=max_new_tokens, top_k=top_k, top_p=top_p,
                                      temperature=temperature)
                for k, g in zip(empty, again):
                    gen[k] = g
            else:
                empty = [int(idx[k]) for k, g in enumerate(gen) if not g]
                if empty:
                    raise RuntimeError(f"documents {empty} gave empty queries {max_redraws} times; check the prompt")
            texts.extend(gen)
            bar.update(len(idx))
            if on_batch is not None:
                on_batch(SampledQueries(texts, source[:len(texts)], redrawn))
        bar.close()
        if redrawn:
            log.info("re-drew %d empty generations", redrawn)
        return SampledQueries(texts, source.astype(np.int64), redrawn)
