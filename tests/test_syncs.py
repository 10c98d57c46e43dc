"""No host syncs in steady state: one decode step, one scoring doc batch, one training step, one beam-search
step, each counted by :class:`syncs.SyncCounter` on the CPU through the production code, in the configuration
CUDA uses (bf16 compute, flex attention, fused AdamW under bf16 autocast, the CUDA stop-test interval).

A unit's count is the difference of two runs that differ by that unit (more decode steps, more doc batches,
longer docids), so what happens once per call (prefill, loading the batch) is not counted against it.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from syncs import SyncCounter
from test_retriever import WORDS, tiny_config, toy_corpus, word_tokenizer  # noqa: F401 - a fixture
from tiny_models import DOCS, QUERIES


# ----------------------------------------------------------------------------- the counter itself
@pytest.mark.parametrize("what, syncs", [
    (lambda x: bool(x.all()), 1),  # is_nonzero / _local_scalar_dense
    (lambda x: x.sum().item(), 1),
    (lambda x: x.tolist(), 1),
    (lambda x: x.cpu().numpy(), 1),  # one copy; .numpy() of the host copy is free
    (lambda x: x[x > 0], 1),  # boolean index: nonzero inside
    (lambda x: x.nonzero(), 1),
    (lambda x: torch.unique(x), 1),
    (lambda x: torch.repeat_interleave(x.long()), 1),  # output size read from the device
    (lambda x: torch.repeat_interleave(x.long(), output_size=3), 0),
    (lambda x: torch.tensor([1, 2], device=x.device), 1),  # a synchronous upload
    (lambda x: torch.tensor([1, 2]).to(x.device), 1),
    (lambda x: torch.tensor([1, 2]).to(x.device, non_blocking=True), 0),
    (lambda x: x[torch.tensor([0, 1])], 1),  # a host index of a device tensor: copied synchronously
    (lambda x: x.new_tensor([1.0]), 1),
    (lambda x: torch.full((2, 3), 0).to(x.device), 1),  # a host buffer (no device=) uploaded
    (lambda x: (x * 2 + torch.zeros(3, device=x.device)).softmax(0).argmax(), 0),  # device work only
    (lambda x: torch.tensor([1.0, 2.0]).sum().item(), 0),  # host data read on the host
    (lambda x: torch.arange(3).tolist(), 0),
    (lambda x: torch.tensor([], device=x.device), 0),  # copying nothing waits for nothing
])
def test_the_counter_counts_what_would_sync_on_cuda(what, syncs):
    x = torch.ones(3)  # made before the region: a device tensor
    with SyncCounter() as c:
        what(x)
    assert c.count == syncs, c


def test_the_counter_sees_syncs_inside_inference_mode_and_flex_attention():
    import torch.nn.attention.flex_attention as flex  # looked up at call time, as gdr.lm.scoring does

    q = torch.randn(1, 2, 128, 8)
    mask = flex.create_block_mask(lambda b, h, i, j: j <= i, 1, None, 128, 128, device="cpu")
    with SyncCounter() as c, torch.inference_mode():
        out = flex.flex_attention(q, q, q, block_mask=mask)
        bool(out.isfinite().all())
    assert c.count == 1 and "is_nonzero" in str(c), c


# ----------------------------------------------------------------------------- the four units
def _per_unit(run, small, large, units: int) -> tuple[float, SyncCounter]:
    """Syncs per unit: (count of ``run(large)`` - count of ``run(small)``) / units, after a warm-up of both
    (what happens once per shape, such as allocating a decode cache, is not steady state)."""
    run(small)
    run(large)
    counts = {}
    for arg in (small, large):
        with SyncCounter() as c:
            run(arg)
        counts[arg] = c
    return (counts[large].count - counts[small].count) / units, counts[large]


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_a_decode_step_makes_no_host_sync(family, request, monkeypatch):
    """Sampling at CUDA's stop-test interval: no sync per decode step but the all-finished test every
    ``stop_check_every(cuda) >= 8`` steps. A step is counted from one call of the model step to the next
    (sampling, the stop test, the model). The syncs this keeps out: an all-finished test at every step, and on T5
    transformers reading the 2D encoder mask at every step."""
    from gdr.lm.decode import stop_check_every

    lm = request.getfixturevalue(family)
    dec = lm.decoder()
    k = stop_check_every(torch.device("cuda"))
    assert k >= 8 and stop_check_every(torch.device("cpu")) == 1
    docs, rows = DOCS[:3], np.array([0, 1, 2, 0])
    kw = dict(seed=0, top_k=0, top_p=1.0)
    ref = lm.decode_queries(docs, rows, np.arange(4), 0, max_new_tokens=20, **kw)
    monkeypatch.setattr(dec, "check_every", k)
    assert lm.decode_queries(docs, rows, np.arange(4), 0, max_new_tokens=20, **kw) == ref  # the same queries
    monkeypatch.setattr(dec, "stop", torch.tensor([-1]))  # no row ever stops: every step runs
    marks, step = [], dec._run_step

    def marked(*a, **kwargs):
        marks.append(c.count)
        return step(*a, **kwargs)

    monkeypatch.setattr(dec, "_run_step", marked)
    with SyncCounter() as c:
        lm.decode_queries(docs, rows, np.arange(4), 0, max_new_tokens=5 * k, **kw)
    per_step = np.diff(marks)  # (5k - 2,) syncs between two model steps
    assert len(per_step) == 5 * k - 2 and per_step.max() <= 1 and per_step.sum() <= len(per_step) / k, \
        f"{per_step.sum()} syncs in {len(per_step)} decode steps, want 1 every {k}: {c}"


@pytest.mark.parametrize("family, attention", [("llama", "flex"), ("llama", "dense"), ("t5", "dense")])
def test_a_scoring_doc_batch_makes_one_host_sync_its_results(family, attention, request):
    """bf16 copy (CUDA's compute dtype), several query chunks per doc batch: one sync per doc batch, the copy
    of its log-probs to the host. The syncs this keeps out: an upload per chunk and per doc batch, transformers
    reading the prompt mask, a device-side repeat_interleave without its size, T5's boolean indexing."""
    lm = request.getfixturevalue(family)

    def score(n_docs):
        lm.score(DOCS[:n_docs], QUERIES, doc_batch_size=2, max_query_tokens=8, progress=False,
                 compute_dtype=torch.bfloat16, attention=attention)

    per_batch, c = _per_unit(score, 2, 6, 2)
    assert per_batch == 1, f"{per_batch} syncs per scoring doc batch, want 1 (its results): {c}"


@pytest.mark.parametrize("protocol", [False, True], ids=["default", "pawa-rdrop-corrupted"])
def test_a_training_step_makes_no_host_sync(tmp_path, word_tokenizer, protocol):  # noqa: F811 - the fixture
    """train() with what CUDA chooses (bf16-mixed autocast, fused AdamW, gradient clipping), on the CPU: no sync
    in a steady-state step (forward, backward, clipping, optimizer step), so none from transformers reading the
    2D padding mask in the encoder or in the decoder's cross-attention; also for the retriever the BBC protocol
    trains (the PAWA decoder, R-drop 0.15: its KL over the labelled docid positions is masked, not indexed; its
    second view NCI's corrupted query, with input dropout decided by a coin on the device)."""
    import pytorch_lightning as pl

    from gdr.training.train import ExampleOptions, OptimOptions, TrainerOptions, train

    class Count(pl.Callback):
        def __init__(self):
            self.steps: list[SyncCounter] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.c = SyncCounter().__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.c.__exit__(None, None, None)
            self.steps.append(self.c)

    doc_ids, texts, codes = toy_corpus(20)
    count = Count()
    train(tmp_path, tiny_config(word_tokenizer, pawa=protocol, dropout=0.1 if protocol else 0.0), doc_ids, codes,
          train_queries=texts * 2, train_rel=[[i] for i in range(20)] * 2,
          examples=ExampleOptions(dev_fraction=0.0, doc_first=False, doc_windows=0),
          optim=OptimOptions(warmup_steps=2, fused=True, consistency_weight=0.15 if protocol else 0.0,
                             consistency_view="corrupted" if protocol else "dropout"),
          trainer_opts=TrainerOptions(max_steps=4, batch_size=20, accelerator="cpu", precision="bf16-mixed",
                                      gradient_clip_val=1.0, enable_progress_bar=False, tensorboard=False,
                                      resume=False), callbacks=[count])
    steady = count.steps[1:]  # the first step also creates the optimizer state
    assert len(steady) == 3 and all(c.count == 0 for c in steady), [str(c) for c in steady]


@pytest.mark.parametrize("pawa", [False, True], ids=["default", "pawa"])
def test_a_beam_search_step_makes_no_host_sync(word_tokenizer, pawa):  # noqa: F811 - the fixture
    """Constrained beam search under CUDA's bf16 autocast: no sync in a step, none in the whole search (its
    encoder pass included), so the cross-attention mask is never read on the host; also with the PAWA decoder the
    BBC protocol's retrievers search with (its GRU state carried and reordered with the beams)."""
    from gdr.indexing.trie import build_trie
    from gdr.training.model import GenerativeRetriever, load_tokenizer
    from gdr.training.search import constrained_beam_search

    torch.manual_seed(0)
    model = GenerativeRetriever.build(tiny_config(word_tokenizer, K=3, L=4, pawa=pawa)).eval()
    enc = load_tokenizer(word_tokenizer)(["apple river stone", "cloud", "tiger piano"], padding=True,
                                         return_tensors="pt")
    rng = np.random.default_rng(0)
    tries = {L: build_trie(sorted({tuple(map(int, c)) for c in rng.integers(0, 3, (40, L))}), n_digits=3)
             for L in (2, 4)}

    def search(L):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            constrained_beam_search(model, enc["input_ids"], enc["attention_mask"], tries[L], beam=5, k=5)

    per_step, c = _per_unit(search, 2, 4, 2)  # L + 1 steps each
    assert per_step == 0 and c.count == 0, f"{per_step} syncs per beam step: {c}"
