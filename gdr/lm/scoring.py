"""Scoring log p(query | doc) for every pair: the matrix P (Eq. 1).

The document's encoder pass (seq2seq) or prompt key/value cache (causal) is computed once per document
batch; all queries of a chunk are scored in one forward pass over it:

- causal: the queries of a chunk are packed into one sequence (no padding) after the cached prompt. Each
  query token attends to its document's prompt and to its own query's earlier tokens. On CUDA that pattern
  is a ``flex_attention`` block mask (block-sparse, no dense mask); on the CPU a dense additive 4D mask
  (measured faster there than eager flex attention, which materialises the scores). If compiled flex
  attention fails, the dense mask takes over (never eager flex: its fp32 scores would not fit on a GPU).
  The attention function itself is :mod:`gdr.lm.attention`.
- seq2seq: the decoder runs over (docs x queries) rows, but cross-attention folds the queries of a
  document into one sequence over that document's encoder states, so the encoder states and their
  key/value projections are neither copied nor recomputed per query.

A query's end (Eq. 1 scores it too) is the event the sampler stopped on: the model writing any of its stop ids
(:meth:`gdr.lm.sampling.SamplingMixin._stop_ids`: the end-of-sequence token, and for a causal model every token
that ends a line),
so its term is log of the summed probability of the stop ids, :data:`QUERY_END`. A query cut at ``max_new_tokens``
before the model ended it (``ended`` False) has no end term: its sampled event is its tokens alone.

Token log-probs never materialise (tokens x vocabulary) logits at once: :func:`token_logprobs` does the
output projection in token (and optionally vocabulary) chunks with an online logsumexp and the target
gather fused, accumulating in fp32 (the Liger-Kernel fused-linear-cross-entropy idea); on CUDA the chunk
function is ``torch.compile``-d and runs in bf16.
"""
from __future__ import annotations

import functools
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch.nn.attention.flex_attention import create_block_mask
from tqdm.auto import tqdm
from transformers import DynamicCache

from gdr.cost import batch_for_memory, dims, score_memory
from gdr.device import free_memory
from gdr.lm.attention import ATTN_IMPL, FlexFailed, compiled_flex, eager_flex, register_attention, set_attention
from gdr.lm.compat import cache_kwarg
from gdr.lm.compiling import compile_cache_dir
from gdr.lm.hostsync import upload
from gdr.lm.numerics import score_compute_dtype
from gdr.lm.precision import cast_copy
from gdr.signals import check as check_stop

log = logging.getLogger(__name__)

__all__ = ["ScoringCopy", "ScoringKernels", "ScoringMixin", "token_logprobs", "auto_score_sizes",
           "score_compute_dtype", "CPU_DOC_BATCH_SIZE", "CPU_MAX_QUERY_TOKENS", "QUERY_END"]

# Measured best on a 2-core CPU (SmolLM2, `python -m gdr.bench.scoring`): one document per pass, the
# whole query set (up to 2,048 tokens) per chunk.
CPU_DOC_BATCH_SIZE, CPU_MAX_QUERY_TOKENS = 1, 2048

# How P scores a query's end (the module docstring): recorded in P's and the sampled queries' manifests, whose
# bytes it decides: log p(any stop id) after an ended query, no term after a cut one; "line-end": a causal model's
# stop ids are its end token and every token that ends a line ("stop-set": its end token and "\n").
QUERY_END = "line-end"


# ----------------------------------------------------------------------------------------- log-probs
def _logits(h: torch.Tensor, w: torch.Tensor, fp32_out: bool = True) -> torch.Tensor:
    """h (n, d) @ w (v, d).T as fp32 (n, v). On CUDA a bf16 tensor-core matmul whose fp32 accumulator is
    written as is (not rounded to bf16; ``fp32_out``: this torch's ``mm`` takes ``out_dtype``, :func:`fp32_out_mm`);
    on a CPU (no fp32-out bf16 matmul there) the same numbers from the bf16 values multiplied in fp32; fp32
    inputs: the plain matmul."""
    if h.dtype != torch.float32:
        if h.is_cuda and fp32_out:
            return torch.mm(h, w.t(), out_dtype=torch.float32)
        if not h.is_cuda:
            return h.float() @ w.float().t()
    return (h @ w.t()).float()


@functools.cache
def fp32_out_mm(device: torch.device) -> bool:
    """Whether this torch's CUDA ``mm`` on ``device`` takes ``out_dtype`` (bf16 in, fp32 out): a fact of the torch
    build, probed once per device, eagerly (never inside a compiled function). False off CUDA."""
    if device.type != "cuda":
        return False
    try:
        a = torch.ones(2, 2, device=device, dtype=torch.bfloat16)
        torch.mm(a, a, out_dtype=torch.float32)
        return True
    except (RuntimeError, TypeError, NotImplementedError):
        log.warning("torch.mm has no fp32 out_dtype here: log-prob logits rounded to bf16")
        return False


def _lse_chunk(h: torch.Tensor, w: torch.Tensor, tgt: torch.Tensor, v0: int, fp32_out: bool = True
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One (tokens x vocab) tile: row max, sum of exp(logit - max), and the target logit where it falls in
    this tile (0 elsewhere). h (n, d), w (v, d), tgt (n,) -> three (n,) fp32."""
    logits = _logits(h, w, fp32_out)  # (n, v)
    m = logits.amax(-1)
    s = torch.exp(logits - m[:, None]).sum(-1)
    local = tgt - v0
    inside = (local >= 0) & (local < w.shape[0])
    t = logits.gather(1, local.clamp(0, w.shape[0] - 1)[:, None])[:, 0]
    return m, s, torch.where(inside, t, torch.zeros_like(t))


@functools.cache
def _compiled_lse_chunk(options: tuple = ()):
    """``_lse_chunk`` compiled (one fused reduction over the tile), built once per process and options: it
    depends on nothing but the torch build, so every scorer shares it."""
    compile_cache_dir()  # compiled kernels persist across processes
    return torch.compile(_lse_chunk, dynamic=True, **dict(options))


@dataclass
class ScoringKernels:
    """How a scorer (``GenerativeLM.kernels``) runs its kernels, and which compiled ones failed for it.

    ``compile``: None compiles on CUDA (the log-prob tile, flex attention; the block-mask builder on CUDA only)
    and runs eagerly elsewhere; True compiles on any device (the tests run the CUDA configuration on the CPU
    so, with ``options={"backend": "eager"}``). Compiled scoring pads to fixed shapes (:meth:`ScoringMixin.score`),
    so that ragged prompts and the last, smaller doc batch reuse the graphs of the first. A compiled kernel
    that fails runs its eager twin (log-probs) or the dense path (flex attention) for the rest of the scorer's
    life, after one log line."""

    compile: bool | None = None
    options: dict = field(default_factory=dict)  # further torch.compile arguments (tests: backend="eager")
    flex_failed: bool = False  # compiled flex attention failed: the dense additive mask
    log_probs_failed: bool = False  # the compiled log-prob tile failed: eager (same numbers, slower)

    def compiled(self, device: torch.device) -> bool:
        return device.type == "cuda" if self.compile is None else bool(self.compile)

    def _key(self) -> tuple:
        return tuple(sorted(self.options.items()))

    def lse(self, device: torch.device):
        """The log-prob tile function: compiled unless eager here or failed before."""
        return _compiled_lse_chunk(self._key()) if self.compiled(device) and not self.log_probs_failed else _lse_chunk

    def flex(self, device: torch.device) -> tuple[object, bool]:
        """(flex attention, whether it is compiled), passed to the attention function (``gdr_flex``)."""
        return (compiled_flex(self._key()), True) if self.compiled(device) else (eager_flex(), False)


@dataclass
class QueryEnds:
    """The end term of a causal ``score`` call (:data:`QUERY_END`), on the device: ``stop`` (S,) the stop ids, the
    end-of-sequence token first (None when it is the only one: its log-prob is the term, nothing to add);
    ``first`` (J,) bool, the queries whose one token is their end (scored from the prompt's last state)."""

    stop: torch.Tensor | None
    first: torch.Tensor | None


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None = None,
                   token_chunk: int | None = None, vocab_chunk: int | None = None,
                   kernels: ScoringKernels | None = None) -> torch.Tensor:
    """``log_softmax(hidden @ weight.T + bias)[targets]`` without materialising all logits at once.

    Tokens go in chunks of ``token_chunk`` rows (None: 4,096 on CUDA, 1,024 elsewhere); within a chunk the
    vocabulary goes in tiles of ``vocab_chunk`` (all at once when None) with an online logsumexp, and the target
    logit is picked from the tile that holds it. The matmul runs in the inputs' dtype (bf16 on CUDA), everything
    after it in fp32; in fp32 the result equals ``log_softmax`` + ``gather`` to rounding.

    Parameters
    ----------
    hidden : (N, d) final hidden states (already scaled where the model scales them before its head).
    weight : (V, d) output projection.
    targets : (N,) int64 token ids.
    bias : (V,) or None.
    kernels : the caller's :class:`ScoringKernels` (a fresh one, this call only, when None): the tile is
        compiled on CUDA unless it failed there before.

    Returns
    -------
    (N,) float32 log-probabilities.
    """
    N, V = hidden.shape[0], weight.shape[0]
    token_chunk = token_chunk or (4096 if hidden.device.type == "cuda" else 1024)
    vc = V if vocab_chunk is None else int(vocab_chunk)
    kernels = kernels if kernels is not None else ScoringKernels()
    fp32_out = fp32_out_mm(hidden.device)
    fn = kernels.lse(hidden.device)
    out = torch.empty(N, dtype=torch.float32, device=hidden.device)
    for s0 in range(0, N, token_chunk):
        h, t = hidden[s0:s0 + token_chunk], targets[s0:s0 + token_chunk]
        m = torch.full((h.shape[0],), -torch.inf, dtype=torch.float32, device=h.device)
        s = torch.zeros_like(m)
        tl = torch.zeros_like(m)
        for v0 in range(0, V, vc):
            w = weight[v0:v0 + vc]
            if bias is not None:  # rare (no bias in Llama/T5 heads): a bias column, eagerly
                hb = torch.cat([h, torch.ones_like(h[:, :1])], 1)  # (n, d + 1)
                cm, cs, ct = _lse_chunk(hb, torch.cat([w, bias[v0:v0 + vc, None].to(w.dtype)], 1), t, v0, fp32_out)
            else:
                try:
                    cm, cs, ct = fn(h, w, t, v0, fp32_out)
                except Exception as e:  # noqa: BLE001 - a compiler failure: eager (same numbers, slower)
                    if fn is _lse_chunk:
                        raise
                    log.warning("compiled log-prob kernel failed (%s); using eager", e)
                    kernels.log_probs_failed, fn = True, _lse_chunk
                    cm, cs, ct = fn(h, w, t, v0, fp32_out)
            new_m = torch.maximum(m, cm)
            s = s * torch.exp(m - new_m) + cs * torch.exp(cm - new_m)
            m, tl = new_m, tl + ct
        out[s0:s0 + h.shape[0]] = tl - (m + torch.log(s))
    return out


# ----------------------------------------------------------------------------------------- sizes
def auto_score_sizes(model, device: torch.device, prompt_tokens: int = 512,
                     free_bytes: int | None = None) -> tuple[int, int]:
    """(doc_batch_size, max_query_tokens) for ``score``: on CUDA from free GPU memory, on a CPU the
    measured best (:data:`CPU_DOC_BATCH_SIZE`, :data:`CPU_MAX_QUERY_TOKENS`).

    On CUDA a causal chunk is 4,096 query tokens per document; a seq2seq chunk, split over the batch's
    documents, 65,536 (a decoder pass has no prompt cache, only the encoder states to keep). Half the
    free memory, less the log-prob tile (4,096 tokens x vocabulary, fp32, twice), goes to documents, at most
    64: per document the key/value cache of prompt + chunk and a chunk's activations
    (:func:`gdr.cost.score_memory`).
    """
    if device.type != "cuda":
        return CPU_DOC_BATCH_SIZE, CPU_MAX_QUERY_TOKENS
    T = 4096
    if free_bytes is None:
        free_bytes = free_memory(device)  # the caching allocator emptied first
    per_doc, tile = score_memory(dims(model.config), prompt_tokens, T)
    bs = batch_for_memory(free_bytes, per_doc, share=0.5, fixed=tile, cap=64)
    return (bs, 16 * T) if model.config.is_encoder_decoder else (bs, T)


# ----------------------------------------------------------------------------------------- scoring
@dataclass
class ScoringCopy:
    """The scorer's copy of ``source`` cast to a compute dtype, valid while ``stamp`` (dtype, device, the sum of
    the weights' in-place version counters) holds and the scorer's model is still ``source``."""

    source: torch.nn.Module
    stamp: tuple
    model: torch.nn.Module


class ScoringMixin:
    """P-matrix scoring for :class:`gdr.lm.GenerativeLM` (needs ``model``, ``device``, ``kernels`` (a
    :class:`ScoringKernels`) and ``score_copy`` (a :class:`ScoringCopy` or None) set by its ``__init__``)."""

    @torch.inference_mode()
    def score(self, docs: Sequence[str], queries: Sequence[str], doc_batch_size: int | str = 4,
              max_query_tokens: int | str = 2048, progress: bool = True, compute_dtype: torch.dtype | None = None,
              attention: str = "auto", groups: np.ndarray | None = None,
              ended: Sequence[bool] | np.ndarray | None = None) -> np.ndarray:
        """log p(query_j | doc_i) for every pair (Eq. 1), a query's end included (:data:`QUERY_END`).

        Parameters
        ----------
        docs : sequence of str, length n_docs
        queries : sequence of str, length n_queries
        doc_batch_size : documents per forward pass (sorted by prompt length to limit padding); ``"auto"``
            from free GPU memory (:func:`auto_score_sizes`).
        max_query_tokens : query tokens per chunk (bounds memory; the prompt is reused across chunks), or ``"auto"``.
        compute_dtype : None: bf16 on CUDA (a bf16 copy of the weights), the model's own dtype elsewhere.
        attention : causal models only: ``"flex"`` (block mask), ``"dense"`` (additive 4D mask), or
            ``"auto"``: flex on CUDA, dense on a CPU.
        groups : (n_queries,) int or None: a chunk never holds the queries of two groups (their source
            documents), so that with ``doc_batch_size=1`` entry (i, j) depends only on document i and the
            queries of j's group, not on the other queries scored beside them (incremental P). None: all
            queries are packed together (fewer, fuller passes).
        ended : (n_queries,) bool or None (all): False for a query cut at ``max_new_tokens`` before the model
            ended it (``SampledQueries.ended``): no end term.

        Returns
        -------
        logp : float32 ndarray of shape (n_docs, n_queries)
        """
        p_ids = self.prompt_ids(docs)
        ended = np.ones(len(queries), dtype=bool) if ended is None else np.asarray(ended, dtype=bool)
        q_ids = self.query_ids(queries, ended)
        if "auto" in (doc_batch_size, max_query_tokens):
            bs, mq = auto_score_sizes(self.model, self.device, max(map(len, p_ids), default=1))
            doc_batch_size = bs if doc_batch_size == "auto" else int(doc_batch_size)
            max_query_tokens = mq if max_query_tokens == "auto" else int(max_query_tokens)
        if attention == "auto":
            attention = "flex" if self.device.type == "cuda" else "dense"
        if attention not in ("flex", "dense"):
            raise ValueError(f"attention={attention!r}: use auto, flex or dense")
        model = self._scoring_model(compute_dtype)
        order = np.argsort([len(p) for p in p_ids], kind="stable")
        # Queries sorted by (group, length): chunks of similar lengths (less padding in seq2seq rows); put back below.
        q_order = np.lexsort((np.array([len(q) for q in q_ids], dtype=np.int64),
                              np.zeros(len(q_ids), dtype=np.int64) if groups is None else np.asarray(groups)))
        q_sorted, g_sorted = [q_ids[j] for j in q_order], None if groups is None else np.asarray(groups)[q_order]
        e_sorted = ended[q_order]
        # causal: the query chunks are the same for every doc batch: packed and uploaded once
        flex, fixed = attention == "flex", self.kernels.compiled(self.device)
        packs = {} if self.is_seq2seq else {
            flex: self._pack_causal(q_sorted, max_query_tokens, flex, fixed, g_sorted, e_sorted)}
        # compiled: every batch padded to one shape (rows, prompt length), so no batch compiles a graph of its own
        prompt_len = self.longest_prompt_tokens() if fixed else None
        out = np.empty((len(docs), len(queries)), dtype=np.float32)
        bar = tqdm(total=len(docs) * len(queries), desc="score", unit="pair", unit_scale=True,
                   disable=not progress)
        for b0 in range(0, len(docs), doc_batch_size):
            check_stop()  # a stop whose raise was lost (gdr.signals): the next batch does not start
            rows = order[b0:b0 + doc_batch_size]
            batch = [p_ids[i] for i in rows]
            if fixed:  # the last, smaller batch: copies of its last prompt, dropped below
                batch += batch[-1:] * (doc_batch_size - len(batch))
            # The scoring model is already in its compute dtype: no autocast casts.
            with torch.autocast(self.device.type, enabled=False):
                if self.is_seq2seq:
                    lp = self._score_seq2seq(model, batch, q_sorted, max_query_tokens, prompt_len, g_sorted)
                else:
                    lp = self._score_causal_batch(model, batch, packs, (q_sorted, g_sorted, e_sorted),
                                                  max_query_tokens, flex, prompt_len)
            out[rows[:, None], q_order[None, :]] = lp[:len(rows)].float().cpu().numpy()  # the batch's one host sync
            bar.update(len(rows) * len(queries))
        bar.close()
        return out

    def _scoring_model(self, compute_dtype: torch.dtype | None):
        """The model the scoring passes run: ``self.model`` with our attention function (identical to SDPA
        outside scoring), or a copy cast to ``compute_dtype`` (bf16 on CUDA by default), held in
        ``self.score_copy`` and made again when the model was replaced, or its weights changed in place (a
        fine-tune) or moved since."""
        register_attention()
        params = list(self.model.parameters())
        own = params[0].dtype
        dtype = compute_dtype or score_compute_dtype("auto", self.device, own)
        if getattr(self.model.config, "_attn_implementation", None) not in ("sdpa", ATTN_IMPL):
            self.model.set_attn_implementation("sdpa")
        if dtype == own:
            set_attention(self.model, ATTN_IMPL)
            return self.model
        stamp = (dtype, params[0].device, sum(p._version for p in params))
        held = self.score_copy
        if held is None or held.source is not self.model or held.stamp != stamp:
            m = cast_copy(self.model, dtype)  # rotary frequencies stay fp32
            set_attention(m, ATTN_IMPL)
            held = self.score_copy = ScoringCopy(self.model, stamp, m)
        return held.model

    def _score_causal_batch(self, model, prompts: list[list[int]], packs: dict[bool, tuple], queries: tuple,
                            max_query_tokens: int, flex: bool, prompt_len: int | None = None) -> torch.Tensor:
        """:meth:`_score_causal` of one document batch on the queries packed by :meth:`_pack_causal`; if
        compiled flex attention fails, the batch (and every later one of this scorer) is scored on the dense
        path, with one log line (``self.kernels.flex_failed``). ``packs``: this ``score`` call's packings by
        ``flex`` (flex pads each chunk to its block size); the dense one is added the first time it is needed, from
        ``queries`` (the sorted query ids, their groups and ends, as :meth:`_pack_causal` takes them).
        ``prompt_len``: pad the prompts to at least this many tokens (compiled: one shape for every batch)."""
        if flex and not self.kernels.flex_failed:
            try:
                return self._score_causal(model, prompts, *packs[True], True, prompt_len)
            except FlexFailed as e:
                log.warning("compiled flex attention failed (%s); scoring on the dense path from now on", e)
                self.kernels.flex_failed = True
        if False not in packs:  # the flex packing's block padding is not what the dense path expects
            packs[False] = self._pack_causal(queries[0], max_query_tokens, False, groups=queries[1], ended=queries[2])
        return self._score_causal(model, prompts, *packs[False], False, prompt_len)

    def _query_chunks(self, q_ids: list[list[int]], max_tokens: int, groups: np.ndarray | None = None
                      ) -> list[tuple[int, int]]:
        """(c0, c1) bounds of consecutive queries of at most ``max_tokens`` tokens (a longer query alone), a new
        chunk wherever ``groups`` (n_queries,) changes."""
        chunks, start, tokens = [], 0, 0
        for j, q in enumerate(q_ids):
            if j > start and (tokens + len(q) > max_tokens or (groups is not None and groups[j] != groups[start])):
                chunks.append((start, j))
                start, tokens = j, 0
            tokens += len(q)
        chunks.append((start, len(q_ids)))
        return chunks

    def _token_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, model=None) -> torch.Tensor:
        """log softmax(lm_head(hidden))[targets] through :func:`token_logprobs`. hidden (N, d), targets (N,) -> (N,)"""
        head = (model or self.model).get_output_embeddings()
        return token_logprobs(hidden, head.weight, targets, getattr(head, "bias", None), kernels=self.kernels)

    def _pack_causal(self, q_ids: list[list[int]], max_query_tokens: int, flex: bool, fixed: bool = False,
                     groups: np.ndarray | None = None, ended: np.ndarray | None = None
                     ) -> tuple[torch.Tensor, QueryEnds, list[tuple[int, int, torch.Tensor, torch.Tensor | None]]]:
        """The queries as :meth:`_score_causal` reads them, built on the host and uploaded without a host sync
        (:func:`gdr.lm.hostsync.upload`) once per ``score`` call.

        Returns the (J,) first token of every query, their :class:`QueryEnds` (``ended`` (J,) bool: which queries' last
        token is their end; None: all) and, per chunk of queries ``c0:c1`` (at most ``max_query_tokens`` tokens) with a
        token to predict after its first, a (4, T) int64 tensor: the packed input (every query without its last token),
        the targets (without its first), the query of each token (0..Q-1; Q for the padding) and its position inside its
        query; and a (2, E) int64 tensor (None when E = 0, or when the end token is the only stop id): the packed
        position of each ended query's end and that query (0..Q-1). Flex pads a chunk to a multiple of its 128-token
        block (shapes repeat across chunks), or with ``fixed`` (compiled scoring) every chunk to the longest one's: the
        padding is one more query whose sums are dropped. ``groups`` (J,): a chunk holds the queries of one group only
        (:meth:`_query_chunks`).
        """
        first = upload([q[0] for q in q_ids], self.device)  # (J,)
        ended = np.ones(len(q_ids), dtype=bool) if ended is None else np.asarray(ended, dtype=bool)
        stop = self._stop_ids()
        many = len(stop) > 1  # other stop ids than the end token: a term to add at each end
        only_end = ended & (np.array([len(q) for q in q_ids]) == 1)  # (J,) the end is the query's one token
        ends = QueryEnds(upload([self.eos_id] + [s for s in stop if s != self.eos_id], self.device) if many else None,
                         upload(only_end, self.device) if many and only_end.any() else None)
        bounds = self._query_chunks(q_ids, max_query_tokens, groups)
        tokens = [sum(len(q) - 1 for q in q_ids[c0:c1]) for c0, c1 in bounds]
        width = max(-(-T // 128) * 128 for T in tokens) if flex and fixed else 0
        chunks = []
        for (c0, c1), T in zip(bounds, tokens):
            chunk = q_ids[c0:c1]
            lens = np.array([len(q) - 1 for q in chunk], dtype=np.int64)  # (Q,) packed tokens per query
            if T == 0:  # single-token queries: the first-token term is all
                continue
            pad = (width - T if fixed else -T % 128) if flex else 0
            lens = np.append(lens, pad)  # (Q + 1,)
            inp = [t for q in chunk for t in q[:-1]] + [self.pad_id] * pad  # (T + pad,)
            tgt = [t for q in chunk for t in q[1:]] + [self.pad_id] * pad
            qid = np.repeat(np.arange(len(chunk) + 1), lens)  # (T + pad,) query of each token
            off = np.arange(T + pad) - np.repeat(np.cumsum(lens) - lens, lens)  # position inside its query
            at_end = np.flatnonzero(ended[c0:c1] & (lens[:-1] > 0)) if many else np.zeros(0, dtype=np.int64)
            end_pos = upload(np.stack([np.cumsum(lens)[at_end] - 1, at_end]), self.device) if len(at_end) else None
            chunks.append((c0, c1, upload(np.stack([inp, tgt, qid, off]), self.device), end_pos))
        return first, ends, chunks

    def _score_causal(self, model, prompts: list[list[int]], first: torch.Tensor, ends: QueryEnds,
                      chunks: list[tuple[int, int, torch.Tensor, torch.Tensor | None]], flex: bool,
                      prompt_len: int | None = None) -> torch.Tensor:
        """(B, n_queries) log-probs of every query after every prompt of the batch; ``first``, ``ends`` and
        ``chunks``: the queries from :meth:`_pack_causal`; prompts right-padded to at least ``prompt_len``."""
        dev = self.device
        B = len(prompts)
        plen_h = [len(p) for p in prompts]
        plen = upload(plen_h, dev)  # (B,)
        enc = self._pad(prompts, length=prompt_len)
        Lp = enc["input_ids"].shape[1]
        # Given the 2D mask, transformers would read it on the host (a sync) to see whether it can use plain
        # causal attention. The host knows: without padding no mask (causal), else the (B, 1, Lp, Lp) bool mask
        # transformers builds for SDPA (causal and not padding), the same numbers.
        attn = None
        if min(plen_h) < Lp:
            ar = torch.arange(Lp, device=dev)
            attn = ((ar[None, :] <= ar[:, None])[None] & (ar[None, None, :] < plen[:, None, None]))[:, None]
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model

        cache = DynamicCache(config=model.config)
        ckw = cache_kwarg(base)
        h = base(input_ids=enc["input_ids"], attention_mask=attn, **{ckw: cache},
                 use_cache=True).last_hidden_state  # (B, Lp, d)
        h_last = h[torch.arange(B, device=dev), plen - 1]  # (B, d): predicts each query's first token
        # First tokens: one log-softmax row per document, gathered for every query.
        out = self._first_token_logprobs(model, h_last, first, ends)  # (B, J)
        for c0, c1, packed, end_pos in chunks:
            inp, tgt, qid, off = packed  # (T,) each
            T, Q = packed.shape[1], c1 - c0
            if flex:
                mask = self._block_mask(plen, Lp, off)
            else:
                mask = self._dense_mask(plen, Lp, qid, off, h.dtype)
            pos = plen[:, None] + off[None, :]  # (B, T)
            kw = {"gdr_flex": self.kernels.flex(dev)} if flex else {}  # to gdr.lm.attention.gdr_attention
            hq = base(input_ids=inp[None].expand(B, T), attention_mask=mask, position_ids=pos,
                      **{ckw: cache}, use_cache=True, **kw).last_hidden_state  # (B, T, d)
            cache.crop(-T)  # drop this chunk, keep the prompt for the next one
            lp = self._token_logprobs(hq.reshape(B * T, -1), tgt.repeat(B), model).view(B, T)
            out[:, c0:c1] += torch.zeros((B, Q + 1), device=dev).index_add_(1, qid, lp)[:, :Q]
            if end_pos is not None:  # each ended query once: a plain indexed add
                pos, q = end_pos
                out[:, c0 + q] += self._other_stops(model, hq[:, pos].reshape(-1, hq.shape[-1]), ends.stop
                                                    ).view(B, -1)
        return out

    @staticmethod
    def _other_stops(model, h: torch.Tensor, stop: torch.Tensor) -> torch.Tensor:
        """(N,) what turns log p(end token) into log p(any stop id) (:data:`QUERY_END`) at hidden states h (N, d)
        whose target is the end token: logsumexp of the stop ids' (S,) logits less the end token's (``stop[0]``),
        the logits computed as the log-prob tile computes them."""
        head = model.get_output_embeddings()
        logits = _logits(h, head.weight.index_select(0, stop), fp32_out_mm(h.device))  # (N, S)
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias.index_select(0, stop).float()
        return torch.logsumexp(logits, -1) - logits[:, 0]

    def _first_token_logprobs(self, model, h_last: torch.Tensor, first: torch.Tensor, ends: QueryEnds
                              ) -> torch.Tensor:
        """(B, J) log p(first token of query j | prompt b): one full log-softmax row per document; for a query
        whose one token is its end, log p(any stop id) (``ends``)."""
        head = model.get_output_embeddings()
        logits = _logits(h_last, head.weight, fp32_out_mm(h_last.device))  # (B, V)
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias.float()
        logp = logits.log_softmax(-1)
        out = logp[:, first]
        if ends.first is not None:
            out = torch.where(ends.first[None, :], torch.logsumexp(logp[:, ends.stop], -1, keepdim=True), out)
        return out

    @staticmethod
    def _dense_mask(plen, Lp, qid, off, dtype) -> torch.Tensor:
        """(B, 1, T, Lp + T) additive mask: a query token sees its document's prompt (not padding) and the
        earlier tokens of its own query."""
        B, T, dev = plen.shape[0], qid.shape[0], qid.device
        see_prompt = torch.arange(Lp, device=dev)[None, :] < plen[:, None]  # (B, Lp)
        see_query = (qid[:, None] == qid[None, :]) & (off[None, :] <= off[:, None])  # (T, T)
        allowed = torch.cat([see_prompt[:, None, :].expand(B, T, Lp), see_query[None].expand(B, T, T)], -1)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[:, None]

    @staticmethod
    def _block_mask(plen, Lp, off):
        """The same pattern as :meth:`_dense_mask` as a flex-attention ``BlockMask`` over (B, T, Lp + T).

        A chunk's queries are packed one after another, so the keys a query token sees in the chunk are the
        contiguous run from its query's first token (``q_idx - off[q_idx]``) to itself: one load per row
        (``off[q_idx]``) where comparing the query ids and offsets of both sides took four."""
        B, T, dev = plen.shape[0], off.shape[0], off.device
        # a tensor, not a Python int: no recompile per prompt length; filled on the device, not uploaded
        n_prompt = torch.full((), Lp, dtype=torch.long, device=dev)

        def mask_mod(b, h, q_idx, kv_idx):
            kq = kv_idx - n_prompt  # index of a query key in the packed chunk (negative: a prompt key)
            prompt = (kq < 0) & (kv_idx < plen[b])
            own = (kq >= q_idx - off[q_idx]) & (kq <= q_idx)
            return prompt | own

        if dev.type == "cuda":
            compile_cache_dir()
            try:
                return create_block_mask(mask_mod, B, None, T, Lp + T, device=dev, _compile=True)
            except Exception as e:  # noqa: BLE001 - a compiler failure: the eager builder (same mask)
                log.warning("compiled block-mask builder failed (%s); using eager", e)
        return create_block_mask(mask_mod, B, None, T, Lp + T, device=dev)

    def _score_seq2seq(self, model, prompts: list[list[int]], q_ids: list[list[int]], max_query_tokens: int,
                       prompt_len: int | None = None, groups: np.ndarray | None = None) -> torch.Tensor:
        """(B, n_queries): the encoder once per document; the decoder over (B*Q, L) rows whose cross-attention
        reads each document's encoder states once (see :func:`gdr.lm.attention.gdr_attention`); prompts
        right-padded to at least ``prompt_len``; a chunk holds the queries of one of ``groups`` (n_queries,) only."""
        dev = self.device
        B = len(prompts)
        enc = self._pad(prompts, length=prompt_len)
        # (B, 1, 1, S) bool, used as is: a 2D mask would be read on the host (a sync) to see if it can be dropped
        enc_mask = enc["attention_mask"].bool()[:, None, None, :]
        enc_h = model.get_encoder()(input_ids=enc["input_ids"], attention_mask=enc_mask).last_hidden_state  # (B, S, d)
        start = model.config.decoder_start_token_id
        start = self.pad_id if start is None else int(start)
        scaled = getattr(model.config, "scale_decoder_outputs", model.config.tie_word_embeddings)
        scale = model.config.d_model ** -0.5 if scaled else 1.0  # T5 scales before a tied head
        out = torch.empty((B, len(q_ids)), dtype=torch.float32, device=dev)
        for c0, c1 in self._query_chunks(q_ids, max(1, max_query_tokens // B), groups):
            chunk = q_ids[c0:c1]
            Q, L = len(chunk), max(len(q) for q in chunk)
            # Built on the host, one upload: the right-padded labels, the decoder inputs (shifted right) and the
            # flat index of every real token of the (B*Q, L) rows in row-major order (what boolean indexing with
            # the padding mask would pick, without its device-to-host count).
            labels = np.full((Q, L), self.pad_id, dtype=np.int64)
            real = np.arange(L)[None, :] < np.array([len(q) for q in chunk])[:, None]  # (Q, L)
            labels[real] = np.concatenate(chunk)
            dec_in = np.concatenate([np.full((Q, 1), start), labels[:, :-1]], 1)  # shift right
            sel = np.flatnonzero(np.tile(real, (B, 1)))  # (n_tokens,)
            both = upload(np.concatenate([labels.ravel(), dec_in.ravel(), sel]), dev)
            labels_d, dec_d, sel_d = both[:Q * L].view(Q, L), both[Q * L:2 * Q * L].view(Q, L), both[2 * Q * L:]
            # Right padding only affects later (padding) positions under the causal mask: no decoder mask.
            hd = model.get_decoder()(input_ids=dec_d.repeat(B, 1), encoder_hidden_states=enc_h,
                                     encoder_attention_mask=enc_mask, use_cache=False).last_hidden_state  # (B*Q, L, d)
            hs = hd.reshape(B * Q * L, -1).index_select(0, sel_d)  # (n_tokens, d)
            lp = self._token_logprobs(hs * scale, labels_d.repeat(B, 1).view(-1).index_select(0, sel_d), model)
            out[:, c0:c1] = torch.zeros(B * Q, device=dev).index_add_(0, sel_d // L, lp).view(B, Q)
        return out

    @contextmanager
    def _fp32_reference(self):
        """What :meth:`score_naive` runs: the model's weights in fp32 (an fp32 copy if the model is not), autocast
        off and fp32 matmuls at full precision (no TF32) on every device, whatever the caller has set."""
        own = next(self.model.parameters()).dtype
        model = self.model if own == torch.float32 else cast_copy(self.model, torch.float32)
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        try:
            with torch.autocast(self.device.type, enabled=False):
                yield model
        finally:
            torch.set_float32_matmul_precision(before)

    @torch.inference_mode()
    def score_naive(self, docs: Sequence[str], queries: Sequence[str],
                    ended: Sequence[bool] | np.ndarray | None = None) -> np.ndarray:
        """Reference: one full forward pass of prompt + query per pair, the log-softmax of the model's logits
        summed over the query's tokens, an ended query's end as log p(any stop id) (:data:`QUERY_END`), in fp32
        with autocast off (:meth:`_fp32_reference`), also on CUDA.

        Used by the benchmark (its ``max_abs_diff``) and the tests; never in a hot path.
        """
        ended = np.ones(len(queries), dtype=bool) if ended is None else np.asarray(ended, dtype=bool)
        p_ids = self.prompt_ids(docs)
        q_ids = self.query_ids(queries, ended)
        stop = self._stop_ids()
        out = np.empty((len(docs), len(queries)), dtype=np.float32)
        with self._fp32_reference() as model:
            for i, p in enumerate(p_ids):
                for j, q in enumerate(q_ids):
                    if self.is_seq2seq:
                        logits = model(input_ids=torch.tensor([p], device=self.device),
                                       labels=torch.tensor([q], device=self.device)).logits[0]  # (len(q), V)
                    else:
                        logits = model(input_ids=torch.tensor([p + q], device=self.device)).logits[0, len(p) - 1:-1]
                    logp = logits.float().log_softmax(-1)
                    terms = logp[torch.arange(len(q)), torch.tensor(q)]
                    if ended[j]:
                        terms[-1] = torch.logsumexp(logp[-1, stop], 0)
                    out[i, j] = float(terms.sum())
        return out
