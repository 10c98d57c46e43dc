"""Our decode loop (gdr.lm.decode) against transformers' `generate` and logits warpers, and its per-query
random streams: the same queries at any batch size, split, or resume."""
import json

import numpy as np
import pytest
import torch
from tiny_models import DOCS, tiny_llama, tokenizer
from tokenizers import AddedToken

from gdr.io import read_jsonl, write_manifest
from gdr.lm.decode import SAMPLER_VERSION, filter_logits
from gdr.lm.sampling import line_end_ids
from gdr.stages.doc_queries import sample_per_doc_run
from gdr.stages.sample import sample_run

DOC_IDS = [f"d{i}" for i in range(len(DOCS))]
KW = dict(max_new_tokens=6, top_k=50, top_p=0.99)


def _lm(family, llama, t5):
    return llama if family == "llama" else t5


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_same_queries_at_any_batch_size(family, llama, t5):
    lm = _lm(family, llama, t5)
    runs = [lm.sample_queries(DOCS, 12, seed=5, batch_size=bs, progress=False, **KW) for bs in (1, 7, 64)]
    assert runs[0].texts == runs[1].texts == runs[2].texts
    assert len(set(runs[0].texts)) > 6  # really sampled, not one fixed text
    assert all((r.source_index == runs[0].source_index).all() for r in runs)
    other = lm.sample_queries(DOCS, 12, seed=6, batch_size=7, progress=False, **KW)
    assert other.texts != runs[0].texts


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_disjoint_query_ranges_equal_the_whole(family, llama, t5):
    """What two processes would do: each samples its own range of query indices j."""
    lm = _lm(family, llama, t5)
    rows = np.array([0, 3, 3, 1, 5, 0, 6, 2, 3])
    qid = np.arange(len(rows))
    whole = lm.decode_queries(DOCS, rows, qid, 0, seed=2, **KW)
    first = lm.decode_queries(DOCS, rows[:4], qid[:4], 0, seed=2, **KW)
    u, inv = np.unique(rows[4:], return_inverse=True)  # the second process sees only its documents
    second = lm.decode_queries([DOCS[i] for i in u], inv, qid[4:], 0, seed=2, **KW)
    assert first + second == whole
    # the stream is the query index and attempt, not the row: a redraw attempt gives another query
    assert lm.decode_queries(DOCS, rows, qid, 1, seed=2, **KW) != whole


def test_kill_and_resume_equals_uninterrupted(llama, tmp_path, monkeypatch):
    full = sample_run(llama, DOCS, DOC_IDS, tmp_path / "a", n_queries=10, seed=4, batch_size=4, progress=False, **KW)
    orig = llama.sample_queries

    def killed(*args, on_batch=None, **kw):
        def once(partial):
            on_batch(partial)
            raise KeyboardInterrupt  # the process dies after its first checkpoint

        return orig(*args, on_batch=once, **kw)

    monkeypatch.setattr(llama, "sample_queries", killed)
    with pytest.raises(KeyboardInterrupt):
        sample_run(llama, DOCS, DOC_IDS, tmp_path / "b", n_queries=10, seed=4, batch_size=4, progress=False, **KW)
    monkeypatch.undo()
    assert len(read_jsonl(tmp_path / "b" / "queries.partial.jsonl")) == 4
    # resumed with another batch size: neither changes the queries
    resumed = sample_run(llama, DOCS, DOC_IDS, tmp_path / "b", n_queries=10, seed=4, batch_size=3, progress=False,
                         **KW)
    assert resumed == full
    man = json.loads((tmp_path / "b" / "queries.manifest.json").read_text())
    assert man["sampler"] == SAMPLER_VERSION and "batch_size" not in man


def test_per_doc_queries_do_not_depend_on_the_batch_size(llama, tmp_path):
    a = read_jsonl(sample_per_doc_run(llama, DOCS, DOC_IDS, tmp_path / "a", n_per_doc=3, seed=1, batch_size=3,
                                      progress=False, **KW))
    b = read_jsonl(sample_per_doc_run(llama, DOCS, DOC_IDS, tmp_path / "b", n_per_doc=3, seed=1, batch_size=64,
                                      progress=False, **KW))
    assert a == b and [r["doc_id"] for r in a] == DOC_IDS
    # each document's prompt is prefilled once and shared by its 3 queries, which still differ
    assert sum(len(set(r["queries"])) > 1 for r in a) >= len(DOCS) - 1


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_greedy_equals_generate(family, llama, t5):
    lm = _lm(family, llama, t5)
    ids = lm.prompt_ids(DOCS)  # prompts of different lengths: left padding (causal) / right padding (T5)
    batch = lm._pad(ids, left=not lm.is_seq2seq)
    with torch.inference_mode():
        ref = lm.model.generate(**batch, do_sample=False, max_new_tokens=8, eos_token_id=lm._stop_ids(),
                                pad_token_id=lm.pad_id)
    ref = ref[:, batch["input_ids"].shape[1]:] if not lm.is_seq2seq else ref[:, 1:]
    B = len(ids)
    rows = torch.arange(B).repeat_interleave(2)  # every prompt shared by two rows
    out = lm.decoder().decode(ids, rows, torch.arange(2 * B), torch.zeros(2 * B, dtype=torch.long), seed=0,
                              max_new_tokens=8, top_k=1)
    torch.testing.assert_close(out[::2, :ref.shape[1]], ref, rtol=0, atol=0)
    torch.testing.assert_close(out[1::2], out[::2], rtol=0, atol=0)


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_reused_bucketed_caches_give_the_same_tokens(family, llama, t5):
    """The CUDA layout (cache lengths rounded up, one decode cache reused by every batch of a size), eagerly."""
    from gdr.lm.decode import Decoder

    lm = _lm(family, llama, t5)
    plain, bucketed = Decoder(lm, compile=False), Decoder(lm, compile=False, bucket=True)
    for docs in (DOCS[:4], DOCS[3:7], DOCS[:4]):  # same shapes: the second and third batch reuse the first's cache
        ids = lm.prompt_ids(docs)
        args = (ids, torch.arange(4), torch.arange(4) + 10, torch.zeros(4, dtype=torch.long))
        kw = dict(seed=3, max_new_tokens=7, top_k=50, top_p=0.99)
        torch.testing.assert_close(bucketed.decode(*args, **kw), plain.decode(*args, **kw), rtol=0, atol=0)
    assert len(bucketed._pool) == 1


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_the_cuda_bf16_decode_copy_runs_on_the_cpu(family, llama, t5):
    """On CUDA the Decoder samples from a bf16 copy of the weights (static caches then bf16 too): the same
    copy on the CPU, with the CUDA cache layout (bucketed, reused), gives well-formed queries and mostly the
    fp32 copy's first tokens (bf16 moves near-ties only)."""
    from gdr.lm.decode import Decoder

    lm = _lm(family, llama, t5)
    fp32, bf16 = Decoder(lm, compile=False, bucket=True), Decoder(lm, compile=False, bucket=True, dtype=torch.bfloat16)
    ids = lm.prompt_ids(DOCS[:4])
    args = (ids, torch.arange(4).repeat(2), torch.arange(8), torch.zeros(8, dtype=torch.long))
    kw = dict(seed=5, max_new_tokens=6, top_k=50, top_p=0.99)
    out, ref = bf16.decode(*args, **kw), fp32.decode(*args, **kw)
    assert out.shape == ref.shape == (8, 6) and out.dtype == torch.long
    assert int(out.min()) >= 0 and int(out.max()) < lm.model.config.vocab_size
    layers = bf16._pool[next(iter(bf16._pool))]
    layers = layers.self_attention_cache.layers if lm.is_seq2seq else layers.layers
    assert layers[0].keys.dtype == torch.bfloat16
    assert (out[:, 0] == ref[:, 0]).float().mean() >= 0.5


@pytest.mark.parametrize("family,compiled", [("llama", False), ("llama", True), ("t5", False)])
def test_decode_attention_copies_no_keys_and_values(family, compiled, llama, t5, repeat_kv_calls):
    """Grouped-query attention (the tiny Llama: 4 query heads over 2 key/value heads) runs without transformers'
    ``repeat_kv`` in the prefill and in every decode step, eager and compiled (dynamo, eager backend), with
    exactly the tokens of transformers' SDPA attention, which copies the keys and values (T5: nothing changes)."""
    import torch._dynamo

    from gdr.lm.decode import Decoder

    lm = _lm(family, llama, t5)
    ids = lm.prompt_ids(DOCS)
    args = (ids, torch.arange(7).repeat(2), torch.arange(14), torch.zeros(14, dtype=torch.long))
    kw = dict(seed=3, max_new_tokens=8, top_k=50, top_p=0.99)
    ours = Decoder(lm, compile=compiled)
    ours.compile_options = dict(backend="eager")
    torch._dynamo.reset()
    got = ours.decode(*args, **kw)
    assert repeat_kv_calls[0] == 0 and (not compiled or ours._step_ok)
    ref = Decoder(lm, compile=False, bucket=compiled)
    ref.model.set_attn_implementation("sdpa")  # transformers' attention (what decode ran before)
    want = ref.decode(*args, **kw)
    lm.model.set_attn_implementation(ours.model.config._attn_implementation)  # the fixture's model as it was
    assert (repeat_kv_calls[0] > 0) == (family == "llama")  # the counter sees transformers' copies
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_bf16_decode_attention_within_bf16_rounding(llama):
    """The CUDA configuration (a bf16 copy, bucketed caches): our grouped attention's next-token logits after
    the prefill and after a decode step are transformers' SDPA ones to bf16 rounding."""
    from gdr.lm.decode import Decoder

    ours, ref = (Decoder(llama, compile=False, bucket=True, dtype=torch.bfloat16) for _ in range(2))
    ref.model.set_attn_implementation("sdpa")
    rows, ids = torch.arange(7), llama.prompt_ids(DOCS)
    out = []
    for dec in (ours, ref):
        b = dec._prefill_causal(ids, rows, 4)
        tok = b.logits.argmax(-1)
        out.append((b.logits, dec._run_step(tok, b.pos, b, 0)))
    for a, r in zip(*out):
        torch.testing.assert_close(a, r, rtol=0, atol=2 ** -7 * float(r.abs().max()))  # two bf16 steps at the top


def test_compiled_step_traces_once_and_gives_the_same_tokens(llama):
    """The CUDA path's capture, traced by dynamo on the CPU (eager backend: no CUDA graphs, no C++ build):
    one graph for every batch of a shape (the reused decode cache), and the same tokens as the eager step."""
    import torch._dynamo

    from gdr.lm.decode import Decoder

    comp = Decoder(llama, compile=True)
    comp.compile_options = dict(backend="eager")
    assert comp.bucket
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for docs in (DOCS[:4], DOCS[3:7]):
        args = (llama.prompt_ids(docs), torch.arange(4), torch.arange(4), torch.zeros(4, dtype=torch.long))
        kw = dict(seed=1, max_new_tokens=5, top_k=50, top_p=0.99)
        torch.testing.assert_close(comp.decode(*args, **kw), llama.decoder().decode(*args, **kw), rtol=0, atol=0)
    assert comp.compile and comp._step_ok  # did not fall back to eager
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("top_k,top_p,temperature", [(50, 0.99, 1.0), (5, 1.0, 0.7), (0, 0.9, 1.3), (20, 0.5, 1.0),
                                                     (1, 0.99, 1.0)])
def test_filtering_equals_transformers_warpers(top_k, top_p, temperature):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 300, generator=g) * 3
    ref = logits.clone()
    ids = torch.zeros(16, 1, dtype=torch.long)
    if temperature != 1.0:
        ref = TemperatureLogitsWarper(temperature)(ids, ref)
    if top_k > 0:
        ref = TopKLogitsWarper(top_k)(ids, ref)
    if top_p < 1.0:
        ref = TopPLogitsWarper(top_p)(ids, ref)
    vals, idx = filter_logits(logits, top_k, top_p, temperature)
    ours = torch.full_like(logits, float("-inf")).scatter(1, idx, vals)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(ref))
    kept = torch.isfinite(ref)
    torch.testing.assert_close(ours[kept], ref[kept])
    assert 0 < kept.sum() < kept.numel()


def test_a_vanishing_temperature_decodes_greedily(llama):
    """temperature=1e-45 gave junk tokens (logits / T overflowed to inf - inf = NaN) while 1e-30
    gave the greedy output; every temperature below GREEDY_BELOW now gives the greedy queries, the limit T -> 0."""
    from gdr.lm.decode import GREEDY_BELOW

    args = (llama.prompt_ids(DOCS[:3]), torch.arange(3), torch.arange(3), torch.zeros(3, dtype=torch.long))

    def decode(temperature, top_k=0):
        return llama.decoder().decode(*args, seed=5, max_new_tokens=6, top_k=top_k, top_p=0.99,
                                      temperature=temperature)

    greedy = decode(1.0, top_k=1)
    assert torch.equal(decode(1e-20), greedy)  # the scaled logits still fit float32: already greedy
    for t in (GREEDY_BELOW / 2, 1e-38, 1e-45, 5e-324):
        assert torch.equal(decode(t), greedy), t


def _first_tokens_ours(lm, doc, n, temperature):
    out = lm.decoder().decode(lm.prompt_ids([doc]), torch.zeros(n, dtype=torch.long), torch.arange(n),
                              torch.zeros(n, dtype=torch.long), seed=11, max_new_tokens=1, top_k=5,
                              temperature=temperature)
    return out[:, 0]


def test_first_token_distribution_matches_generate():
    """Two-sample chi-square test of the first sampled token, ours vs `generate`, at fixed seeds."""
    from scipy.stats import chi2_contingency

    from gdr.lm import PromptConfig

    llama = tiny_llama(seed=1)
    llama.prompt = PromptConfig(style="prefix", prefix="", system=None, shots=[])  # short prompts: generate is fast
    with torch.no_grad():  # a peaked next-token distribution over the top 5
        llama.model.lm_head.weight.mul_(30)
    n = 2000
    batch = llama._pad(llama.prompt_ids([DOCS[1]]))
    torch.manual_seed(3)
    with torch.inference_mode():
        ref = llama.model.generate(**batch, do_sample=True, top_k=5, top_p=1.0, max_new_tokens=1,
                                   num_return_sequences=n, pad_token_id=llama.pad_id)[:, -1]

    def p_value(ours):
        cats = torch.unique(torch.cat([ours, ref]))
        table = np.array([[int((x == c).sum()) for c in cats] for x in (ours, ref)])
        return chi2_contingency(table)[1]

    same = p_value(_first_tokens_ours(llama, DOCS[1], n, 1.0))
    colder = p_value(_first_tokens_ours(llama, DOCS[1], n, 0.5))  # the test has the power to tell them apart
    assert same > 0.01, same
    assert colder < 1e-6, colder


@pytest.mark.parametrize("runner", ["queries", "per_doc"])
def test_older_sampler_folder_is_refused_in_one_line(llama, tmp_path, runner):
    kw = dict(seed=0, batch_size=4, progress=False, **KW)
    if runner == "queries":
        sample_run(llama, DOCS, DOC_IDS, tmp_path, n_queries=3, **kw)
        name, files = "queries.manifest.json", "queries.*"
        again = lambda: sample_run(llama, DOCS, DOC_IDS, tmp_path, n_queries=3, **kw)  # noqa: E731
    else:
        sample_per_doc_run(llama, DOCS, DOC_IDS, tmp_path, n_per_doc=1, **kw)
        name, files = "doc_queries.manifest.json", "doc_queries.*"
        again = lambda: sample_per_doc_run(llama, DOCS, DOC_IDS, tmp_path, n_per_doc=1, **kw)  # noqa: E731
    man = json.loads((tmp_path / name).read_text())
    del man["sampler"], man["provenance"]  # as written by the hf-generate sampler, before versions
    write_manifest(tmp_path, name, **man)
    with pytest.raises(FileExistsError) as e:
        again()
    msg = str(e.value)
    assert "\n" not in msg and "hf-generate" in msg and SAMPLER_VERSION in msg
    assert f"delete {files}" in msg and "out=" in msg


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_auto_batch_size(family, llama, t5):
    lm = _lm(family, llama, t5)
    assert lm.auto_batch_size() == 64  # on a CPU: the measured best
    sizes = [lm.batch_for_memory(free) for free in (1e6, 1e8, 1e9, 1e12)]
    assert sizes == sorted(sizes) and sizes[0] >= 1 and sizes[-1] == 1024
    assert sizes[1] < 1024


def test_gdr_run_keys_the_score_stage_by_sampler_not_batch_size():
    """`gdr run` re-samples into a new stage folder when the sampler changes; a batch size alone does not."""
    from dataclasses import replace

    from gdr.config import load_config
    from gdr.pipeline import run_settings, score_inputs

    settings = run_settings(load_config("run", ["sample.n_queries=4", "sample.seed=0", "sample.batch_size=8"]))
    settings = replace(settings, lm=settings.lm.resolved(name="m"))
    a = score_inputs(settings, {"n_docs": 3})
    assert score_inputs(replace(settings, sample=settings.sample.resolved(batch_size="auto")), {"n_docs": 3}) == a
    assert a["sampler"] == SAMPLER_VERSION and "batch_size" not in a["sample"]


def _killed_after_first_batch(lm, monkeypatch):
    """``lm.sample_queries`` dies after its first checkpoint (as a killed process would)."""
    orig = lm.sample_queries

    def killed(*args, on_batch=None, **kw):
        def once(partial):
            on_batch(partial)
            raise KeyboardInterrupt

        return orig(*args, on_batch=once, **kw)

    monkeypatch.setattr(lm, "sample_queries", killed)


def test_a_folder_decoded_in_bf16_is_not_resumed_or_reused_in_fp32(tmp_path, monkeypatch):
    """The CUDA decode (a bf16 copy of the weights) run on the CPU through the production path, killed after a
    batch, then resumed by an fp32 decoder: refused in one line naming both, nothing mixed; finished in bf16,
    then reused in fp32: refused too."""
    from gdr.lm.decode import Decoder
    from gdr.store import Q_PARTIAL

    lm = tiny_llama()
    lm._decoder = Decoder(lm, dtype=torch.bfloat16)  # what CUDA decodes in
    kw = dict(n_queries=8, seed=4, batch_size=4, progress=False, **KW)
    _killed_after_first_batch(lm, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        sample_run(lm, DOCS, DOC_IDS, tmp_path / "a", **kw)
    monkeypatch.undo()
    man = json.loads((tmp_path / "a" / "queries.manifest.json").read_text())
    assert man["numerics"] == {"device": "cpu", "dtype": "bfloat16", "decode": "eager"}
    partial = (tmp_path / "a" / Q_PARTIAL).read_text()
    fp32 = tiny_llama()
    with pytest.raises(FileExistsError, match=r"decoded on cpu, bfloat16, eager decode, this run decodes on cpu, "
                                              r"float32, eager decode") as e:
        sample_run(fp32, DOCS, DOC_IDS, tmp_path / "a", **kw)
    assert "\n" not in str(e.value)
    assert (tmp_path / "a" / Q_PARTIAL).read_text() == partial  # the bf16 queries are left as they were
    finished = sample_run(lm, DOCS, DOC_IDS, tmp_path / "a", **kw)  # resumed in bf16: fine
    assert len(finished) == 8
    with pytest.raises(FileExistsError, match="decoded on cpu, bfloat16"):
        sample_run(fp32, DOCS, DOC_IDS, tmp_path / "a", **kw)


def test_the_decode_path_is_chosen_for_the_folder_not_for_the_queries_left(tmp_path, monkeypatch, patch_where_bound):
    """compile=auto compiles work of at least compile_min_queries queries. A run of 10 (compiled) killed after
    4 resumes with 6 left: still compiled (the folder's path, recorded as its numerics), not eager. ``auto``
    compiles only on CUDA: here the CUDA rule is applied on the CPU, the step traced with the eager backend."""
    from gdr.lm import compiling

    real = compiling.want_compile
    patch_where_bound("gdr.lm.compiling.want_compile", lambda s, d, n, m="auto": real(s, "cuda", n, m))
    lm = tiny_llama()
    lm.decoder().compile_options = dict(backend="eager")
    kw = dict(n_queries=10, seed=4, batch_size=4, progress=False, compile="auto", compile_min_queries=8, **KW)
    _killed_after_first_batch(lm, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        sample_run(lm, DOCS, DOC_IDS, tmp_path, **kw)
    monkeypatch.setattr(lm, "sample_queries", type(lm).sample_queries.__get__(lm))
    sample_run(lm, DOCS, DOC_IDS, tmp_path, **kw)
    man = json.loads((tmp_path / "queries.manifest.json").read_text())
    assert man["numerics"]["decode"] == "compiled" and man["compile_last_call"]["compiled"] is True


def test_per_document_queries_of_another_dtype_are_refused(tmp_path):
    """doc_queries.jsonl records its numerics too: generated by the bf16 decode, then asked of an fp32 one:
    refused in one line, the file left as it was."""
    from gdr.lm.decode import Decoder

    lm = tiny_llama()
    lm._decoder = Decoder(lm, dtype=torch.bfloat16)
    kw = dict(n_per_doc=2, seed=1, batch_size=4, progress=False, **KW)
    path = sample_per_doc_run(lm, DOCS, DOC_IDS, tmp_path, **kw)
    before = path.read_text()
    assert json.loads((tmp_path / "doc_queries.manifest.json").read_text())["numerics"]["dtype"] == "bfloat16"
    with pytest.raises(FileExistsError, match="doc_queries.manifest.json: these queries were decoded on cpu, "
                                              "bfloat16, eager decode, this run decodes on cpu, float32"):
        sample_per_doc_run(tiny_llama(), DOCS, DOC_IDS, tmp_path, **kw)
    assert path.read_text() == before


def test_the_sampling_bar_moves_within_a_batch(llama, monkeypatch):
    """One batch of every query (`sample.batch_size` >= J, as `auto` gives on a GPU): the bar advances with the
    decode steps, not from 0% to 100% when the batch ends; the queries are those of a run without a bar."""
    import gdr.lm.sampling as sampling

    shown: list[int] = []

    class Bar:  # tqdm's interface as sample_queries uses it, recording each position
        def __init__(self, total, initial=0, **kw):
            self.n, self.total = initial, total

        def update(self, k):
            self.n += k
            shown.append(self.n)

        def close(self):
            pass

    monkeypatch.setattr(sampling, "tqdm", Bar)
    kw = {**KW, "max_new_tokens": 8}
    got = llama.sample_queries(DOCS, 12, seed=5, batch_size=64, progress=True, **kw)
    assert got.texts == llama.sample_queries(DOCS, 12, seed=5, batch_size=64, progress=False, **kw).texts
    assert shown[-1] == 12 and [x for x in shown if 0 < x < 12], shown  # positions inside the one batch
    assert shown == sorted(shown)


def test_queries_cut_at_max_new_tokens_are_recorded_kept_on_resume_and_scored_without_an_end(tmp_path, monkeypatch):
    """A query the model ended (a stop id within max_new_tokens) and one cut there are told apart in queries.jsonl
    (``cut``), across a kill and resume, and P scores the cut ones without an end term; a P scored with every
    query taken as ended is another P (refused in that folder)."""
    from gdr.stages.score import score_run

    lm = tiny_llama()
    stop = [lm.eos_id, *range(2000, 5000)]  # ~10% of the vocabulary: a mix of ended and cut 6-token queries
    monkeypatch.setattr(lm, "_stop_ids", lambda: sorted(stop))
    run = dict(n_queries=24, seed=3, progress=False, **KW)
    full = sample_run(lm, DOCS, DOC_IDS, tmp_path / "a", batch_size=8, **run)
    cut = np.array([bool(r.get("cut")) for r in full])
    assert 0 < cut.sum() < len(cut) and set().union(*full) <= {"qid", "text", "source_doc_id", "source_index", "cut"}
    # the decode loop's own tokens (query j: a uniform draw of its document, random stream j): a cut query's row
    # holds no stop id, an ended one's does
    src = np.random.default_rng(3).integers(0, len(DOCS), size=24)
    raw = lm.decoder().decode(lm.prompt_ids(DOCS), torch.as_tensor(src), torch.arange(24),
                              torch.zeros(24, dtype=torch.long), seed=3, **KW).numpy()
    assert np.array_equal(cut, ~np.isin(raw, stop).any(1))
    assert json.loads((tmp_path / "a" / "queries.manifest.json").read_text())["n_cut"] == cut.sum()

    orig = lm.sample_queries
    _killed_after_first_batch(lm, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        sample_run(lm, DOCS, DOC_IDS, tmp_path / "b", batch_size=8, **run)
    monkeypatch.setattr(lm, "sample_queries", orig)
    assert sample_run(lm, DOCS, DOC_IDS, tmp_path / "b", batch_size=5, **run) == full

    texts = [r["text"] for r in full]
    score_run(lm, DOCS, DOC_IDS, texts, tmp_path / "a", progress=False, ended=~cut)
    P = np.load(tmp_path / "a" / "P.npy")
    np.testing.assert_array_equal(P, lm.score(DOCS, texts, doc_batch_size=1, progress=False, ended=~cut))
    as_ended = lm.score(DOCS, texts, doc_batch_size=1, progress=False)
    assert (P[:, cut] > as_ended[:, cut]).all()
    np.testing.assert_allclose(P[:, ~cut], as_ended[:, ~cut], atol=1e-4, rtol=0)  # packed beside shorter queries
    with pytest.raises(FileExistsError, match="belongs to a different P matrix .*cut_hash"):
        score_run(lm, DOCS, DOC_IDS, texts, tmp_path / "a", progress=False)


def test_a_causal_query_ends_at_any_token_that_ends_a_line(monkeypatch):
    """A query is one line: a causal model's stop ids are its end token and every token that holds a line break
    ("\\n\\n", " \\n", "\\r\\n", "x\\n", ...), not "\\n" alone. A seq2seq model stops at its end token only."""
    texts = ["a", "\n", "\n\n", " \n", "x\n", "\r\n", "\t\n  ", "b c", "\n.", "", " "]

    class Vocab:
        def __len__(self):
            return len(texts)

        def batch_decode(self, ids):
            return [texts[int(i[0])] for i in ids]

    assert line_end_ids(Vocab()) == [1, 2, 3, 4, 5, 6, 8]
    # a fast tokenizer is read by its own decoder: the same ids as transformers' decode
    fast = tokenizer()
    fast.add_tokens([AddedToken(t, normalized=False) for t in ("\n\n", " \n", "x\n")])
    added = fast.convert_tokens_to_ids(["\n\n", " \n", "x\n"])
    assert line_end_ids(fast) == added == [i for i, t in enumerate(fast.batch_decode(
        [[i] for i in range(len(fast))])) if "\n" in t or "\r" in t]
    lm = tiny_llama()
    # a line-break token the tokenizer added past the model's vocabulary is never drawn: not a stop id, and P's end
    # term (the stop ids' logits) is computed without it
    lm.tokenizer.add_tokens([AddedToken("\n\n", normalized=False)])
    assert lm.tokenizer.convert_tokens_to_ids("\n\n") == lm.model.config.vocab_size
    assert lm._stop_ids() == [lm.eos_id]
    assert np.isfinite(lm.score(DOCS[:2], ["cat", "oil prices"], ended=[True, True], progress=False)).all()
    # the same tokenizer with a model whose output layer holds that token: it stops there
    lm.model.resize_token_embeddings(lm.model.config.vocab_size + 1)
    assert lm._stop_ids() == sorted({lm.eos_id, lm.tokenizer.convert_tokens_to_ids("\n\n")})
    monkeypatch.setattr(lm, "tokenizer", Vocab())
    assert lm._stop_ids() == sorted({lm.eos_id, 1, 2, 3, 4, 5, 6, 8})
    monkeypatch.setattr(lm, "is_seq2seq", True)
    assert lm._stop_ids() == [lm.eos_id]
