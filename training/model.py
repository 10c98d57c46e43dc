"""NCI-style seq2seq retriever: a text encoder and a small docid decoder.

Architecture (Wang et al. 2022, NCI; Du et al. 2024, BMI):

- **Encoder**: a pretrained T5 encoder (``t5-small``, ``t5-base``, a local path) or any HF encoder
  checkpoint (``AutoModel``; ``minilm-l6`` is bundled and works offline), or a random-init T5
  encoder built from ``encoder_config`` (tests). Its hidden states are projected to the decoder
  width when the sizes differ.
- **Decoder**: a T5 decoder stack (causal self-attention, cross-attention, relative position bias)
  trained from scratch over a *position-aware* docid vocabulary: digit ``d`` at position ``p`` is
  token ``2 + p*K + d``; token 0 is pad and decoder start, token 1 ends a docid (EOS). The output
  layer is tied to the decoder's input embeddings (scaled by ``d_model**-0.5`` as in T5).
- **Per-position output mask**: at step ``t`` only the ``K`` digit tokens of position ``t`` and EOS
  are possible, so the output layer is evaluated on those ``K + 1`` *slots* only: the logits have
  shape (batch, steps, K + 1) and slot ``s < K`` is digit ``s`` at that step, slot ``K`` is EOS.
  At step ``L`` (after the longest code) only EOS is possible.

Options, off by default:

- **PAWA** (NCI's prefix-aware weight-adaptive decoder): the output weights depend on the decoded
  prefix, so the same digit at the same position can mean different clusters under different
  parents. Implemented simply: a GRU reads the prefix tokens (decoder inputs) and emits a
  low-rank correction of the slot weights, ``W_t = E[slot tokens of t] + A(prefix_t) B``
  with ``A(prefix_t)`` of shape (K + 1, r) and ``B`` of shape (r, d_model). ``A``'s output layer
  starts at zero, so a PAWA model starts as the plain tied decoder.
- **Consistency regulariser** (NCI): two forward passes of a batch with different dropout masks;
  the loss adds ``w * (KL(p1 || p2) + KL(p2 || p1)) / 2`` over target positions (see
  ``gdr.training.module``).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, T5Config, T5EncoderModel
from transformers.models.t5.modeling_t5 import T5Stack

from gdr.cost import Dims, dims
from gdr.io import atomic_write_text
from gdr.lm.hostsync import padding_mask_4d
from gdr.logs import quiet_loading
from gdr.models import resolve_model

log = logging.getLogger(__name__)


def _t5_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dropout: float,
                  training: bool) -> torch.Tensor:
    """T5's attention as its eager path computes it (no scaling, additive bias, softmax in fp32): q (..., T, dk),
    k/v (..., S, dk), bias broadcast to (..., T, S) -> (..., T, dk). Written out rather than SDPA: a beam step
    attends over a handful of positions (S <= depth + 1 in self-attention, the query's tokens in cross-attention)
    for up to 100k rows (batch x beam), where cuDNN's fused SDPA fails to execute on an H200 (`mha_graph.execute`,
    batch 1,024 x beam 100) and gains nothing at these sizes."""
    s = torch.matmul(q, k.transpose(-1, -2)) + bias  # (..., T, S)
    p = F.dropout(s.float().softmax(-1).type_as(s), p=dropout, training=training)
    return torch.matmul(p, v)

__all__ = ["RetrieverConfig", "GenerativeRetriever", "DecoderState", "encoder_dims", "decoder_dims", "meta_retriever",
           "meta_param_count", "load_tokenizer", "PAD", "EOS"]

PAD = 0  # also the decoder start token (T5 convention)
EOS = 1  # end of docid
N_SPECIAL = 2


@dataclass
class RetrieverConfig:
    """Everything needed to rebuild a retriever (saved as ``retriever.json`` with each model).

    encoder : hub id, local path or bundled short name (``minilm-l6``) of a pretrained encoder;
        None builds a random-init T5 encoder from ``encoder_config``.
    encoder_config : T5Config keyword arguments for the random-init encoder (``vocab_size`` is
        taken from the tokenizer).
    tokenizer : tokenizer to use; default the encoder's.
    n_digits, max_code_len : K and L of the docids (the decoder vocabulary is 2 + L*K tokens).
    d_model, num_layers, num_heads, d_ff, d_kv : decoder size (d_kv default d_model // num_heads).
    dropout : dropout rate in the decoder (and a random-init encoder).
    pawa, pawa_rank : prefix-aware weight-adaptive output layer and its rank.
    max_query_len : queries are truncated to this many encoder tokens.
    encoder_layers : keep only the first this many layers of a pretrained encoder (None = all): a
        cheaper encoder for CPU runs that keeps the pretrained embeddings and lower layers.
    """

    encoder: str | None = None
    encoder_config: dict[str, Any] | None = None
    encoder_layers: int | None = None
    tokenizer: str | None = None
    n_digits: int = 30
    max_code_len: int = 4
    d_model: int = 256
    num_layers: int = 3
    num_heads: int = 4
    d_ff: int = 1024
    d_kv: int | None = None
    dropout: float = 0.1
    pawa: bool = False
    pawa_rank: int = 16
    max_query_len: int = 64
    # filled in by `build`: the encoder's HF config, so a saved model rebuilds without the hub
    encoder_hf_config: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RetrieverConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown retriever config keys {unknown}; known: {sorted(names)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def vocab_size(self) -> int:
        return N_SPECIAL + self.max_code_len * self.n_digits

    @property
    def tokenizer_name(self) -> str:
        name = self.tokenizer or self.encoder
        if name is None:
            raise ValueError("a random-init encoder needs `tokenizer` (e.g. tokenizer=minilm-l6)")
        return name


def load_tokenizer(name: str):
    return AutoTokenizer.from_pretrained(resolve_model(name))


_T5_TYPES = {"t5", "mt5", "umt5", "longt5"}


def _without_pooler(fn, arg):
    """BERT-like models carry a pooler we never use (DDP complains about unused weights): drop it."""
    try:
        return fn(arg, add_pooling_layer=False)
    except TypeError:
        return fn(arg)


def _build_encoder(cfg: RetrieverConfig, vocab_size: int) -> tuple[nn.Module, dict[str, Any]]:
    """The encoder module and its HF config as a dict (saved so loading needs no hub access)."""
    if cfg.encoder_hf_config is not None:  # rebuilding a saved model: architecture only
        hf = dict(cfg.encoder_hf_config)
        model_type = hf.pop("model_type")
        conf = AutoConfig.for_model(model_type, **hf)
        if model_type in _T5_TYPES:
            enc = T5EncoderModel(conf)
        else:
            enc = _without_pooler(AutoModel.from_config, conf)
    elif cfg.encoder is None:
        kw = dict(cfg.encoder_config or {})
        kw.setdefault("dropout_rate", cfg.dropout)
        kw["vocab_size"] = vocab_size
        conf = T5Config(**kw)
        enc = T5EncoderModel(conf)
    else:
        path = resolve_model(cfg.encoder)
        conf = AutoConfig.from_pretrained(path)
        t5 = conf.model_type in _T5_TYPES
        # the first `encoder_layers` layers only: the config override makes from_pretrained skip the rest
        cut = {} if cfg.encoder_layers is None else {("num_layers" if t5 else "num_hidden_layers"): cfg.encoder_layers}
        # float32 master weights whatever dtype the checkpoint was saved in; autocast does bf16
        with quiet_loading():
            if t5:
                enc = T5EncoderModel.from_pretrained(path, dtype=torch.float32, **cut)
            else:
                enc = _without_pooler(lambda p, **kw: AutoModel.from_pretrained(p, dtype=torch.float32, **cut, **kw),
                                      path)
    hf = enc.config.to_dict()
    drop = {"architectures", "transformers_version", "dtype", "torch_dtype"}
    hf = {k: v for k, v in hf.items() if not k.startswith("_") and k not in drop}
    hf["model_type"] = enc.config.model_type
    return enc, hf


def _hidden_size(conf) -> int:
    for name in ("d_model", "hidden_size", "dim"):
        if getattr(conf, name, None):
            return int(getattr(conf, name))
    raise ValueError(f"cannot tell the hidden size of encoder config {type(conf).__name__}")


def _encoder_hf_config(cfg: RetrieverConfig) -> dict[str, Any]:
    """The encoder's HF config as a dict (with ``model_type``, layers cut to ``encoder_layers``) from ``cfg``
    alone: its saved HF config, its random-init T5 settings, or the pretrained checkpoint's config.json."""
    if cfg.encoder_hf_config is not None:
        hf = dict(cfg.encoder_hf_config)
    elif cfg.encoder is None:
        hf = T5Config(**(cfg.encoder_config or {})).to_dict()
    else:
        hf = AutoConfig.from_pretrained(resolve_model(cfg.encoder)).to_dict()
    if cfg.encoder_layers is not None:
        key = "num_layers" if hf.get("model_type") in _T5_TYPES else "num_hidden_layers"
        hf[key] = min(int(hf[key]), int(cfg.encoder_layers))
    return hf


def encoder_dims(cfg: RetrieverConfig) -> Dims:
    """The encoder's dimensions (:func:`gdr.cost.dims`) from ``cfg`` alone: no weights are loaded."""
    return dims(_encoder_hf_config(cfg))


def decoder_dims(cfg: RetrieverConfig) -> Dims:
    """The docid decoder's dimensions (:func:`gdr.cost.dims` of its settings)."""
    return dims(cfg)


def meta_retriever(cfg: RetrieverConfig) -> "GenerativeRetriever":
    """The retriever ``cfg`` builds, on the meta device: its shapes without memory or weights (a random-init
    encoder takes its T5 settings' vocabulary). Its ``config.encoder_hf_config`` is filled in."""
    hf = {k: v for k, v in _encoder_hf_config(cfg).items()
          if not k.startswith("_") and k not in ("architectures", "transformers_version", "dtype", "torch_dtype")}
    meta_cfg = replace(cfg, encoder_hf_config=hf)
    with torch.device("meta"):
        encoder, _ = _build_encoder(meta_cfg, 0)
        return GenerativeRetriever(meta_cfg, encoder)


def meta_param_count(cfg: RetrieverConfig) -> int:
    """Parameters of the retriever ``cfg`` builds, counted on the meta device (:func:`meta_retriever`)."""
    return sum(p.numel() for p in meta_retriever(cfg).parameters())


@dataclass
class DecoderState:
    """Incremental decoding state of ``N = B * w`` hypotheses, ``w`` per query, each query's contiguous
    (hypothesis ``i`` belongs to query ``i // w``).

    cross_k, cross_v : per decoder layer, the cross-attention keys and values of shape (B, H, S, d_kv),
        computed once per query by :meth:`GenerativeRetriever.start` and never copied per hypothesis: the
        hypotheses of a query attend to them as the query positions of one cross-attention call
    enc_mask : bool tensor of shape (B, S), True at the query's tokens
    self_k, self_v : per decoder layer, the self-attention keys and values of shape (N, H, t, d_kv)
    pawa : GRU hidden state of shape (1, N, d_model) or None
    step : number of tokens consumed so far (t)
    """

    cross_k: list[torch.Tensor]
    cross_v: list[torch.Tensor]
    enc_mask: torch.Tensor
    self_k: list[torch.Tensor]
    self_v: list[torch.Tensor]
    pawa: torch.Tensor | None
    step: int = 0

    def cross_kv_bytes(self) -> int:
        """Bytes held by the cross-attention keys and values (all layers)."""
        return sum(x.numel() * x.element_size() for x in (*self.cross_k, *self.cross_v))


class GenerativeRetriever(nn.Module):
    """Query -> docid sequence model. Build with :meth:`build` (loads a pretrained encoder)."""

    def __init__(self, config: RetrieverConfig, encoder: nn.Module):
        super().__init__()

        self.config = config
        self.encoder = encoder
        enc_dim = _hidden_size(encoder.config)
        d = config.d_model
        self.proj = nn.Identity() if enc_dim == d else nn.Linear(enc_dim, d, bias=False)
        dec_conf = T5Config(
            vocab_size=config.vocab_size, d_model=d, d_kv=config.d_kv or d // config.num_heads,
            d_ff=config.d_ff, num_layers=config.num_layers, num_decoder_layers=config.num_layers,
            num_heads=config.num_heads, dropout_rate=config.dropout, is_decoder=True,
            is_encoder_decoder=True, use_cache=True, pad_token_id=PAD, eos_token_id=EOS,
            decoder_start_token_id=PAD, relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
        )
        self.decoder = T5Stack(dec_conf)
        nn.init.normal_(self.decoder.embed_tokens.weight, std=1.0)  # T5's init of tied embeddings
        K, L = config.n_digits, config.max_code_len
        # slot_tokens[t, s]: token id of slot s at step t; at step L only EOS is valid
        slot_tokens = torch.full((L + 1, K + 1), PAD, dtype=torch.long)
        slot_tokens[:L, :K] = N_SPECIAL + torch.arange(L)[:, None] * K + torch.arange(K)[None, :]
        slot_tokens[:, K] = EOS
        slot_valid = torch.ones(L + 1, K + 1, dtype=torch.bool)
        slot_valid[L, :K] = False
        self.register_buffer("slot_tokens", slot_tokens, persistent=False)
        self.register_buffer("slot_valid", slot_valid, persistent=False)
        if config.pawa:
            r = config.pawa_rank
            self.pawa_rnn = nn.GRU(d, d, batch_first=True)
            self.pawa_a = nn.Linear(d, (K + 1) * r)
            self.pawa_b = nn.Linear(d, r, bias=False)
            nn.init.zeros_(self.pawa_a.weight)
            nn.init.zeros_(self.pawa_a.bias)

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, config: RetrieverConfig, vocab_size: int | None = None) -> "GenerativeRetriever":
        """Build a model; a pretrained encoder is loaded from ``config.encoder``.

        vocab_size : the tokenizer's size, needed only for a random-init encoder.
        """
        if config.encoder is None and config.encoder_hf_config is None and vocab_size is None:
            vocab_size = len(load_tokenizer(config.tokenizer_name))
        encoder, hf = _build_encoder(config, vocab_size or 0)
        config.encoder_hf_config = hf
        # from_pretrained returns modules in eval mode; Lightning keeps modes as found, so a
        # pretrained encoder would train without dropout
        return cls(config, encoder).train()

    def n_params(self) -> dict[str, int]:
        enc = sum(p.numel() for p in self.encoder.parameters())
        total = sum(p.numel() for p in self.parameters())
        return {"encoder": enc, "decoder": total - enc, "total": total}

    def save(self, out_dir: str | os.PathLike) -> None:
        """Write ``retriever.json`` and ``model.pt`` (the full state dict)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "retriever.json", json.dumps(self.config.to_dict(), indent=2, default=str) + "\n")
        tmp = out / ".model.pt.tmp"
        torch.save(self.state_dict(), tmp)
        os.replace(tmp, out / "model.pt")

    @classmethod
    def load(cls, model_dir: str | os.PathLike, map_location: str | torch.device = "cpu") -> "GenerativeRetriever":
        d = Path(model_dir)
        if not (d / "retriever.json").exists():
            raise FileNotFoundError(f"{d}: no retriever.json; point at the `model/` folder of a `gdr train` run")
        if not (d / "model.pt").exists():
            raise FileNotFoundError(f"{d}: no model.pt, the retriever's weights (`gdr prune` drops them from a run's "
                                    "evaluated retrievers); train it again")
        config = RetrieverConfig.from_dict(json.loads((d / "retriever.json").read_text()))
        model = cls.build(config)
        state = torch.load(d / "model.pt", map_location=map_location, weights_only=True)
        model.load_state_dict(state)
        return model

    # ------------------------------------------------------------------ forward (training)
    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Encoder states projected to the decoder width: (B, S) -> (B, S, d_model)."""
        # 4D: transformers reads a 2D mask on the host (a sync) in every encoder pass
        mask = padding_mask_4d(attention_mask, self.encoder, self.encoder.get_input_embeddings().weight.dtype)
        out = self.encoder(input_ids=input_ids, attention_mask=mask)
        return self.proj(out.last_hidden_state)

    def labels_to_inputs(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher-forcing decoder inputs from slot labels (B, T) (-100 = padding) -> token ids (B, T)."""
        B, T = labels.shape
        prev = labels[:, :-1]
        steps = torch.arange(T - 1, device=labels.device).expand(B, T - 1)
        tok = self.slot_tokens[steps, prev.clamp_min(0)]
        tok = tok.masked_fill(prev < 0, PAD)
        start = torch.full((B, 1), PAD, dtype=torch.long, device=labels.device)
        return torch.cat([start, tok], dim=1)

    def slot_logits(self, h: torch.Tensor, steps: torch.Tensor, pawa_h: torch.Tensor | None) -> torch.Tensor:
        """Logits over the K + 1 slots.

        h : decoder outputs of shape (..., T, d_model); steps : int tensor of shape (T,), the decoding
        step of each position; pawa_h : PAWA prefix states shaped like h, or None. Returns (..., T, K + 1).
        """
        W = self.decoder.embed_tokens(self.slot_tokens[steps])  # (T, K+1, d): shared by the whole batch
        h = h * (self.config.d_model ** -0.5)
        logits = torch.einsum("...td,tkd->...tk", h, W)
        if self.config.pawa:
            K1, r = self.config.n_digits + 1, self.config.pawa_rank
            A = self.pawa_a(pawa_h).unflatten(-1, (K1, r))  # (..., T, K+1, r)
            logits = logits + torch.einsum("...kr,...r->...k", A, self.pawa_b(h))
        return logits.masked_fill(~self.slot_valid[steps], float("-inf"))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Slot logits of shape (B, T, K + 1) for queries (B, S) and slot labels (B, T)."""
        enc = self.encode(input_ids, attention_mask)
        dec_in = self.labels_to_inputs(labels)  # (B, T)
        out = self.decoder(input_ids=dec_in, encoder_hidden_states=enc, use_cache=False,
                           encoder_attention_mask=padding_mask_4d(attention_mask, self.decoder, enc.dtype))
        h = out.last_hidden_state  # (B, T, d)
        pawa_h = None
        if self.config.pawa:
            pawa_h, _ = self.pawa_rnn(self.decoder.embed_tokens(dec_in))  # (B, T, d)
        return self.slot_logits(h, torch.arange(labels.shape[1], device=labels.device), pawa_h)

    # ------------------------------------------------------------------ incremental decoding
    # The decoder stack's own modules (layer norms, projections, feed-forward, relative position bias) in the
    # order T5Stack calls them, with attention written out: T5Stack would need the encoder states and their
    # cross-attention keys/values copied to every hypothesis (a beam of 100 holds 100 copies per query). T5's
    # float16 overflow clamp is left out: decoding runs in fp32 or under bf16 autocast.
    def start(self, enc: torch.Tensor, enc_mask: torch.Tensor) -> DecoderState:
        """The state before the first step: one hypothesis per query. enc (B, S, d_model), enc_mask (B, S)."""
        B, S, _ = enc.shape
        H, dk = self.decoder.config.num_heads, self.decoder.config.d_kv
        ks, vs = [], []
        for block in self.decoder.block:
            attn = block.layer[1].EncDecAttention
            ks.append(attn.k(enc).view(B, S, H, dk).transpose(1, 2))  # (B, H, S, dk)
            vs.append(attn.v(enc).view(B, S, H, dk).transpose(1, 2))
        empty = enc.new_zeros(B, H, 0, dk, dtype=ks[0].dtype)
        L = len(self.decoder.block)
        pawa = enc.new_zeros(1, B, self.config.d_model) if self.config.pawa else None
        return DecoderState(ks, vs, enc_mask.bool(), [empty] * L, [empty] * L, pawa, 0)

    def _self_bias(self, t: int, device: torch.device) -> torch.Tensor:
        """Relative position bias of query position ``t`` over keys 0..t: (1, H, 1, t + 1) (T5's compute_bias)."""
        attn = self.decoder.block[0].layer[0].SelfAttention
        rel = torch.arange(t + 1, device=device) - t  # memory position - query position
        bucket = attn._relative_position_bucket(rel, bidirectional=False,
                                                num_buckets=attn.relative_attention_num_buckets,
                                                max_distance=attn.relative_attention_max_distance)
        return attn.relative_attention_bias(bucket).t().contiguous()[None, :, None, :]

    def step(self, state: DecoderState, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per hypothesis (N,); returns slot log-probs (N, K + 1) for the next symbol."""
        t = state.step
        dec = self.decoder
        N, B = tokens.shape[0], state.enc_mask.shape[0]
        w = N // B  # hypotheses per query
        H, dk = dec.config.num_heads, dec.config.d_kv
        ids = tokens[:, None]  # (N, 1)
        x = dec.dropout(dec.embed_tokens(ids))  # (N, 1, d)
        self_bias = self._self_bias(t, x.device)  # (1, H, 1, t+1)
        enc_bias = None
        for i, block in enumerate(dec.block):
            sa, ca, ff = block.layer[0], block.layer[1], block.layer[-1]
            h = sa.layer_norm(x)
            q, k, v = (lin(h).view(N, 1, H, dk).transpose(1, 2) for lin in (sa.SelfAttention.q, sa.SelfAttention.k,
                                                                            sa.SelfAttention.v))  # (N, H, 1, dk)
            state.self_k[i] = torch.cat([state.self_k[i], k], 2)  # (N, H, t+1, dk)
            state.self_v[i] = torch.cat([state.self_v[i], v], 2)
            drop = sa.SelfAttention.dropout if self.training else 0.0
            a = _t5_attention(q, state.self_k[i], state.self_v[i], self_bias, drop, self.training)  # (N, H, 1, dk)
            x = x + sa.dropout(sa.SelfAttention.o(a.transpose(1, 2).reshape(N, 1, H * dk)))
            h = ca.layer_norm(x)
            q = ca.EncDecAttention.q(h).view(B, w, H, dk).transpose(1, 2)  # (B, H, w, dk): hypotheses as positions
            if enc_bias is None:  # additive mask (B, 1, 1, S): 0 at tokens, the dtype's minimum at padding
                kv_dtype = state.cross_k[i].dtype
                enc_bias = torch.zeros((), dtype=kv_dtype, device=x.device).masked_fill(
                    ~state.enc_mask[:, None, None, :], torch.finfo(kv_dtype).min)
            drop = ca.EncDecAttention.dropout if self.training else 0.0
            a = _t5_attention(q, state.cross_k[i], state.cross_v[i], enc_bias, drop, self.training)  # (B, H, w, dk)
            x = x + ca.dropout(ca.EncDecAttention.o(a.transpose(1, 2).reshape(N, 1, H * dk)))
            x = ff(x)
        h = dec.dropout(dec.final_layer_norm(x))  # (N, 1, d)
        pawa_h = None
        if self.config.pawa:
            pawa_h, state.pawa = self.pawa_rnn(dec.embed_tokens(ids), state.pawa)  # (N, 1, d)
        steps = torch.full((1,), t, dtype=torch.long, device=h.device)
        state.step = t + 1
        return F.log_softmax(self.slot_logits(h, steps, pawa_h)[:, 0].float(), dim=-1)

    @staticmethod
    def reorder(state: DecoderState, index: torch.Tensor) -> None:
        """Keep hypotheses ``index`` (N',) of the state, in that order; each query's hypotheses must stay
        contiguous and in query order (``index // w_old`` non-decreasing), as the cross-attention keys and
        values are the query's, not the hypothesis'."""
        state.self_k = [k.index_select(0, index) for k in state.self_k]
        state.self_v = [v.index_select(0, index) for v in state.self_v]
        if state.pawa is not None:
            state.pawa = state.pawa.index_select(1, index)
