"""Sampling queries from documents (Algorithm 1 line 1, Section 4.3)."""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import partial
from typing import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from gdr.device import free_memory
from gdr.lm.compiling import want_compile
from gdr.lm.decode import Decoder
from gdr.lm.prompts import clean_query
from gdr.logs import on_terminal
from gdr.models import SamplingOptions
from gdr.signals import check as check_stop

_LINE_BREAK = re.compile(r"[\r\n]")

log = logging.getLogger(__name__)

__all__ = ["SampledQueries", "SamplingMixin", "CPU_BATCH"]

# sample.batch_size=auto on a CPU: measured on the 2-core dev machine (see auto_batch_size).
CPU_BATCH = 64


@dataclass
class SampledQueries:
    """Queries sampled from a corpus: ``texts[j]`` was generated from document ``source_index[j]``; ``ended[j]``:
    whether the model ended it (wrote a stop id) before ``max_new_tokens``, else it was cut there (P scores no
    end for it, :data:`gdr.lm.scoring.QUERY_END`)."""

    texts: list[str]
    source_index: np.ndarray  # (n_queries,) int64, row of the source document
    n_redrawn: int = 0
    compile: dict | None = None  # what the decode compiled (gdr.lm.decode.Decoder.compile_record)
    ended: np.ndarray | None = None  # (n_queries,) bool; None: all ended (queries not sampled here)


def line_end_ids(tokenizer) -> list[int]:
    """The ids of the vocabulary's tokens that hold a line break (SmolLM2: 131 of 49,152, "\\n", "\\n\\n", " \\n",
    "\\r\\n", "\\n" followed by indentation, ..., each with nothing but white space before its break): a query is one
    line, so one that reaches any of them has ended; its text is the line before the break (:func:`clean_query`),
    the same whichever it was (in a vocabulary with tokens such as "abc\\n", "abc" ends the query's text)."""
    ids = np.arange(len(tokenizer))[:, None].tolist()
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's own decoder: ~10x faster
    texts = tokenizer.batch_decode(ids) if backend is None else backend.decode_batch(ids, skip_special_tokens=False)
    return [i for i, t in enumerate(texts) if _LINE_BREAK.search(t)]


def _advance(bar, first: int, rows: int, max_new_tokens: int, step: int) -> None:
    """Move ``bar`` (queries) to the share of a batch of ``rows`` queries from query ``first`` that ``step`` of its
    ``max_new_tokens`` decode steps stands for; the batch's end moves it to the batch's last query."""
    target = first + rows * step // (max_new_tokens + 1)
    if target > bar.n:
        bar.update(target - bar.n)


class SamplingMixin:
    """Query sampling for :class:`gdr.lm.GenerativeLM` (holds its decode loop in ``_decoder``, None until used)."""

    def _stop_ids(self) -> list[int]:
        """The ids a sampled query stops at (its end, as P scores it: :data:`gdr.lm.scoring.QUERY_END`): the
        end-of-sequence token and, for a causal model, every token that ends a line (:func:`line_end_ids`: a
        query is one line) that the model can write (a token the tokenizer added past the model's output
        vocabulary is never drawn); found once per tokenizer and output vocabulary size (``self.tokens``,
        :class:`gdr.lm.prompts.TokenCache`), so a model of another vocabulary under the same tokenizer finds its own."""
        vocab = self.model.get_output_embeddings().weight.shape[0]

        def find() -> list[int]:
            stop = {self.eos_id}
            if not self.is_seq2seq:
                stop.update(i for i in line_end_ids(self.tokenizer) if i < vocab)
            return sorted(stop)

        return self.tokens.found(f"stop-{vocab}", self.tokenizer, self._token_stamp(), find)

    @torch.inference_mode()
    def generate(self, docs: Sequence[str], seed: int, max_new_tokens: int = SamplingOptions.max_new_tokens,
                 top_k: int = SamplingOptions.top_k, top_p: float = SamplingOptions.top_p,
                 temperature: float = SamplingOptions.temperature, num_return_sequences: int = 1) -> list[str]:
        """One batched transformers ``generate`` call, seeded per call; returns ``len(docs) *
        num_return_sequences`` cleaned queries. The reference sampler of tests and benchmarks
        (``sample_queries`` uses our own decode loop, :mod:`gdr.lm.decode`)."""
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

    def decoder(self):
        """Our decode loop for this model (:class:`gdr.lm.decode.Decoder`), built once."""
        dec = self._decoder
        if dec is None or dec.device != self.device:
            dec = self._decoder = Decoder(self)
        return dec

    def decode_queries(self, *args, **kw) -> list[str]:
        """The texts of :meth:`decode_ended`'s queries (same arguments)."""
        return self.decode_ended(*args, **kw)[0]

    def decode_ended(self, docs: Sequence[str], rows: np.ndarray, qid: np.ndarray, attempt: np.ndarray | int,
                     seed: int, max_new_tokens: int = SamplingOptions.max_new_tokens,
                     top_k: int = SamplingOptions.top_k, top_p: float = SamplingOptions.top_p,
                     temperature: float = SamplingOptions.temperature, max_rows: int | None = None,
                     new_graphs: bool = True, on_step=None) -> tuple[list[str], np.ndarray]:
        """One query per row with our decode loop: row r continues ``docs[rows[r]]`` with the random stream
        of query ``qid[r]`` (redraw ``attempt[r]``), so its text does not depend on the other rows.

        docs : U distinct documents (each prompt is prefilled once). rows, qid : (B,) int.
        max_rows : the batch size of the caller (the largest row bucket of a compiled decode).
        new_graphs : False (re-draws): a compiled decode compiles no new graph, see ``Decoder.decode``.
        on_step : called with the tokens decoded so far after each decode step (``Decoder.decode``).
        Returns B cleaned queries and (B,) bool: whether each ended at a stop id (else it was cut at
        ``max_new_tokens``).
        """
        rows_t = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        qid_t = torch.as_tensor(np.asarray(qid, dtype=np.int64))
        att_t = torch.as_tensor(np.broadcast_to(np.asarray(attempt, dtype=np.int64), qid_t.shape).copy())
        out = self.decoder().decode(self.prompt_ids(docs), rows_t, qid_t, att_t, seed=seed,
                                    max_new_tokens=max_new_tokens, top_k=top_k, top_p=top_p,
                                    temperature=temperature, max_rows=max_rows, new_graphs=new_graphs,
                                    on_step=on_step).cpu()
        ended = np.isin(out.numpy(), self._stop_ids()).any(1)  # (B,) the decode keeps a row's stop id
        return [clean_query(t) for t in self.tokenizer.batch_decode(out, skip_special_tokens=True)], ended

    def auto_batch_size(self, max_new_tokens: int = SamplingOptions.max_new_tokens) -> int:
        """``sample.batch_size: auto``: queries per decode batch.

        CUDA: the largest batch whose static KV cache, prefill activations and logits fit in 60% of the free
        memory, capped at 1,024. CPU: 64, the fastest of 16/32/64 measured on the 2-core dev machine with the
        bundled SmolLM2 at the demo's settings (80 documents cut to 64 tokens, 12 new tokens: 0.18-0.36 / 0.88
        / 0.97 queries/s on a machine shared with other jobs): a larger batch shares the prompt prefix and
        repeated documents' prompts among more queries, and each decode step's weight reads among more rows.
        """
        if self.device.type != "cuda":
            return CPU_BATCH
        return self.batch_for_memory(free_memory(self.device), max_new_tokens)

    def batch_for_memory(self, free_bytes: int, max_new_tokens: int = SamplingOptions.max_new_tokens,
                         cap: int = 1024) -> int:
        """The largest decode batch whose bf16 KV cache, prefill activations and logits fit in 60% of
        ``free_bytes`` (estimated generously from the model config), at most ``cap``."""
        cfg = self.model.config
        dec = cfg.get_text_config(decoder=True)
        layers = getattr(dec, "num_decoder_layers", None) or dec.num_hidden_layers
        if self.is_seq2seq:
            layers *= 2  # self- and cross-attention caches
        heads = getattr(dec, "num_key_value_heads", None) or dec.num_attention_heads
        hidden = dec.hidden_size
        head_dim = getattr(dec, "head_dim", None) or getattr(dec, "d_kv", None) or hidden // dec.num_attention_heads
        tokens = 4 * self.max_doc_tokens + 256 + max_new_tokens  # prompt (template, shots) + new tokens, generous
        kv = 2 * layers * heads * head_dim * tokens * 2  # bf16 keys and values
        act = tokens * hidden * 2 * 16  # prefill activations of one layer at a time, generous
        logits = cfg.vocab_size * 4 * 6  # fp32 logits, top-k/top-p and noise temporaries
        return int(max(1, min(cap, 0.6 * free_bytes // (kv + act + logits))))

    def sample_queries(self, docs: Sequence[str], n: int, seed: int = 0,
                       batch_size: int | str = SamplingOptions.batch_size,
                       max_new_tokens: int = SamplingOptions.max_new_tokens, top_k: int = SamplingOptions.top_k,
                       top_p: float = SamplingOptions.top_p, temperature: float = SamplingOptions.temperature,
                       max_redraws: int = 10, progress: bool = True, start: "SampledQueries | None" = None,
                       on_batch=None, compile: bool | str = SamplingOptions.compile,
                       compile_min_queries: int | str = SamplingOptions.compile_min_queries,
                       given: "Sequence[tuple[str, bool] | None] | None" = None,
                       draws: "tuple[np.ndarray, np.ndarray] | None" = None) -> SampledQueries:
        """Algorithm 1 line 1 / Section 4.3: draw ``n`` documents uniformly (with replacement, i.i.d. from
        the prior) and generate one query from each.

        Query j's tokens depend only on (seed, j, its document, the settings), not on ``batch_size``: see
        :mod:`gdr.lm.decode`. An empty generation is re-drawn from the same document with the next attempt
        number of its random stream, in the row bucket it falls in when that one is compiled already, else
        eagerly (no new compiled graph for a few rows). ``start`` resumes after already finished queries (any number);
        ``on_batch(partial)`` is called after every batch (used to checkpoint). ``compile`` (auto | true |
        false) and ``compile_min_queries`` decide whether the decode step is compiled, for all ``n`` queries
        (:func:`gdr.lm.compiling.want_compile`): a resumed call decodes on the same path as the first.
        ``given``: (n,) the (text, ended) of queries known already (from an older run over the same documents,
        their source unchanged), None where a query is to be decoded; only those are (no ``start``, no
        ``on_batch``).
        ``draws``: (source, stream), each (n,) int64: query j from document ``source[j]`` with random stream
        ``stream[j]`` (:func:`gdr.lm.decode.row_keys`); None: ``n`` documents drawn uniformly with ``seed``,
        query j on stream j.
        """
        source, stream = draws if draws is not None else (np.random.default_rng(seed).integers(0, len(docs), size=n),
                                                          np.arange(n))
        texts = list(start.texts) if start is not None else []
        ended = np.ones(n, dtype=bool)  # (n,) filled as queries are decoded
        if start is not None and start.ended is not None:
            ended[:len(texts)] = start.ended
        redrawn = start.n_redrawn if start is not None else 0
        done = len(texts)
        if given is not None:
            texts = [None if g is None else g[0] for g in given]
            ended[:] = [g is None or g[1] for g in given]
            todo = np.flatnonzero(np.array([g is None for g in given], dtype=bool))  # (n_left,) queries to decode
        else:
            todo = np.arange(done, n)
        bs = self.auto_batch_size(max_new_tokens) if batch_size == "auto" else int(batch_size)
        # decided from all n queries, not the ones left: a resumed run decodes with the same kernels
        self.decoder().set_compile(want_compile(compile, self.device, n, compile_min_queries))
        kw = dict(seed=seed, max_new_tokens=max_new_tokens, top_k=top_k, top_p=top_p, temperature=temperature,
                  max_rows=bs)
        # in a log file (not a terminal) a redraw is a line: at most one every 10 s there
        bar = tqdm(total=n, initial=n - len(todo), desc="sample queries", unit="q", disable=not progress,
                   mininterval=0.1 if on_terminal() else 10.0)
        for b in range(0, len(todo), bs):
            check_stop()  # a stop whose raise was lost (gdr.signals): the next batch does not start
            qid = todo[b:b + bs]
            idx = source[qid]
            b0 = n - len(todo) + b  # queries finished before this batch
            uniq, inv = np.unique(idx, return_inverse=True)
            # the bar moves with the decode steps of a batch (a batch may be every query), not only at its end
            step = partial(_advance, bar, b0, len(idx), max_new_tokens) if progress else None
            gen, ends = self.decode_ended([docs[i] for i in uniq], inv, stream[qid], 0, on_step=step, **kw)
            redrawn += self._redraw_empty(gen, docs, idx, stream[qid], max_redraws, ends, **kw)
            ended[qid] = ends
            empty = [int(idx[k]) for k, g in enumerate(gen) if not g]
            if empty:
                raise RuntimeError(f"documents {empty} gave empty queries {max_redraws} times; check the prompt")
            if given is None:
                texts.extend(gen)
            else:
                for j, g in zip(qid, gen):
                    texts[j] = g
            bar.update(b0 + len(idx) - bar.n)
            if on_batch is not None and given is None:
                on_batch(SampledQueries(texts, source[:len(texts)], redrawn, ended=ended[:len(texts)].copy()))
        bar.close()
        if redrawn:
            log.info("re-drew %d empty generations", redrawn)
        if n and not ended.all():
            log.info("%d of %d queries reached max_new_tokens=%d before the model ended them (scored without an "
                     "end)", int((~ended).sum()), n, max_new_tokens)
        return SampledQueries(texts, source.astype(np.int64), redrawn, self.decoder().compile_record(), ended)

    def _redraw_empty(self, gen: list[str], docs: Sequence[str], rows: np.ndarray, qid: np.ndarray,
                      max_redraws: int, ended: np.ndarray | None = None, **kw) -> int:
        """Re-draw, in place, each empty query ``gen[k]`` (of document ``docs[rows[k]]``, random stream ``qid[k]``)
        with the next attempt number of its stream, up to ``max_redraws`` times, compiling no new graph, and its
        ``ended[k]`` with it; returns the re-draws made. What is still empty after them is left empty."""
        redrawn = 0
        for attempt in range(1, max_redraws + 1):
            empty = np.array([k for k, g in enumerate(gen) if not g], dtype=np.int64)
            if not len(empty):
                break
            redrawn += len(empty)
            uniq, inv = np.unique(rows[empty], return_inverse=True)
            again, ends = self.decode_ended([docs[i] for i in uniq], inv, qid[empty], attempt, new_graphs=False, **kw)
            for k, g in zip(empty, again):
                gen[k] = g
            if ended is not None:
                ended[empty] = ends
        return redrawn

    def sample_per_doc(self, docs: Sequence[str], n_per_doc: int, first: int = 0, seed: int = 0,
                       max_new_tokens: int = SamplingOptions.max_new_tokens, top_k: int = SamplingOptions.top_k,
                       top_p: float = SamplingOptions.top_p, temperature: float = SamplingOptions.temperature,
                       max_rows: int | None = None, max_redraws: int = 10) -> list[list[str]]:
        """``n_per_doc`` queries for each document, each prompt prefilled once and shared by its queries.

        ``docs`` are corpus rows ``first, first + 1, ...``: query k of row i uses the random stream
        ``j = i * n_per_doc + k``, so the result does not depend on how the corpus is cut into batches.
        An empty generation is re-drawn from its document with the next attempt number of its stream, as
        :meth:`sample_queries` re-draws; one still empty after ``max_redraws`` is left out, with a warning
        naming its document. ``max_rows``: the caller's batch size (row buckets); whether the decode is compiled
        is the caller's choice (``self.decoder().set_compile``).
        """
        rows = np.repeat(np.arange(len(docs)), n_per_doc)
        qid = first * n_per_doc + np.arange(len(rows))
        kw = dict(seed=seed, max_new_tokens=max_new_tokens, top_k=top_k, top_p=top_p, temperature=temperature,
                  max_rows=max_rows)
        gen = self.decode_ended(docs, rows, qid, 0, **kw)[0]
        self._redraw_empty(gen, docs, rows, qid, max_redraws, **kw)
        left = sorted({first + int(rows[k]) for k, g in enumerate(gen) if not g})
        if left:
            log.warning("corpus rows %s gave an empty query %d times; their other queries are kept", left, max_redraws)
        return [[q for q in gen[i * n_per_doc:(i + 1) * n_per_doc] if q] for i in range(len(docs))]
