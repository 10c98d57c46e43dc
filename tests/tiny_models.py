"""Tiny random-init models for tests: real architectures, no download, milliseconds per call.

Both use the tokenizer of the bundled all-MiniLM-L6-v2 (a real WordPiece vocabulary), so they run
offline; the causal one gets a minimal chat template so the chat prompt path is exercised too.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

from gdr.lm import GenerativeLM, PromptConfig
from gdr.models import resolve_model

CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} [SEP] {% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def tokenizer():
    tok = AutoTokenizer.from_pretrained(resolve_model("minilm-l6"))
    tok.eos_token = tok.sep_token
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_llama(seed: int = 0) -> GenerativeLM:
    tok = tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.sep_token_id)
    return GenerativeLM(LlamaForCausalLM(cfg), tok, prompt=PromptConfig(), max_doc_tokens=24, device="cpu")


def saved_tiny_llama(path: str | os.PathLike, seed: int = 0) -> Path:
    """``tiny_llama(seed)`` saved to ``path`` (its weights and tokenizer), loadable by path like any checkpoint;
    returns ``path``."""
    lm = tiny_llama(seed)
    lm.model.save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return Path(path)


def tiny_t5(seed: int = 0) -> GenerativeLM:
    tok = tokenizer()
    torch.manual_seed(seed)
    cfg = T5Config(vocab_size=len(tok), d_model=32, num_layers=2, num_heads=4, d_ff=37, d_kv=8,
                   decoder_start_token_id=tok.pad_token_id, pad_token_id=tok.pad_token_id,
                   eos_token_id=tok.sep_token_id)
    prompt = PromptConfig(style="prefix", prefix="text2query: ", system=None, shots=[])
    return GenerativeLM(T5ForConditionalGeneration(cfg), tok, prompt=prompt, max_doc_tokens=24, device="cpu")


DOCS = [
    "the cat sat on the mat and ate a rat",
    "stocks fell sharply on monday after weak earnings",
    "a",
    "central bank cuts rates again as growth slows in europe and inflation stays low",
    "oil prices rose on supply worries",
    "the football club signed a new striker for a record fee",
    "shares of the mining company doubled",
]
QUERIES = ["cat mat", "stock market fall today", "x", "interest rates europe", "oil", "new striker signed"]
