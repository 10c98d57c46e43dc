import numpy as np
import pytest
import torch
from tiny_models import DOCS, QUERIES

from gdr.lm import PromptConfig, clean_query


@pytest.mark.parametrize("family", ["llama", "t5"])
@pytest.mark.parametrize("doc_batch_size,max_query_tokens", [(1, 2048), (3, 7), (7, 1)])
def test_engine_equals_naive(family, doc_batch_size, max_query_tokens, llama, t5):
    lm = llama if family == "llama" else t5
    fast = lm.score(DOCS, QUERIES, doc_batch_size=doc_batch_size, max_query_tokens=max_query_tokens, progress=False)
    naive = lm.score_naive(DOCS, QUERIES)
    assert fast.shape == (len(DOCS), len(QUERIES))
    assert np.isfinite(fast).all()
    np.testing.assert_allclose(fast, naive, atol=1e-4, rtol=0)
    # log-probs of multi-token queries are far below 0 for a random model
    assert (fast < 0).all()


def _by_hand(lm, doc: str, query: str, stop: list[int], ended: bool) -> float:
    """log p(query | doc) from the model's own logits: its tokens' log-probs, then, if it ended, log of the summed
    probability of the stop ids."""
    p = lm.prompt_ids([doc])[0]
    q = lm.tokenizer(query, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        lp = lm.model(input_ids=torch.tensor([p + q])).logits[0].double().log_softmax(-1)
    total = sum(float(lp[len(p) - 1 + t, q[t]]) for t in range(len(q)))
    return total + (float(torch.logsumexp(lp[len(p) + len(q) - 1, stop], 0)) if ended else 0.0)


def test_score_counts_the_end_token(llama):
    """Eq. (1) includes the query's end: with the end-of-sequence token as the only stop id, its log-prob; the
    same query cut before its end (ended False) scores strictly higher, its tokens alone."""
    assert llama.query_ids(["cat mat"])[0][-1] == llama.eos_id and llama._stop_ids() == [llama.eos_id]
    full, cut = llama.score(DOCS[:1], ["cat mat"] * 2, progress=False, ended=[True, False])[0]
    assert full == pytest.approx(_by_hand(llama, DOCS[0], "cat mat", [llama.eos_id], True), abs=1e-4)
    assert cut == pytest.approx(_by_hand(llama, DOCS[0], "cat mat", [], False), abs=1e-4)
    assert full < cut


@pytest.mark.parametrize("attention,doc_batch_size,max_query_tokens", [("dense", 1, 2048), ("dense", 3, 5),
                                                                       ("flex", 2, 2048), ("flex", 7, 4)])
def test_an_ended_querys_end_is_any_stop_id_and_a_cut_querys_is_none(llama, monkeypatch, attention, doc_batch_size,
                                                                       max_query_tokens):
    """A model that stops at a second id (SmolLM2: its end token and a newline) ends a query with either: the end
    term is log(p(end) + p(newline)), whichever the sampler stopped on; a query cut at max_new_tokens has none.
    Checked against the model's own logits and the naive reference, on both attention paths and in chunks, an
    empty ended query (its one token, its end, scored from the prompt) included."""
    period = llama.tokenizer.convert_tokens_to_ids(".")
    stop = [llama.eos_id, period]
    monkeypatch.setattr(llama, "_stop_ids", lambda: sorted(stop))
    queries = ["cat mat", "stock market fall today", "x", "oil", "", "new striker signed", "x"]
    ended = np.array([True, False, True, False, True, True, False])
    fast = llama.score(DOCS, queries, doc_batch_size=doc_batch_size, max_query_tokens=max_query_tokens,
                       progress=False, attention=attention, ended=ended)
    want = np.array([[_by_hand(llama, d, q, stop, e) for q, e in zip(queries, ended)] for d in DOCS])
    np.testing.assert_allclose(fast, want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(llama.score_naive(DOCS, queries, ended=ended), want, atol=1e-4, rtol=0)
    only_eos = llama.score(DOCS, queries, progress=False, ended=ended, attention=attention)
    monkeypatch.setattr(llama, "_stop_ids", lambda: [llama.eos_id])
    assert (fast[:, ended] > llama.score(DOCS, queries, progress=False, ended=ended)[:, ended]).all()
    np.testing.assert_array_equal(only_eos[:, ~ended], llama.score(DOCS, queries, progress=False,
                                                                   ended=ended, attention=attention)[:, ~ended])


@pytest.mark.parametrize("attention", ["dense", "flex"])
def test_the_bf16_scoring_copy_ends_a_query_at_any_stop_id(llama, monkeypatch, attention):
    """The CUDA configuration (a bf16 copy of the weights, fp32 log-softmax sums), run on the CPU through
    ``score``: its end correction over a second stop id lands within bf16's rounding of the fp32 reference, and is
    there at all (without it an ended query would be off by log(1 + p(".") / p(end)), far more than the rounding)."""
    stop = [llama.eos_id, llama.tokenizer.convert_tokens_to_ids(".")]
    monkeypatch.setattr(llama, "_stop_ids", lambda: sorted(stop))
    queries = ["cat mat", "stock market fall today", "", "oil", "new striker signed"]
    ended = np.array([True, False, True, True, False])
    got = llama.score(DOCS, queries, doc_batch_size=3, max_query_tokens=4, attention=attention, ended=ended,
                      compute_dtype=torch.bfloat16, progress=False)
    want = np.array([[_by_hand(llama, d, q, stop, e) for q, e in zip(queries, ended)] for d in DOCS])
    eos_only = np.array([[_by_hand(llama, d, q, [llama.eos_id], e) for q, e in zip(queries, ended)] for d in DOCS])
    np.testing.assert_allclose(got, want, atol=2e-2, rtol=0)
    assert np.abs(got - want).max() > 1e-6  # it ran in bf16, not silently in fp32
    assert (np.abs(want - eos_only)[:, ended] > 0.1).all()  # the correction is far larger than the rounding


def test_a_causal_prefix_prompt_starts_as_its_tokenizer_starts_a_text(llama, t5):
    """A causal base model given a prefix prompt reads it after the special tokens its tokenizer puts before a text
    (Llama's <s>; the tiny models' WordPiece tokenizer: [CLS]), never those after it (the query follows): sampled and
    scored so, keyed so. A chat template and T5's prompt are tokenised as before."""
    from tiny_models import tiny_llama

    from gdr.lm import GenerativeLM

    base = tiny_llama()
    prefix = PromptConfig(style="prefix", prefix="query for: ", system=None, shots=[])
    lm = GenerativeLM(base.model, base.tokenizer, prompt=prefix, max_doc_tokens=24, device="cpu")
    cls, sep = lm.tokenizer.cls_token_id, lm.tokenizer.sep_token_id
    texts = lm.prompt_texts(DOCS)
    bare = lm.tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert lm.prompt_ids(DOCS) == [[cls] + ids for ids in bare] and lm.describe()["lead"] == [cls]
    q = lm.tokenizer("oil prices", add_special_tokens=False)["input_ids"] + [lm.eos_id]
    with torch.inference_mode():
        lp = lm.model(input_ids=torch.tensor([[cls] + bare[4] + q])).logits[0].double().log_softmax(-1)
    want = sum(float(lp[len(bare[4]) + t, q[t]]) for t in range(len(q)))
    assert lm.score([DOCS[4]], ["oil prices"], progress=False)[0, 0] == pytest.approx(want, abs=1e-4)
    assert all(sep not in ids[1:] for ids in lm.prompt_ids(DOCS))
    assert lm.sample_queries(DOCS[:2], 2, seed=0, batch_size=2, max_new_tokens=4, progress=False).texts
    # the chat template holds its own special tokens; T5 keeps its tokenizer's (</s> after the input)
    chat = llama.tokenizer(llama.prompt_texts(DOCS[:1]), add_special_tokens=False)["input_ids"]
    assert llama.prompt_ids(DOCS[:1]) == chat and "lead" not in llama.describe()
    assert t5.prompt_ids(DOCS[:1]) == t5.tokenizer(t5.prompt_texts(DOCS[:1]))["input_ids"]
    assert "lead" not in t5.describe()


def test_document_truncation(llama):
    long_doc = " ".join(["word"] * 500)
    (short,) = llama.truncate([long_doc])
    assert len(llama.tokenizer(short, add_special_tokens=False)["input_ids"]) == llama.max_doc_tokens


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_sampling_reproducible_by_seed(family, llama, t5):
    lm = llama if family == "llama" else t5
    a = lm.sample_queries(DOCS, 6, seed=3, batch_size=4, max_new_tokens=8, progress=False)
    b = lm.sample_queries(DOCS, 6, seed=3, batch_size=4, max_new_tokens=8, progress=False)
    c = lm.sample_queries(DOCS, 6, seed=4, batch_size=4, max_new_tokens=8, progress=False)
    assert a.texts == b.texts and (a.source_index == b.source_index).all()
    assert a.texts != c.texts
    assert all(t for t in a.texts)
    assert a.source_index.min() >= 0 and a.source_index.max() < len(DOCS)


def test_sampling_resume_equals_uninterrupted(llama):
    full = llama.sample_queries(DOCS, 8, seed=1, batch_size=4, max_new_tokens=6, progress=False)
    seen = []
    llama.sample_queries(DOCS, 4, seed=1, batch_size=4, max_new_tokens=6, progress=False, on_batch=seen.append)
    resumed = llama.sample_queries(DOCS, 8, seed=1, batch_size=4, max_new_tokens=6, progress=False, start=seen[-1])
    assert resumed.texts == full.texts


def test_empty_generations_are_redrawn(llama, monkeypatch):
    calls = []
    orig = llama.decode_ended

    def flaky(docs, rows, qid, attempt, **kw):
        calls.append((len(qid), int(np.max(attempt))))
        out, ended = orig(docs, rows, qid, attempt, **kw)
        return ["" if len(calls) == 1 and k == 0 else t for k, t in enumerate(out)], ended

    monkeypatch.setattr(llama, "decode_ended", flaky)
    res = llama.sample_queries(DOCS, 4, seed=0, batch_size=4, max_new_tokens=6, progress=False)
    assert res.n_redrawn == 1 and calls == [(4, 0), (1, 1)]  # the redraw uses the next attempt's stream
    assert all(res.texts)


def test_clean_query():
    assert clean_query('  Search query: "apple iphone sales"\nmore text') == "apple iphone sales"
    assert clean_query("Query - oil prices") == "oil prices"
    assert clean_query(" ".join(["w"] * 50), max_words=5) == "w w w w w"
    assert clean_query("\n") == ""


def test_chat_prompt_contains_shots_and_doc(llama):
    (text,) = llama.prompt_texts(["stocks fell"])
    for _doc, query in llama.prompt.shots:
        assert query in text
    assert text.rstrip().endswith("[assistant]")
    assert "Document: stocks fell" in text


def test_prompt_without_chat_template_is_an_error():
    from tiny_models import tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from gdr.lm import GenerativeLM

    tok = tokenizer()
    tok.chat_template = None
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=16,
                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ValueError, match="no chat template"):
        GenerativeLM(m, tok, prompt=PromptConfig(style="chat"), device="cpu")


def _rotary_at(model, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, fp32, of ``model``'s rotary embedding at ``positions`` (transformers' own forward)."""
    return model.model.rotary_emb(torch.zeros(1, dtype=torch.float32), positions[None])


def test_low_precision_copies_keep_rotary_fp32(llama):
    """The CUDA decode copy and the bf16 scoring copy (their production code, run on the CPU) keep the rotary
    frequencies fp32: bf16 ones put the angle of SmolLM2 off by ~0.5 rad at position 400."""
    from gdr.lm.decode import Decoder

    copies = {"decode": Decoder(llama, compile=False, dtype=torch.bfloat16).model,
              "scoring": llama._scoring_model(torch.bfloat16)}
    pos = torch.arange(380, 420)
    ref = _rotary_at(llama.model, pos)
    for name, m in copies.items():
        assert m is not llama.model and next(m.parameters()).dtype == torch.bfloat16, name
        bufs = {k: b.dtype for k, b in m.named_buffers() if "inv_freq" in k}
        assert bufs == dict.fromkeys(["model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"],
                                     torch.float32), name
        for got, want in zip(_rotary_at(m, pos), ref):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=lambda s, name=name: f"{name} copy: {s}")
    assert next(llama.model.parameters()).dtype == torch.float32  # the model itself is not cast


def test_token_and_score_caches_belong_to_their_model():
    """The tokenisation cache and the scoring copy are the GenerativeLM's own objects: another model shares
    neither, and a replaced tokenizer (or model) is not served from what the old one computed."""
    import copy

    import torch
    from tiny_models import tiny_llama

    lm = tiny_llama()
    ids = lm.prompt_ids(DOCS[:2])
    assert set(lm.tokens.table("prompt", lm.tokenizer, (repr(lm.prompt), lm.max_doc_tokens, False, lm.eos_id))) \
        == set(DOCS[:2])
    other = tiny_llama()
    assert other.tokens is not lm.tokens and other.kernels is not lm.kernels
    lm.tokenizer = copy.deepcopy(lm.tokenizer)
    lm.tokenizer.chat_template = lm.tokenizer.chat_template.replace("[SEP]", "[SEP] [SEP]")
    assert lm.prompt_ids(DOCS[:2]) != ids  # the new tokenizer's prompts, not the cached ones
    lm.score(DOCS[:1], QUERIES[:2], compute_dtype=torch.bfloat16, progress=False)
    first = lm.score_copy.model
    lm.model = copy.deepcopy(lm.model)
    lm.score(DOCS[:1], QUERIES[:2], compute_dtype=torch.bfloat16, progress=False)
    assert lm.score_copy.model is not first and lm.score_copy.source is lm.model


def test_a_model_object_is_identified_by_its_weights_not_its_class():
    from tiny_models import tiny_llama

    a, b, a_again = tiny_llama(seed=0), tiny_llama(seed=1), tiny_llama(seed=0)
    assert a.describe()["weights"].startswith("sha256:")
    assert a.describe() != b.describe()  # two random-init models of one class: another P
    assert a.describe() == a_again.describe()
    with torch.no_grad():
        a.model.lm_head.weight.add_(1.0)  # changed in memory
    from gdr.lm.model import object_digest
    assert object_digest(a.model, a.tokenizer) != a_again.describe()["weights"]


def test_per_doc_sampling_redraws_an_empty_generation_as_sample_queries_does(monkeypatch):
    from tiny_models import tiny_llama

    lm = tiny_llama()
    real = lm.decode_ended

    def every_third_empty_at_first(docs, rows, qid, attempt, **kw):
        out, ended = real(docs, rows, qid, attempt, **kw)
        return ["" if attempt == 0 and q % 3 == 0 else g for q, g in zip(np.asarray(qid).tolist(), out)], ended

    monkeypatch.setattr(lm, "decode_ended", every_third_empty_at_first)
    got = lm.sample_per_doc(DOCS[:4], 3, seed=0, max_new_tokens=5)
    assert [len(q) for q in got] == [3, 3, 3, 3] and all(all(q) for q in got)
