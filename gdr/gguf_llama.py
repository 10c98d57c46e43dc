"""A Llama GGUF file read into a transformers state dict and config, vectorised (numpy over whole tensors).

transformers' GGUF path parses the file's metadata once per object it builds (config, model, tokenizer) and
maps names tensor by tensor; here the header is read once (the token and merge strings are skipped by their
lengths, not decoded) and each tensor is de-quantised in one numpy expression over all its blocks
(Q8_0, Q4_1; :func:`gguf.quants.dequantize` for other types). The tokenizer is transformers' (``gguf_file``),
read by its own reader.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

__all__ = ["GGUFTensor", "read_gguf", "llama_checkpoint"]

# GGUF value types: struct format of the scalars; 8 = string, 9 = array
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass
class GGUFTensor:
    """One tensor of a GGUF file: ``shape`` in numpy order (GGUF lists the fastest dimension first)."""

    name: str
    shape: tuple[int, ...]
    qtype: int
    offset: int  # from the start of the file


class _Cursor:
    """Little-endian reads from a bytes buffer."""

    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        n = self.take("Q")
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8")

    def value(self, vtype: int, decode: bool = True):
        """The next value of type ``vtype``; with ``decode`` False an array is stepped over (None)."""
        if vtype == 8:
            return self.string()
        if vtype != 9:
            return self.take(_SCALAR[vtype])
        etype, count = self.take("I"), self.take("Q")
        if etype in _SCALAR:
            arr = np.frombuffer(self.buf, dtype="<" + _SCALAR[etype], count=count, offset=self.pos)
            self.pos += arr.nbytes
            return arr.tolist() if decode else None
        items = [self.value(etype, decode) for _ in range(count)]
        return items if decode else None


def read_gguf(path: str | Path, skip: tuple[str, ...] = ("tokenizer.ggml.",)) -> tuple[dict, list[GGUFTensor]]:
    """(metadata, tensors) of a GGUF v2/v3 file. Arrays under a key starting with one of ``skip`` are stepped
    over, not decoded (the tokenizer's vocabulary and merges are transformers' to read); their scalars are kept."""
    with open(path, "rb") as f:
        head = f.read(1 << 24)  # metadata and tensor infos: well inside the first 16 MiB of a small model
    cur = _Cursor(memoryview(head))
    if cur.take("4s") != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    version, n_tensors, n_kv = cur.take("I"), cur.take("Q"), cur.take("Q")
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version}; only versions 2 and 3 are read")
    meta = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.take("I")
        value = cur.value(vtype, decode=not key.startswith(skip))
        if value is not None:
            meta[key] = value
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.take("Q") for _ in range(cur.take("I"))]
        qtype, offset = cur.take("I"), cur.take("Q")
        infos.append((name, tuple(reversed(dims)), qtype, offset))
    align = int(meta.get("general.alignment", 32))
    start = -(-cur.pos // align) * align
    return meta, [GGUFTensor(n, s, q, start + o) for n, s, q, o in infos]


def _blocks(raw: np.ndarray, nbytes: int, scales: int) -> tuple[np.ndarray, np.ndarray]:
    """Quantisation blocks of ``nbytes`` bytes: their ``scales`` leading fp16 numbers as float32 (n, scales),
    and the rest of each block's bytes (n, nbytes - 2 * scales)."""
    b = raw.reshape(-1, nbytes)
    return b[:, :2 * scales].copy().view(np.float16).astype(np.float32), b[:, 2 * scales:]


def _dequantize(mm: np.ndarray, t: GGUFTensor) -> np.ndarray:
    """The float32 values of ``t``, over all its quantisation blocks at once: Q8_0 (``d * q``) and Q4_1
    (``d * q + m``, the low nibbles of a block first) here, other types by :func:`gguf.quants.dequantize`
    (the same arithmetic, grouped by rows)."""
    from gguf import GGML_QUANT_SIZES  # optional: gdr[offline]
    from gguf.quants import dequantize  # optional: gdr[offline]

    block, nbytes = GGML_QUANT_SIZES[t.qtype]
    n = int(np.prod(t.shape))
    raw = mm[t.offset:t.offset + n // block * nbytes]
    if t.qtype == 8:  # Q8_0: fp16 d, 32 int8
        d, q = _blocks(raw, nbytes, 1)
        return (d * q.view(np.int8).astype(np.float32)).reshape(t.shape)
    if t.qtype == 3:  # Q4_1: fp16 d and m, 16 bytes of two 4-bit numbers
        dm, q = _blocks(raw, nbytes, 2)
        q = np.concatenate([q & 0x0F, q >> 4], axis=1).astype(np.float32)  # (n, 32)
        return (dm[:, :1] * q + dm[:, 1:]).reshape(t.shape)
    rows = raw.reshape(-1, t.shape[-1] // block * nbytes)  # (rows, bytes a row)
    return np.array(dequantize(rows, t.qtype).reshape(t.shape), dtype=np.float32)  # owned, writable


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores q/k rows interleaved for its rotary kernel; undo it (transformers' reverse_permute)."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def llama_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config kwargs for ``LlamaConfig``, float32 state dict) of a Llama-architecture GGUF file."""
    meta, tensors = read_gguf(path)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}; only llama is read here")
    g = lambda key, default=None: meta.get(f"llama.{key}", default)  # noqa: E731
    heads, kv_heads = int(g("attention.head_count")), int(g("attention.head_count_kv", g("attention.head_count")))
    names = {t.name for t in tensors}
    embed = next(t for t in tensors if t.name == "token_embd.weight")
    config = dict(vocab_size=int(g("vocab_size", 0) or embed.shape[0]),
                  hidden_size=int(g("embedding_length")), intermediate_size=int(g("feed_forward_length")),
                  num_hidden_layers=int(g("block_count")), num_attention_heads=heads, num_key_value_heads=kv_heads,
                  max_position_embeddings=int(g("context_length")),
                  rms_norm_eps=float(g("attention.layer_norm_rms_epsilon")),
                  rope_theta=float(g("rope.freq_base", 10000.0)), tie_word_embeddings="output.weight" not in names)
    if g("rope.dimension_count") is not None:
        config["head_dim"] = int(g("rope.dimension_count"))
    if "general.name" in meta:  # where transformers' GGUF loader puts it
        config["_model_name_or_path"] = meta["general.name"]
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("padding", "pad_token_id"),
                      ("unknown", "unk_token_id")):
        if f"tokenizer.ggml.{name}_token_id" in meta:
            config[key] = int(meta[f"tokenizer.ggml.{name}_token_id"])
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    state = {}
    for t in tensors:
        w = _dequantize(mm, t)
        if t.name == "token_embd.weight":
            key = "model.embed_tokens.weight"
        elif t.name == "output_norm.weight":
            key = "model.norm.weight"
        elif t.name == "output.weight":
            key = "lm_head.weight"
        else:
            _, layer, kind, leaf = t.name.split(".")
            key = f"model.layers.{layer}.{_NAMES[kind]}.{leaf}"
            if kind in ("attn_q", "attn_k"):
                w = _unpermute(w, heads if kind == "attn_q" else kv_heads)
        state[key] = torch.from_numpy(np.ascontiguousarray(w))
    if config["tie_word_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return config, state
