"""Our own sampling decode loop (gpt-fast style) for both model families, with per-query random streams.

The model forward is transformers'; the loop, the cache handling and the sampling are ours:

- **prefill once**: the prompts of a batch are de-duplicated (``per_doc`` asks n queries of one document;
  ``sample_queries`` draws documents with replacement) and, for causal models, the token prefix every
  prompt shares (system message, few-shot examples) is run once for the whole batch. The key/value rows of
  a prompt are then *copied* to each query that uses it, never recomputed.
- **static KV cache**: one ``StaticCache`` per batch (``EncoderDecoderCache`` of two for T5), allocated
  once and written in place; every decode step is one token for every row, so its shapes never change and,
  when compiling (``sample.compile``: auto = CUDA and enough queries to pay for it, :mod:`gdr.lm.compiling`),
  it is captured by ``torch.compile(mode="reduce-overhead")`` (CUDA graphs). Compiled batches are padded to
  a few row buckets so that every batch size reuses the same few compiled steps; re-draws of empty queries
  compile nothing new (their bucket's graph, or eager), and a shape whose compile or capture fails decodes
  eagerly (:meth:`Decoder.compile_record` says which, for the sampling manifests).
- causal prompts are left-padded *after* the shared prefix: ``[prefix | pad | doc suffix | new tokens]``
  with the padding masked and position ids counted over real tokens only.
- **sampling**: temperature, top-k and top-p (the semantics of transformers' warpers, vectorised over the
  batch), then the Gumbel-max trick ``argmax(logits / T + g)`` where the Gumbel noise ``g`` of token ``v``
  at step ``t`` of query ``j`` is a counter-based hash of ``(seed, j, t, attempt, v)`` (int64 torch ops).
  So query j's tokens do not depend on which batch, process or resume computed it: the same seed gives the
  same queries at any batch size (up to floating-point near-ties of two candidates' scores; on CUDA bf16 makes
  such near-ties likelier than on the CPU's fp32).
- each row stops at a stop id (EOS; for a causal model any token that ends a line); finished rows keep running
  (static shapes) but emit padding.

Bump :data:`SAMPLER_VERSION` whenever a change alters which queries a seed gives: run folders record it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from transformers import EncoderDecoderCache, StaticCache
from transformers.modeling_outputs import BaseModelOutput

from gdr.lm.attention import use_gdr_attention
from gdr.lm.compat import cache_kwarg
from gdr.lm.compiling import allow_bucket_recompiles, batch_bucket, compile_cache_dir
from gdr.lm.hostsync import padding_mask_4d
from gdr.lm.numerics import decode_dtype, decode_numerics
from gdr.lm.precision import cast_copy
from gdr.models import SamplingOptions

log = logging.getLogger(__name__)

__all__ = ["SAMPLER_VERSION", "PER_DOC_SAMPLER", "GREEDY_BELOW", "Decoder", "filter_logits", "gumbel_noise",
           "sample_next", "stop_check_every"]

# Which queries a (seed, settings) pair gives, recorded in each query manifest. "hf-generate" (a manifest without a
# version) is transformers' batch-seeded `generate`. "gdr-decode-1" decodes CUDA's bf16 copy with bf16 rotary
# frequencies and transformers' repeat_kv attention; "gdr-decode-2" keeps the rotary frequencies fp32 and folds the
# grouped heads (the same tokens in fp32 on a CPU, other near-ties and so other queries in bf16 on CUDA);
# "gdr-decode-3" stops a causal model's query at any token that holds a line break ("\n\n", " \n", ...), not "\n" alone.
SAMPLER_VERSION = "gdr-decode-3"
PER_DOC_SAMPLER = 2  # queries per document (``sample.per_doc``): 2 = an empty generation re-drawn, not dropped

_MASK = {s: (1 << (64 - s)) - 1 for s in (27, 30, 31, 40)}
_C1 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64 constants, as signed int64
_C2 = 0x94D049BB133111EB - (1 << 64)
_GOLD = 0x9E3779B97F4A7C15 - (1 << 64)
_STEP = 0x632BE59BD9B4E019 - (1 << 64)
_TOK = 0xD6E8FEB86659FD93 - (1 << 64)


def _i64(x: int) -> int:
    """A Python int wrapped into int64's range (as int64 arithmetic would)."""
    return (x + (1 << 63)) % (1 << 64) - (1 << 63)


def _mix(h: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplications wrap; right shifts made logical by masking)."""
    h = h ^ ((h >> 30) & _MASK[30])
    h = h * _C1
    h = h ^ ((h >> 27) & _MASK[27])
    h = h * _C2
    return h ^ ((h >> 31) & _MASK[31])


def row_keys(seed: int, qid: torch.Tensor, attempt: torch.Tensor) -> torch.Tensor:
    """(B,) int64 key of each query's random stream: a hash of (seed, query index j, redraw attempt)."""
    h = _mix(torch.full_like(qid, int(seed) & ((1 << 62) - 1)) * _GOLD + qid)
    return _mix(h + attempt * _GOLD)


def gumbel_noise(keys: torch.Tensor, step: int, tokens: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise of shape ``tokens.shape`` (B, k): a pure function of (row key, step, token id).

    keys : (B,) int64 from :func:`row_keys`; tokens : (B, k) int64 token ids.
    """
    h = _mix(keys[:, None] + _i64((int(step) + 1) * _STEP))  # (B, 1)
    h = _mix(h + tokens * _TOK)  # (B, k)
    u = (((h >> 40) & _MASK[40]).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # 24 bits, in (0, 1)
    return -torch.log(-torch.log(u))


# Below this temperature the scaled logits (up to ~1e3 / T) could overflow float32 (3.4e38), and inf - inf gives
# NaN tokens: decoding is greedy there, the limit of sampling as T -> 0 (the help of sample.temperature says so).
GREEDY_BELOW = 1e-30


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float, temperature: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature, then top-k, then top-p, as transformers' warpers do, over a batch.

    logits : (B, V). Returns ``(vals, idx)`` of shape (B, k), k = top_k (or V when top_k = 0): the k
    largest scaled logits in descending order and their token ids; those top-p removes are ``-inf``.
    """
    if temperature < GREEDY_BELOW:  # the limit T -> 0 is the argmax; dividing would give inf - inf = NaN tokens
        logits, top_k = logits.float(), 1
    else:
        logits = logits.float() / temperature if temperature != 1.0 else logits.float()
    k = logits.shape[-1] if top_k <= 0 else min(top_k, logits.shape[-1])
    vals, idx = logits.topk(k, dim=-1)  # (B, k), sorted descending
    if top_p < 1.0:
        # transformers' TopPLogitsWarper: sort ascending, drop tokens whose cumulative mass <= 1 - top_p,
        # always keep the most likely one.
        asc = vals.flip(-1).softmax(-1).cumsum(-1)  # (B, k), ascending order
        drop = (asc <= 1 - top_p).flip(-1)
        drop[:, 0] = False
        vals = vals.masked_fill(drop, float("-inf"))
    return vals, idx


def sample_next(logits: torch.Tensor, keys: torch.Tensor, step: int, top_k: int, top_p: float,
                temperature: float) -> torch.Tensor:
    """(B,) next tokens: Gumbel-max over the filtered logits, with each row's own noise stream."""
    vals, idx = filter_logits(logits, top_k, top_p, temperature)
    if vals.shape[-1] == 1:  # greedy
        return idx[:, 0]
    choice = (vals + gumbel_noise(keys, step, idx)).argmax(-1, keepdim=True)  # (B, 1)
    return idx.gather(-1, choice)[:, 0]


def stop_check_every(device: torch.device) -> int:
    """Decode steps between two all-finished tests. A test reads the device (a host sync that drains the
    GPU's queue), so on CUDA it runs every 8 steps (at most 7 steps of finished rows are wasted); on the CPU
    there is no queue to drain and every step is tested."""
    return 8 if torch.device(device).type == "cuda" else 1


@dataclass
class _Batch:
    """A prefilled batch: what a decode step needs."""

    logits: torch.Tensor  # (B, V) next-token logits after the prompt
    cache: object  # transformers Cache, B rows
    mask: torch.Tensor | None  # (B, M) causal: 1 = real token (generated slots are 1 from the start)
    pos: torch.Tensor | None  # (B,) causal: position id of the first generated token
    enc: object | None = None  # seq2seq: encoder outputs, B rows
    enc_mask: torch.Tensor | None = None  # (B, 1, 1, Le): padding_mask_4d
    key: tuple = ()  # the decode cache's shape (its pool key): one compiled and captured step per key
    length: int = 0  # tokens in the self-attention cache before the first decode step (P + S, or 1 for T5)


def _lcp(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix all ``seqs`` share."""
    n = min(len(s) for s in seqs)
    head = np.array([s[:n] for s in seqs])  # (U, n)
    same = (head == head[:1]).all(0)  # (n,)
    return n if same.all() else int(same.argmin())


def _init_layers(cache, like_k: Sequence[torch.Tensor], like_v: Sequence[torch.Tensor], batch: int) -> None:
    """Allocate a StaticCache's layers for ``batch`` rows shaped like the given per-layer (·, H, ·, D) tensors."""
    for layer, k, v in zip(cache.layers, like_k, like_v):
        layer.lazy_initialization(k[:1].expand(batch, *k.shape[1:]), v[:1].expand(batch, *v.shape[1:]))


class Decoder:
    """The decode loop for one :class:`gdr.lm.GenerativeLM` (built once per model and device).

    On CUDA the model runs in bf16 (a copy of the weights made once, rotary frequencies kept fp32:
    :func:`gdr.lm.precision.cast_copy`; the scoring model is left as it is).
    ``compile`` (default: on CUDA; :meth:`set_compile` per call) compiles the decode step; ``bucket`` pads the
    rows of a batch to a power of two (:func:`gdr.lm.compiling.batch_bucket`) and rounds cache lengths up,
    so that batches of any size share a few decode caches and compiled/captured steps (default: when
    compiling).
    """

    def __init__(self, lm, compile: bool | None = None, bucket: bool | None = None, dtype: torch.dtype | None = None):
        self.lm = lm
        self.device = lm.device
        self.model = lm.model
        # bf16 on CUDA; ``dtype`` makes that copy on a CPU too (tests run the CUDA configuration there)
        self.dtype = dtype or decode_dtype(self.device, next(lm.model.parameters()).dtype)
        if self.dtype != next(lm.model.parameters()).dtype:
            self.model = cast_copy(lm.model, self.dtype)  # rotary frequencies stay fp32
        use_gdr_attention(self.model)  # grouped-query attention without key/value copies
        self._bucket_setting = bucket
        self._step_fn = None
        self._graphs: set[tuple] = set()  # cache shapes (_Batch.key) whose compiled step has run
        self._eager_shapes: set[tuple] = set()  # shapes whose compile or capture failed: eager from then on
        self._new_graphs = True  # False while decoding re-draws: no new graph is compiled for them
        self.set_compile(self.device.type == "cuda" if compile is None else compile)
        self.compile_options = dict(mode="reduce-overhead")  # tests trace with dict(backend="eager") on a CPU
        self._pool: dict[tuple, object] = {}  # decode caches by shape, reused across batches
        self._longest: int | None = None  # prompt tokens of a full-length document (_longest_prompt)
        # Work done, for benchmarks (FLOP accounting): tokens through the prompt side (a shared prefix and a
        # repeated prompt count once), tokens fed to decode steps (every row, finished or not), the sum of
        # their attention contexts, and tokens generated (up to and including the stop token).
        self.stats = dict(prefill_tokens=0, prefill_context=0, decode_tokens=0, decode_context=0, new_tokens=0)
        self.stop = torch.tensor(lm._stop_ids(), device=self.device)
        self.cache_kw = cache_kwarg(self.model)  # `cache` or `past_key_values`, by transformers version
        self.check_every = stop_check_every(self.device)  # decode steps between all-finished tests

    def set_compile(self, on: bool) -> None:
        """Compile the decode step from now on (or not); bucketing follows unless set explicitly. Starts a new
        :meth:`compile_record` (each sampling run calls this first)."""
        self.compile = bool(on)
        # row buckets and cache lengths rounded up to 64 (what the CUDA graphs need; tested eagerly on the CPU)
        self.bucket = self.compile if self._bucket_setting is None else self._bucket_setting
        self._record = dict(graphs=set(), eager_fallback=set(), eager_redraws=0)

    def numerics(self) -> dict:
        """What decides the bytes of this loop's queries beyond the settings (:mod:`gdr.lm.numerics`): the
        device kind, the dtype it decodes in and the decode path of the last :meth:`set_compile`."""
        return decode_numerics(self.device, self.dtype, self.compile)

    @property
    def _step_ok(self) -> bool:
        """A compiled step has run (tests: no silent eager fallback)."""
        return bool(self._graphs)

    def compile_record(self) -> dict:
        """What the decode since the last :meth:`set_compile` compiled, for the sampling manifests (eager and
        inductor bf16 kernels can break near-ties differently): ``compiled`` (the decision), ``backend`` and
        ``mode``, ``graphs`` ([rows, cache length] of each compiled shape used), ``eager_fallback`` (shapes
        whose compile or capture failed and that decoded eagerly) and ``eager_redraws`` (re-draw batches
        decoded eagerly because no graph of their shape existed)."""
        opts = self.compile_options
        backend = opts.get("backend", "inductor")
        shapes = lambda keys: sorted([int(k[1]), int(k[-1])] for k in keys)  # noqa: E731
        return {"compiled": self.compile, "backend": getattr(backend, "__name__", str(backend)),
                "mode": opts.get("mode") if self.compile else None, "graphs": shapes(self._record["graphs"]),
                "eager_fallback": shapes(self._record["eager_fallback"]),
                "eager_redraws": self._record["eager_redraws"]}

    # ------------------------------------------------------------------ caches
    def _bucket(self, n: int, floor: int = 0) -> int:
        """Cache lengths rounded up when bucketing so that compiled/captured decode steps are reused across
        batches: to a multiple of 64 of at least ``floor``."""
        return -(-max(n, floor) // 64) * 64 if self.bucket else n

    def _longest_prompt(self) -> int:
        """The cache length every batch is bucketed to (whatever its longest document), so that the batches of a
        run share one compiled length: :meth:`gdr.lm.GenerativeLM.longest_prompt_tokens`, computed once."""
        if self._longest is None:
            self._longest = self.lm.longest_prompt_tokens()
        return self._longest

    def _decode_cache(self, key: tuple, make):
        """The decode cache of one shape: allocated once and reused by later batches of the same shape, so
        its tensors keep their addresses (what a captured CUDA graph reads and writes). A re-draw of a shape
        without a graph gets a cache of its own, so that it never pushes a captured shape's cache out."""
        cache = self._pool.get(key)
        if cache is None and self.compile and not self._new_graphs and key not in self._graphs:
            return make()
        if cache is None:
            # a few shapes (the full batch and the buckets of smaller ones), at most twice the largest
            # batch's rows in all
            rows = sum(k[1] for k in self._pool) + key[1]
            if rows > 2 * max([key[1], *(k[1] for k in self._pool)]):
                self._pool.clear()
            cache = self._pool[key] = make()
        return cache

    # ------------------------------------------------------------------ prefill
    def _prefill_causal(self, prompts: Sequence[Sequence[int]], rows: torch.Tensor, max_new: int) -> _Batch:
        model, dev, U, B = self.model, self.device, len(prompts), int(rows.numel())
        # The prefix every prompt shares runs once; each prompt keeps >= 1 own token (its last logits).
        P = min(_lcp(prompts), min(len(p) for p in prompts) - 1) if U > 1 else len(prompts[0]) - 1
        S = max(len(p) for p in prompts) - P
        # slots past P + S + max_new stay masked and unused
        M = self._bucket(P + S + max_new, self._longest_prompt() + max_new)
        suffix = torch.full((U, S), self.lm.pad_id, dtype=torch.long)
        smask = torch.zeros((U, S), dtype=torch.long)
        for r, p in enumerate(prompts):  # building the padded batch; the compute is batched
            suffix[r, S - len(p) + P:] = torch.tensor(p[P:])
            smask[r, S - len(p) + P:] = 1
        suffix, smask = suffix.to(dev), smask.to(dev)
        mask = torch.cat([torch.ones((U, P), dtype=torch.long, device=dev), smask,
                          torch.ones((U, max_new), dtype=torch.long, device=dev),
                          torch.zeros((U, M - P - S - max_new), dtype=torch.long, device=dev)], 1)  # (U, M)
        pos = (P + smask.cumsum(-1) - 1).clamp_min(0)  # (U, S) position ids over real tokens
        # prefill: the shared prefix once (1 row), then every distinct prompt's own tokens (U rows)
        cache_u = StaticCache(config=model.config, max_cache_len=P + S)
        if P > 0:
            c1 = StaticCache(config=model.config, max_cache_len=P)
            model(input_ids=torch.tensor([prompts[0][:P]], device=dev), **{self.cache_kw: c1}, use_cache=True,
                  logits_to_keep=1)
            _init_layers(cache_u, [l.keys for l in c1.layers], [l.values for l in c1.layers], U)
            for lu, l1 in zip(cache_u.layers, c1.layers):
                lu.keys[:, :, :P] = l1.keys
                lu.values[:, :, :P] = l1.values
                lu.cumulative_length.fill_(P)
        out = model(input_ids=suffix, attention_mask=mask[:, :P + S], position_ids=pos,
                    **{self.cache_kw: cache_u}, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1].float()  # (U, V)
        first_pos = pos[:, -1] + 1  # (U,)
        self.stats["prefill_tokens"] += P + sum(len(p) - P for p in prompts)
        self.stats["prefill_context"] += P * P // 2 + sum((len(p) - P) * (P + S) for p in prompts)
        # Copy each prompt's rows of the cache to the queries that use it.
        cache = self._decode_cache(("causal", B, M), lambda: StaticCache(config=model.config, max_cache_len=M))
        if not cache.layers[0].is_initialized:
            _init_layers(cache, [l.keys for l in cache_u.layers], [l.values for l in cache_u.layers], B)
        for lb, lu in zip(cache.layers, cache_u.layers):
            lb.keys[:, :, :P + S] = lu.keys.index_select(0, rows)
            lb.values[:, :, :P + S] = lu.values.index_select(0, rows)
            lb.cumulative_length.fill_(P + S)
        return _Batch(logits[rows], cache, mask[rows], first_pos[rows], key=("causal", B, M), length=P + S)

    def _prefill_seq2seq(self, prompts: Sequence[Sequence[int]], rows: torch.Tensor, max_new: int) -> _Batch:
        model, dev, U, B = self.model, self.device, len(prompts), int(rows.numel())
        batch = self.lm._pad(prompts, left=False)
        ids, enc_mask = batch["input_ids"].to(dev), batch["attention_mask"].to(dev)
        hidden = model.get_encoder()(input_ids=ids, attention_mask=enc_mask).last_hidden_state  # (U, Le, d)
        Le = hidden.shape[1]
        start = torch.full((U, 1), model.config.decoder_start_token_id, dtype=torch.long, device=dev)

        def new_cache(le):
            return EncoderDecoderCache(StaticCache(config=model.config, max_cache_len=max_new + 1),
                                       StaticCache(config=model.config, max_cache_len=le))

        # prefill: the encoder and the first decoder step (which computes the cross-attention keys) per document
        cache_u = new_cache(Le)
        out = model(encoder_outputs=BaseModelOutput(last_hidden_state=hidden), attention_mask=enc_mask,
                    decoder_input_ids=start, **{self.cache_kw: cache_u}, use_cache=True)
        logits = out.logits[:, -1].float()  # (U, V)
        self.stats["prefill_tokens"] += sum(len(p) for p in prompts) + U  # encoder tokens + start tokens
        self.stats["prefill_context"] += sum(len(p) * Le for p in prompts) + U * Le
        Lb = self._bucket(Le, self._longest_prompt())  # encoder slots past Le stay masked
        cache = self._decode_cache(("seq2seq", B, max_new, Lb), lambda: new_cache(Lb))
        for big, small in ((cache.self_attention_cache, cache_u.self_attention_cache),
                           (cache.cross_attention_cache, cache_u.cross_attention_cache)):
            if not big.layers[0].is_initialized:
                _init_layers(big, [l.keys for l in small.layers], [l.values for l in small.layers], B)
            for lb, lu in zip(big.layers, small.layers):
                n = lu.keys.shape[2]
                lb.keys[:, :, :n] = lu.keys.index_select(0, rows)
                lb.values[:, :, :n] = lu.values.index_select(0, rows)
                lb.cumulative_length.copy_(lu.cumulative_length)
        for i in range(len(cache.cross_attention_cache.layers)):
            cache.is_updated[i] = True
        enc_b = torch.zeros((B, Lb, hidden.shape[2]), dtype=hidden.dtype, device=dev)
        enc_b[:, :Le] = hidden[rows]
        mask_b = torch.zeros((B, Lb), dtype=enc_mask.dtype, device=dev)
        mask_b[:, :Le] = enc_mask[rows]
        # 4D, as transformers would build it: a 2D mask it reads on the host (a sync) at every decode step
        mask_b = padding_mask_4d(mask_b, self.model, hidden.dtype)
        return _Batch(logits[rows], cache, None, None, BaseModelOutput(last_hidden_state=enc_b), mask_b,
                      key=("seq2seq", B, max_new, Lb), length=1)

    # ------------------------------------------------------------------ one step
    def _step(self, tok: torch.Tensor, pos: torch.Tensor, b: _Batch) -> torch.Tensor:
        """Logits (B, V) after feeding ``tok`` (B,) at position ``pos`` (B,)."""
        if self.lm.is_seq2seq:
            out = self.model(encoder_outputs=b.enc, attention_mask=b.enc_mask, decoder_input_ids=tok[:, None],
                             **{self.cache_kw: b.cache}, use_cache=True)
        else:
            out = self.model(input_ids=tok[:, None], attention_mask=b.mask, position_ids=pos[:, None],
                             **{self.cache_kw: b.cache}, use_cache=True)
        return out.logits[:, -1].float()

    def _run_step(self, tok: torch.Tensor, pos: torch.Tensor, b: _Batch, t: int) -> torch.Tensor:
        """Decode step ``t``: compiled (captured as CUDA graphs on a GPU) when ``compile``, else eager.

        Each cache shape is compiled, warmed up and captured by its own first calls. If any of that fails (an
        old torch, an unsupported model, a backend error), the cache is put back as it was before the step,
        the step is redone eagerly and that shape decodes eagerly from then on, with one log line; other
        shapes stay compiled. While re-drawing (``_new_graphs`` off) a shape without a graph runs eagerly
        rather than compiling one."""
        key = b.key
        if self.compile and key not in self._eager_shapes and (self._new_graphs or key in self._graphs):
            if self._step_fn is None:
                compile_cache_dir()  # compiled kernels persist across processes
                allow_bucket_recompiles()
                self._step_fn = torch.compile(self._step, dynamic=False, **self.compile_options)
            try:
                logits = self._step_fn(tok, pos, b).clone()  # graph outputs are overwritten by the next replay
            except Exception as e:  # noqa: BLE001 - fall back to the eager step, which is correct too
                log.warning("compiled decode step failed for %d rows x %d cache slots (%s: %s); that shape decodes "
                            "eagerly", key[1], key[-1], type(e).__name__, " ".join(str(e).split())[:300])
                self._eager_shapes.add(key)
                # the step writes its keys and values at the cache's length, then counts them: put the count
                # back (the eager step rewrites the same slots)
                layers = b.cache.self_attention_cache.layers if self.lm.is_seq2seq else b.cache.layers
                for layer in layers:
                    layer.cumulative_length.fill_(b.length + t)
            else:
                self._graphs.add(key)
                self._record["graphs"].add(key)
                return logits
        if key in self._eager_shapes and self.compile:
            self._record["eager_fallback"].add(key)
        return self._step(tok, pos, b)

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def decode(self, prompts: Sequence[Sequence[int]], rows: torch.Tensor, qid: torch.Tensor, attempt: torch.Tensor,
               seed: int, max_new_tokens: int = SamplingOptions.max_new_tokens, top_k: int = SamplingOptions.top_k,
               top_p: float = SamplingOptions.top_p, temperature: float = SamplingOptions.temperature,
               max_rows: int | None = None, new_graphs: bool = True,
               on_step: Callable[[int], None] | None = None) -> torch.Tensor:
        """Sample one continuation per query.

        prompts : U distinct prompts (token ids). rows : (B,) int64, the prompt of each query.
        qid : (B,) int64, each query's index j in its run (its random stream). attempt : (B,) redraw count.
        max_rows : the caller's batch size, the largest row bucket (when bucketing).
        new_graphs : False for re-draws: compile no new graph (a shape without one decodes eagerly; on a cold
            GPU each new shape costs 20-60 s of compilation and capture).
        on_step : called with the tokens decoded so far after each step (a progress bar; it reads nothing from the
            device, so it adds no host sync).
        Returns (B, max_new_tokens) int64 token ids; after a row's stop token (kept) come pad ids.
        """
        dev = self.device
        n_real = int(rows.numel())
        if self.bucket:  # pad with copies of row 0 (same prompt and stream: they stop with it), dropped below
            extra = batch_bucket(n_real, max_rows) - n_real
            rows, qid, attempt = (torch.cat([t, t[:1].expand(extra)]) for t in (rows, qid, attempt))
        rows, qid, attempt = rows.to(dev), qid.to(dev), attempt.to(dev)
        prefill = self._prefill_seq2seq if self.lm.is_seq2seq else self._prefill_causal
        self._new_graphs = new_graphs  # read by _decode_cache and _run_step; every call sets it
        b = prefill(prompts, rows, max_new_tokens)
        if self.compile and not new_graphs and b.key not in self._graphs:
            self._record["eager_redraws"] += 1
        keys = row_keys(seed, qid, attempt)
        B = rows.numel()
        out = torch.full((B, max_new_tokens), self.lm.pad_id, dtype=torch.long, device=dev)
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        pad = torch.tensor(self.lm.pad_id, device=dev)
        pos = b.pos if b.pos is not None else torch.zeros(B, dtype=torch.long, device=dev)
        logits = b.logits
        alive = torch.zeros((), dtype=torch.long, device=dev)
        # attention context of one decode token: the whole static cache (+ the encoder states for T5)
        ctx = max_new_tokens + 1 + b.enc_mask.shape[-1] if self.lm.is_seq2seq else b.mask.shape[1]
        check_every = self.check_every  # the all-finished test reads the device: every 8 steps on CUDA
        for t in range(max_new_tokens):
            tok = torch.where(done, pad, sample_next(logits, keys, t, top_k, top_p, temperature))
            out[:, t] = tok
            alive += (~done[:n_real]).sum()
            done |= torch.isin(tok, self.stop)
            if on_step is not None:
                on_step(t + 1)
            if t == max_new_tokens - 1 or ((t + 1) % check_every == 0 and bool(done.all())):
                break
            logits = self._run_step(tok, pos + t, b, t)
            self.stats["decode_tokens"] += B
            self.stats["decode_context"] += B * ctx
        self.stats["new_tokens"] += int(alive)
        return out[:n_real]
