"""The scoring engine's fast paths (chunked log-probs, flex block mask, folded T5 cross-attention, bf16)
against references, on tiny random models on the CPU."""
import numpy as np
import pytest
import torch
from tiny_models import DOCS, QUERIES, tiny_llama, tiny_t5

from gdr.cost import param_count, scoring_flops_per_pair
from gdr.device import local_device
from gdr.lm.scoring import CPU_DOC_BATCH_SIZE, CPU_MAX_QUERY_TOKENS, auto_score_sizes, token_logprobs

pytestmark = pytest.mark.cost(seconds=25)  # the file's tests in all, fast lane, 2 cores: dealt first

# Ragged on both sides: prompts of different lengths, queries of 2 to 5 tokens (with EOS).
RAGGED_QUERIES = QUERIES + ["a much longer query about the central bank and europe", "rat"]


@pytest.fixture(scope="module")
def naive(llama, t5):
    return {"llama": llama.score_naive(DOCS, RAGGED_QUERIES), "t5": t5.score_naive(DOCS, RAGGED_QUERIES)}


@pytest.mark.parametrize("token_chunk,vocab_chunk", [(None, None), (8, 16), (5, 7), (64, 1000)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_token_logprobs_equals_log_softmax_gather(token_chunk, vocab_chunk, with_bias):
    g = torch.Generator().manual_seed(0)
    N, d, V = 37, 12, 101
    h, w = torch.randn(N, d, generator=g) * 3, torch.randn(V, d, generator=g)
    b = torch.randn(V, generator=g) if with_bias else None
    t = torch.randint(0, V, (N,), generator=g)
    t[:3] = torch.tensor([0, V - 1, 16])  # the first and last vocabulary ids, and a tile border
    ref = torch.log_softmax(h @ w.t() + (0 if b is None else b), -1).gather(1, t[:, None])[:, 0]
    got = token_logprobs(h, w, t, b, token_chunk=token_chunk, vocab_chunk=vocab_chunk)
    assert got.dtype == torch.float32 and got.shape == (N,)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_token_logprobs_bf16_accumulates_in_fp32():
    """bf16 inputs, fp32 logits (not rounded to bf16: CUDA's fp32-out matmul, emulated on the CPU), softmax
    sums in fp32: a bf16 running sum over 3,000 tiles' worth of terms would be far off."""
    g = torch.Generator().manual_seed(1)
    h, w = torch.randn(20, 16, generator=g).bfloat16(), torch.randn(3000, 16, generator=g).bfloat16()
    t = torch.randint(0, 3000, (20,), generator=g)
    ref = torch.log_softmax(h.float() @ w.float().t(), -1).gather(1, t[:, None])[:, 0]
    got = token_logprobs(h, w, t, vocab_chunk=256)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention", ["dense", "flex"])
@pytest.mark.parametrize("doc_batch_size,max_query_tokens", [(1, 2048), (3, 7), (7, 2)])
def test_causal_engine_equals_naive_fp32(llama, naive, attention, doc_batch_size, max_query_tokens):
    fast = llama.score(DOCS, RAGGED_QUERIES, doc_batch_size=doc_batch_size, max_query_tokens=max_query_tokens,
                       attention=attention, progress=False)
    np.testing.assert_allclose(fast, naive["llama"], atol=1e-4, rtol=0)


# (3, 2048): several documents and several queries per chunk, the folded cross-attention (under transformers
# 5.17 T5's stacks kept SDPA, which failed on the folded rows)
@pytest.mark.parametrize("doc_batch_size,max_query_tokens", [(1, 2048), (3, 7), (7, 2), (3, 2048)])
def test_seq2seq_engine_equals_naive_fp32(t5, naive, doc_batch_size, max_query_tokens):
    fast = t5.score(DOCS, RAGGED_QUERIES, doc_batch_size=doc_batch_size, max_query_tokens=max_query_tokens,
                    progress=False)
    np.testing.assert_allclose(fast, naive["t5"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family,attention", [("llama", "dense"), ("llama", "flex"), ("t5", "auto")])
def test_bf16_engine_near_fp32_naive(llama, t5, naive, family, attention):
    """The CUDA default (a bf16 copy of the weights), run on the CPU. T5's random-init activations are
    large: allow 1e-3 relative on top (its queries score about -55 nats; HF's own bf16 forward is 0.34 off)."""
    lm = llama if family == "llama" else t5
    fast = lm.score(DOCS, RAGGED_QUERIES, doc_batch_size=3, max_query_tokens=7, attention=attention,
                    compute_dtype=torch.bfloat16, progress=False)
    assert np.isfinite(fast).all()
    np.testing.assert_allclose(fast, naive[family], atol=2e-2, rtol=0 if family == "llama" else 1e-3)
    # the bf16 path really ran in bf16 (not silently fp32): it differs from the fp32 numbers
    assert np.abs(fast - naive[family]).max() > 1e-6


@pytest.mark.parametrize("attention", ["dense", "flex"])
def test_scoring_copies_no_keys_and_values(attention, repeat_kv_calls):
    """The tiny Llama's grouped-query attention (4 query heads, 2 key/value heads) in the prompt pass and the
    query chunks runs without transformers' ``repeat_kv``; P is transformers' own SDPA forward's (which copies)."""
    import copy

    from gdr.lm import GenerativeLM

    lm = tiny_llama()
    ref_lm = GenerativeLM(copy.deepcopy(lm.model), lm.tokenizer, prompt=lm.prompt, max_doc_tokens=lm.max_doc_tokens,
                          device="cpu")
    got = lm.score(DOCS, RAGGED_QUERIES, doc_batch_size=3, max_query_tokens=7, attention=attention, progress=False)
    assert repeat_kv_calls[0] == 0
    ref_lm.model.set_attn_implementation("sdpa")
    np.testing.assert_allclose(got, ref_lm.score_naive(DOCS, RAGGED_QUERIES), atol=1e-4, rtol=0)
    ref_lm.model(**ref_lm._pad(ref_lm.prompt_ids(DOCS[:2])))  # padded: transformers' SDPA copies under a mask
    assert repeat_kv_calls[0] > 0  # (the counter sees it)


@pytest.mark.parametrize("T,mask_heads,mask_rows,boolean", [(1, 1, 1, True), (5, 1, 5, True), (5, 1, 1, False),
                                                            (5, 6, 5, False), (1, 6, 1, True)])
def test_grouped_sdpa_equals_repeated_keys(T, mask_heads, mask_rows, boolean):
    """The folded grouped-query attention equals SDPA over keys and values repeated per query head, for a decode
    step (T = 1) and a prefill, masks shared by the heads or per head, boolean or additive."""
    from transformers.integrations.sdpa_attention import repeat_kv

    from gdr.lm.attention import grouped_sdpa

    g = torch.Generator().manual_seed(0)
    B, H, Hkv, S, D = 3, 6, 2, 11, 8
    q = torch.randn(B, H, T, D, generator=g)
    k, v = torch.randn(B, Hkv, S, D, generator=g), torch.randn(B, Hkv, S, D, generator=g)
    allowed = torch.rand(B, mask_heads, mask_rows, S, generator=g) > 0.3
    allowed[..., 0] = True  # every row sees a key
    mask = allowed if boolean else torch.zeros(allowed.shape).masked_fill(~allowed, -1e9)
    want = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv),
                                                            attn_mask=mask, scale=0.3).transpose(1, 2)
    torch.testing.assert_close(grouped_sdpa(q, k, v, mask, 0.3), want, rtol=0, atol=1e-6)


def test_bf16_copy_follows_the_model():
    """bf16 scoring uses a copy (the sampling model keeps its fp32 weights), made again after the model's
    weights change in place, as a fine-tune does."""
    lm = tiny_llama()
    before = lm.score(DOCS[:2], QUERIES[:2], compute_dtype=torch.bfloat16, progress=False)
    assert next(lm.model.parameters()).dtype == torch.float32
    with torch.no_grad():
        lm.model.get_output_embeddings().weight.mul_(3.0)
    after = lm.score(DOCS[:2], QUERIES[:2], compute_dtype=torch.bfloat16, progress=False)
    np.testing.assert_allclose(after, lm.score_naive(DOCS[:2], QUERIES[:2]), atol=2e-2, rtol=0)
    assert np.abs(after - before).min() > 0.1


def test_naive_reference_is_fp32_with_autocast_off():
    """The bench's reference (``score_naive``, its ``max_abs_diff``) is fp32 whatever the model's dtype and the
    caller's settings: a bf16 model is scored through an fp32 copy, a caller's bf16 autocast and TF32 matmul
    precision (what training sets) are off inside and restored after. No device branch: CUDA runs this code."""
    lm = tiny_llama()
    lm.model.to(torch.bfloat16)
    ref = lm.score(DOCS[:2], QUERIES[:3], compute_dtype=torch.float32, progress=False)  # an fp32 copy's P
    seen = []

    def hook(mod, args, out):
        seen.append((out.dtype, torch.is_autocast_enabled("cpu"), torch.get_float32_matmul_precision()))

    handles = [m.register_forward_hook(hook) for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            naive = lm.score_naive(DOCS[:2], QUERIES[:3])
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
        for h in handles:
            h.remove()
    assert seen and set(seen) == {(torch.float32, False, "highest")}
    np.testing.assert_allclose(naive, ref, atol=1e-4, rtol=0)
    assert next(lm.model.parameters()).dtype == torch.bfloat16  # the model itself is not cast


def test_auto_sizes():
    cfg_model = tiny_llama().model
    assert auto_score_sizes(cfg_model, torch.device("cpu")) == (CPU_DOC_BATCH_SIZE, CPU_MAX_QUERY_TOKENS)
    gpu = torch.device("cuda")  # free memory passed in: no CUDA call
    small, _ = auto_score_sizes(cfg_model, gpu, 400, free_bytes=2 ** 20)
    mid, chunk = auto_score_sizes(cfg_model, gpu, 400, free_bytes=2 ** 31)
    big, _ = auto_score_sizes(cfg_model, gpu, 400, free_bytes=2 ** 40)
    assert small == 1 and 1 < mid < big == 64 and chunk == 4096


def test_flops_per_pair_by_hand():
    """One query token, no prompt, one query: 2 FLOPs per weight plus attention to itself."""
    m = tiny_llama().model
    n_weights = sum(x.weight.numel() for x in m.modules() if isinstance(x, torch.nn.Linear))
    norms = sum(p.numel() for n, p in m.named_parameters() if "norm" in n)
    assert param_count(m) == n_weights + norms  # tied head counted once, input embedding not at all
    cfg = m.config
    attn = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads) * 1
    assert scoring_flops_per_pair(m, 0, 1, 1) == 2 * param_count(m) + attn
    # the prompt's pass is shared by the J queries
    f = lambda J: scoring_flops_per_pair(m, 100, 5, J)  # noqa: E731
    assert f(1) - f(10 ** 9) == pytest.approx((f(1) - f(10)) / 0.9, rel=1e-6)
    t = tiny_t5().model
    assert scoring_flops_per_pair(t, 24, 4, 1) > scoring_flops_per_pair(t, 24, 4, 64) > 0


def test_torchrun_rank_gets_its_own_gpu(monkeypatch):
    """Under torchrun, device auto/cuda means cuda:LOCAL_RANK (never every rank on cuda:0)."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert local_device("auto") == "cuda:1" and local_device("cuda") == "cuda:1" and chosen == [1, 1]
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_device("cuda") == "cuda:1"  # more ranks than GPUs: shared round-robin
    assert local_device("cpu") == "cpu" and local_device("cuda:0") == "cuda:0"
    monkeypatch.delenv("LOCAL_RANK")
    assert local_device("auto") == "auto"


def test_scoring_bench_json_keys(tmp_path, capsys):
    """The contract of `make bench-gpu`: the last line is JSON with the rates, MFU and device (CPU: mfu None);
    with --profile the profile table of the timed path is printed as well as written."""
    import json

    from gdr.bench.scoring import main

    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(DOCS) + "\n")
    assert main(["--model", "smollm2-135m-random", "--device", "cpu", "--pairs", "4", "--queries", "2",
                 "--doc-tokens", "8", "--query-tokens", "3", "--naive-pairs", "2", "--docs-file", str(docs),
                 "--profile", str(tmp_path / "profile.txt")]) == 0
    printed = capsys.readouterr().out
    out = json.loads(printed.strip().splitlines()[-1])
    assert (tmp_path / "profile.txt").read_text() in printed  # the timed path's profile is printed too
    assert {"engine_pairs_per_s", "mfu", "device", "flops_per_pair", "peak_bf16_tflops", "naive_pairs_per_s",
            "speedup", "max_abs_diff"} <= out.keys()
    assert out["device"] == "cpu" and out["mfu"] is None and out["pairs"] == 4
    assert out["flops_per_pair"] > 2 * 100e6 and out["max_abs_diff"] < 1e-3


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_compiled_scoring_compiles_each_kernel_once_over_ragged_batches(family, naive):
    """The CUDA configuration (ScoringKernels.compile) traced by dynamo on the CPU with the eager backend, through
    ``score``: ragged prompts, a last doc batch of 1 of 4 (7 documents: batches of 4 and 3, then 1 of 4 more
    for a second call) and query chunks of several lengths. Every batch is padded to one shape (rows, prompt
    length, chunk width), so each compiled kernel (flex attention, the log-prob tile) traces one graph: 2 for
    the causal model, 1 for T5 (no flex). Unpadded, the smaller batches and chunk widths added graphs of
    their own (a row count of 1 and each number of key blocks: 4 graphs for these batches). The numbers equal
    the fp32 reference."""
    import torch._dynamo

    lm = tiny_llama() if family == "llama" else tiny_t5()
    lm.kernels.compile, lm.kernels.options = True, {"backend": "eager"}
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    kw = dict(doc_batch_size=4, max_query_tokens=9, progress=False)
    got = lm.score(DOCS, RAGGED_QUERIES, attention="flex" if family == "llama" else "auto", **kw)
    lm.score(DOCS[:1], RAGGED_QUERIES, attention="flex" if family == "llama" else "auto", **kw)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs == (2 if family == "llama" else 1), dict(torch._dynamo.utils.counters["stats"])
    np.testing.assert_allclose(got, naive[family], atol=2e-4, rtol=0)


def test_auto_sizes_read_free_memory_after_emptying_the_cache(monkeypatch, llama):
    """The caching allocator's blocks (earlier models, batches, graph pools) count as used in mem_get_info: an
    auto size is read after emptying it, for scoring and for sampling alike, so a later stage of a run does not
    size itself smaller than the first. (CUDA's two calls recorded on the CPU.)"""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: calls.append("read") or (8 << 30, 80 << 30))
    bs, mq = auto_score_sizes(llama.model, torch.device("cuda"), 100)
    assert calls == ["empty", "read"] and bs >= 1 and mq == 4096
    calls.clear()
    monkeypatch.setattr(llama, "device", torch.device("cuda"))
    assert llama.auto_batch_size(8) >= 1 and calls == ["empty", "read"]


def test_the_block_mask_allows_what_the_dense_mask_allows(llama):
    """The block mask's one-load rule (a query token sees its query's contiguous run up to itself, and its
    document's prompt) allows exactly the pairs the dense additive mask allows, padding query included."""
    from torch.nn.attention.flex_attention import create_mask

    q_ids = llama.query_ids(RAGGED_QUERIES)
    _, _, chunks = llama._pack_causal(q_ids, 64, flex=True)
    _, _, packed, _ = chunks[0]
    qid, off = packed[2], packed[3]
    plen, Lp, T = torch.tensor([5, 9, 7]), 9, packed.shape[1]
    block = llama._block_mask(plen, Lp, off)
    allowed = create_mask(block.mask_mod, 3, 1, T, Lp + T, device="cpu")  # (B, 1, T, Lp + T)
    dense = llama._dense_mask(plen, Lp, qid, off, torch.float32) == 0
    assert torch.equal(allowed, dense) and T % 128 == 0 and 0 < dense.sum() < dense.numel()
