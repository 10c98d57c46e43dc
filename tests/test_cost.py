"""The cost model (gdr/cost.py): one reader of model dimensions, the batch-for-memory rule, the parameter count
of a meta-device build, and the automatic sizes that read them."""
from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, LlamaConfig, T5Config

from gdr import cost
from gdr.training.model import GenerativeRetriever, RetrieverConfig, decoder_dims, encoder_dims, meta_param_count


def test_dims_reads_every_config_family_alike():
    """Llama (grouped-query), T5 (d_kv, decoder layers apart), BERT, a config dict and a retriever's settings."""
    llama = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
                        num_key_value_heads=2, vocab_size=500)
    d = cost.dims(llama)
    assert (d.layers, d.d_model, d.heads, d.kv_heads, d.head_dim, d.d_ff, d.vocab) == (3, 64, 8, 2, 8, 96, 500)
    assert d.attn == 64 and d.kv == 16 and cost.dims(llama.to_dict()) == d
    t5 = T5Config(d_model=32, d_kv=16, num_heads=3, num_layers=2, num_decoder_layers=5, d_ff=40, vocab_size=99)
    assert cost.dims(t5).layers == 2 and cost.dims(t5, decoder=True).layers == 5
    assert cost.dims(t5).attn == 48 and cost.dims(t5).kv == 48 and cost.dims(t5.to_dict()) == cost.dims(t5)
    bert = cost.dims(BertConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80))
    assert (bert.layers, bert.head_dim, bert.d_ff) == (2, 12, 80)
    rc = RetrieverConfig(d_model=64, num_layers=3, num_heads=4, d_ff=128, n_digits=10, max_code_len=3)
    assert decoder_dims(rc) == cost.Dims(3, 64, 4, 4, 16, 128, rc.vocab_size)
    assert decoder_dims(RetrieverConfig(d_model=64, num_heads=4, d_kv=8)).attn == 32
    with pytest.raises(ValueError, match="cannot tell"):
        cost.dims({"vocab_size": 3})


def test_encoder_dims_cut_to_encoder_layers():
    cfg = RetrieverConfig(encoder=None, encoder_config=dict(d_model=32, num_layers=4, num_heads=4, d_ff=64),
                          encoder_layers=2, tokenizer="minilm-l6")
    assert encoder_dims(cfg).layers == 2 and encoder_dims(cfg).d_ff == 64


def test_batch_for_memory_rule():
    """Units that fit in the share of free memory after the fixed bytes; at least 1, at most cap, a multiple."""
    assert cost.batch_for_memory(1000, 10, share=0.5) == 50
    assert cost.batch_for_memory(1000, 10, share=0.5, fixed=200) == 30
    assert cost.batch_for_memory(1000, 10, share=0.5, cap=20) == 20
    assert cost.batch_for_memory(1000, 10, share=0.5, fixed=10_000) == 1  # nothing fits: one unit anyway
    assert cost.batch_for_memory(100_000, 10, share=1.0, multiple=64) == 9984
    assert cost.batch_for_memory(500, 10, share=1.0, multiple=64) == 50  # below one multiple: as it is


@pytest.mark.parametrize("name", ["tiny", "mini"])
def test_meta_param_count_equals_the_real_build(name):
    """The parameters batch auto reserves memory for are those a real build has (counted without weights)."""
    from gdr.bench.common import preset_config

    cfg = preset_config(name, 30, 4)
    vocab = 32128 if cfg.encoder is None else None  # a random-init encoder: the T5 settings' own vocabulary
    real = GenerativeRetriever.build(preset_config(name, 30, 4), vocab_size=vocab)
    assert meta_param_count(cfg) == sum(p.numel() for p in real.parameters())


def test_score_memory_and_auto_score_sizes_agree():
    """auto_score_sizes is the batch-for-memory rule over score_memory: half the free memory less the tile."""
    from types import SimpleNamespace

    from gdr.lm.scoring import auto_score_sizes

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3)
    per_doc, tile = cost.score_memory(cost.dims(cfg), 128, 4096)
    assert tile == 4096 * 49152 * 8 and per_doc == 2 * 2 * 30 * 2 * 192 * (128 + 4096) + 4096 * (
        4 * 576 + 3 * 1536 + 2 * 576) * 2
    free = 8e9
    bs, chunk = auto_score_sizes(SimpleNamespace(config=cfg), torch.device("cuda"), 128, free_bytes=free)
    assert chunk == 4096 and bs == int((0.5 * free - tile) // per_doc) == 9
