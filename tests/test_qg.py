"""gdr qg: fine-tuning a query generator (training/qg.py, gdr/cli/qg.py) with tiny random-init models."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gdr.lm import GENERATOR_FILE, GenerativeLM, PromptConfig
from gdr.stages.settings import QGQueries, QGSection, section_from
from gdr.training.qg import QGModule, QGOptions, QGPairs, _collate, fine_tune_qg, freeze_below, split_pairs
from tests.tiny_models import DOCS, QUERIES, saved_tiny_llama, tiny_llama, tiny_t5

FAST = dict(max_epochs=100, batch_size=4, eval_batch_size=4, warmup_steps=0, enable_progress_bar=False,
            accelerator="cpu", devices=1, log_every_n_steps=1, checkpoint_every_n_steps=1)


def _pairs(n_copies: int = 4) -> QGPairs:
    docs, queries, ids = [], [], []
    for c in range(n_copies):
        for i, (d, q) in enumerate(zip(DOCS, QUERIES)):
            docs.append(d), queries.append(q), ids.append(f"d{c}-{i}")
    return QGPairs(docs, queries, ids)


@pytest.mark.parametrize("make", [tiny_llama, tiny_t5], ids=["causal", "seq2seq"])
def test_training_loss_is_eq1_of_the_scorer(make):
    """The loss trains exactly what `score` measures: summed NLL of a pair == -log p(query | doc)."""
    lm = make()
    pairs = _pairs(1)
    batch = _collate(lm.pad_id, lm.is_seq2seq)(
        [(np.asarray(p), np.asarray(q)) for p, q in zip(lm.prompt_ids(pairs.docs), lm.query_ids(pairs.queries))])
    module = QGModule(lm.model, 1e-3, 0.0, 0, lm.is_seq2seq)
    with torch.no_grad():
        nll, n = module._token_nll(batch)
    want = -np.diag(lm.score(pairs.docs, pairs.queries, progress=False))
    np.testing.assert_allclose(nll.numpy(), want, rtol=1e-4, atol=1e-3)
    assert n.tolist() == [len(q) for q in lm.query_ids(pairs.queries)]


def test_split_pairs_by_document():
    p = QGPairs(["x"] * 60, [f"q{i}" for i in range(60)], [f"doc{i // 3}" for i in range(60)])  # 3 pairs per doc
    tr, dev = split_pairs(p, 0.3, seed=1)
    assert len(tr) + len(dev) == 60 and len(dev) > 0
    assert not {p.doc_ids[i] for i in tr} & {p.doc_ids[i] for i in dev}
    tr2, dev2 = split_pairs(p, 0.3, seed=1)
    assert tr.tolist() == tr2.tolist() and dev.tolist() == dev2.tolist()
    tr3, dev3 = split_pairs(p, 0.3, seed=1, dev_max=4)
    assert len(dev3) <= 4 and not {p.doc_ids[i] for i in tr3} & {p.doc_ids[i] for i in dev3}
    with pytest.raises(ValueError, match="dev_fraction"):
        split_pairs(p, 1.0)


def test_freeze_below_trains_only_the_top_block():
    lm = tiny_llama()
    counts = freeze_below(lm.model, 1)
    trainable = {n for n, q in lm.model.named_parameters() if q.requires_grad}
    assert trainable and all(n.startswith("model.layers.1.") or n == "model.norm.weight" for n in trainable)
    assert "model.norm.weight" in trainable and counts["trainable"] < counts["total"]
    with pytest.raises(ValueError, match="has 2 blocks"):
        freeze_below(lm.model, 3)


def test_fine_tune_raises_logp_exports_with_its_prompt_and_resumes(tmp_path):
    lm = tiny_llama(seed=3)
    pairs = _pairs(4)
    before = np.diag(lm.score(pairs.docs, pairs.queries, progress=False)).mean()
    frozen = {n: q.detach().clone() for n, q in lm.model.named_parameters() if n.startswith("model.layers.0.")}
    res = fine_tune_qg(tmp_path / "qg", lm, pairs, QGOptions(lr=1e-2, max_steps=6, train_layers=1, **FAST),
                       dev_fraction=0.25, seed=0)
    assert res.global_step == 6 and res.n_dev > 0 and res.n_train + res.n_dev == len(pairs)
    assert res.dev_loss is not None and res.dev_loss < res.dev_loss_before
    for n, q in lm.model.named_parameters():  # frozen block untouched
        if n in frozen:
            assert torch.equal(q.detach(), frozen[n])
    lm.model.eval()
    after = lm.score(pairs.docs, pairs.queries, progress=False)
    assert np.diag(after).mean() > before + 1.0
    # The export loads by path with the prompt it was trained with, whatever the caller passes.
    meta = json.loads((res.model_dir / GENERATOR_FILE).read_text())
    assert meta["prompt"]["system"] == lm.prompt.system and meta["family"] == "causal"
    other = PromptConfig(style="chat", system="something else", shots=[])
    loaded = GenerativeLM(str(res.model_dir), prompt=other, max_doc_tokens=lm.max_doc_tokens, device="cpu")
    assert loaded.prompt == lm.prompt
    np.testing.assert_allclose(loaded.score(pairs.docs, pairs.queries, progress=False), after, rtol=1e-5, atol=1e-4)
    # Resume: a second call with a larger budget continues from last.ckpt; the "before" figure is kept.
    lm2 = tiny_llama(seed=3)
    res2 = fine_tune_qg(tmp_path / "qg", lm2, pairs, QGOptions(lr=1e-2, max_steps=9, train_layers=1, **FAST),
                        dev_fraction=0.25, seed=0)
    assert res2.global_step == 9 and res2.dev_loss_before == res.dev_loss_before


def test_fine_tune_seq2seq_and_same_seed_same_model(tmp_path):
    runs = []
    for k in range(2):
        lm = tiny_t5(seed=1)
        res = fine_tune_qg(tmp_path / f"r{k}", lm, _pairs(2), QGOptions(lr=1e-2, max_steps=3, **FAST),
                           dev_fraction=0.0, seed=5)
        assert res.dev_loss is None and res.global_step == 3
        runs.append(lm.score(DOCS[:3], QUERIES[:3], progress=False))
    np.testing.assert_array_equal(runs[0], runs[1])


def test_bf16_true_fine_tune_keeps_rotary_fp32(tmp_path):
    """``trainer.precision=bf16-true`` casts the whole module, rotary frequencies included; the QG module puts
    them back to fp32 before it trains or validates (the weights stay bf16, as asked)."""
    seen = []

    class Spy(__import__("pytorch_lightning").Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append({n: b.dtype for n, b in module.model.named_buffers() if "inv_freq" in n})
            seen.append({"weights": next(module.model.parameters()).dtype})

    lm = tiny_llama(seed=2)
    fine_tune_qg(tmp_path / "qg", lm, _pairs(1), QGOptions(lr=1e-3, max_steps=1, precision="bf16-true", **FAST),
                 dev_fraction=0.25, seed=0, callbacks=[Spy()])
    assert seen == [dict.fromkeys(["model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"], torch.float32),
                    {"weights": torch.bfloat16}]


def test_saved_generator_file_is_checked(tmp_path):
    from gdr.lm import saved_generator

    (tmp_path / GENERATOR_FILE).write_text('{"prompt": {"style": "chat", "nope": 1}}')
    with pytest.raises(ValueError, match="not a valid gdr generator file"):
        saved_generator(str(tmp_path))
    assert saved_generator(str(tmp_path / "absent")) is None


def test_pairs_jsonl_errors_name_the_line(tmp_path):
    from gdr.stages.qg import read_pairs_jsonl

    f = tmp_path / "p.jsonl"
    f.write_text('{"doc": "a b c", "query": "a"}\n\n{"doc": "x", "query": ""}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:3: needs a non-empty string \"query\""):
        read_pairs_jsonl(str(f))
    f.write_text('{"doc": "a b c", "query": "a"}\n{"doc_id": "7", "query": "q"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl:2: needs \"doc\""):
        read_pairs_jsonl(str(f))
    f.write_text('{"doc": "a b c", "query": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="p.jsonl:2: not JSON"):
        read_pairs_jsonl(str(f))
    f.write_text('{"doc": "a b c", "query": " a "}\n')
    p = read_pairs_jsonl(str(f))
    assert p.queries == ["a"] and p.docs == ["a b c"] and p.doc_ids == ["p.jsonl:1"]
    # doc_id lines: the corpus is loaded once, at the first such line, and unknown ids are named
    from types import SimpleNamespace

    loads = []

    def load():
        loads.append(1)
        return SimpleNamespace(name="toy", doc_ids=["7", "8"], model_inputs=lambda: ["seven", "eight"])
    f.write_text('{"doc": "x y", "query": "a"}\n{"doc_id": "8", "query": "b"}\n{"doc_id": 7, "query": "c"}\n')
    p = read_pairs_jsonl(str(f), load_corpus=load)
    assert p.docs == ["x y", "eight", "seven"] and p.doc_ids == ["p.jsonl:1", "8", "7"] and loads == [1]
    f.write_text('{"doc_id": "9", "query": "b"}\n')
    with pytest.raises(ValueError, match="p.jsonl:1: doc_id '9' is not in the corpus 'toy'"):
        read_pairs_jsonl(str(f), load_corpus=load)


def test_gdr_qg_command_end_to_end(tmp_path, capsys):
    from gdr.cli import main

    base = saved_tiny_llama(tmp_path / "base", seed=2)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"doc": d, "query": q, "doc_id": f"d{c}-{i}"}) + "\n"
                             for c in range(3) for i, (d, q) in enumerate(zip(DOCS, QUERIES))))
    out = tmp_path / "out"
    rc = main(["qg", f"qg.pairs={pairs}", f"model.name={base}", "model.max_doc_tokens=24", f"out={out}",
               "qg.train.max_steps=2", "qg.train.max_epochs=5", "qg.train.batch_size=4", "qg.dev_fraction=0.3",
               "device=cpu", "progress=false", "qg.train.accelerator=cpu", "qg.lowercase=true"])
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["global_step"] == 2 and last["n_dev"] > 0
    man = json.loads((out / "qg.manifest.json").read_text())
    assert man["prompt"]["shots"] == [] and man["pairs"]["pairs"] == 18
    assert (out / "qg.config.yaml").exists() and (out / "model" / GENERATOR_FILE).exists()
    lm = GenerativeLM(str(out / "model"), max_doc_tokens=24, device="cpu")
    assert lm.prompt.shots == [] and np.isfinite(lm.score(DOCS[:2], QUERIES[:2], progress=False)).all()


def test_gdr_qg_refuses_eval_splits_and_bad_sources(capsys):
    from gdr.cli import main

    assert main(["qg", "qg.pairs=queries", "queries.split=test"]) == 2
    assert "queries.split=test" in capsys.readouterr().err
    assert main(["qg", "qg.pairs=nope.jsonl"]) == 2
    assert "qg.pairs=nope.jsonl" in capsys.readouterr().err


def test_title_pairs_exclude_r2_from_r5():
    """Real data: R5 title pairs minus every R2 story (and so its title)."""
    from gdr.config import load_config, to_container
    from gdr.data import load_corpus
    from gdr.stages.qg import build_pairs

    cfg = to_container(load_config("qg", ["data=r5", "qg.exclude=[r2]"]))
    pairs, info = build_pairs(section_from(QGSection, cfg["qg"], "qg"), cfg["data"],
                              section_from(QGQueries, cfg["queries"], "queries"), cfg["seed"])
    r2 = set(load_corpus("r2").doc_ids)
    assert len(pairs) > 500 and not r2 & set(pairs.doc_ids)
    r5 = load_corpus("r5")
    title = dict(zip(r5.doc_ids, r5.titles))
    text = dict(zip(r5.doc_ids, r5.texts))
    assert all(title[d] == q and text[d] == doc for d, q, doc in zip(pairs.doc_ids[:50], pairs.queries, pairs.docs))
    assert info["excluded_docs"] == len(r2) and info["pairs"] == len(pairs)


def test_query_pairs_use_the_train_split_only():
    """Real data: Cranfield pairs come from its train queries, one per (query, relevant document)."""
    from gdr.config import load_config, to_container
    from gdr.data import load_queries
    from gdr.stages.qg import build_pairs

    cfg = to_container(load_config("qg", ["data=cranfield", "qg.pairs=queries"]))
    pairs, info = build_pairs(section_from(QGSection, cfg["qg"], "qg"), cfg["data"],
                              section_from(QGQueries, cfg["queries"], "queries"), cfg["seed"])
    qs = load_queries("cranfield")
    train, held = qs.filter("train"), [qs.filter(s) for s in qs.split_names if s != "train"]
    assert len(pairs) == sum(len(r) for r in train.relevant) and set(pairs.queries) <= set(train.texts)
    assert not set(pairs.queries) & {t for h in held for t in h.texts}
    assert info["source"] == "queries" and info["documents"] == len(set(pairs.doc_ids))


class _Kill(Exception):
    pass


class _KillAt:
    """Lightning callback that dies after optimiser step ``step`` (a stand-in for kill -9 after a checkpoint)."""

    def __new__(cls, step):
        import pytorch_lightning as pl

        class K(pl.Callback):
            def on_train_batch_end(self, trainer, *args):
                if trainer.global_step == step:
                    raise _Kill()
        return K()


def test_killed_fine_tune_resumes_to_the_uninterrupted_model(tmp_path):
    pairs = _pairs(4)
    opts = QGOptions(lr=1e-2, max_steps=8, **FAST)  # 5 batches per epoch: the resumed run crosses an epoch
    ref = tiny_llama(seed=4)
    fine_tune_qg(tmp_path / "ref", ref, pairs, opts, dev_fraction=0.25, seed=0)
    lm = tiny_llama(seed=4)
    with pytest.raises(_Kill):
        fine_tune_qg(tmp_path / "run", lm, pairs, opts, dev_fraction=0.25, seed=0, callbacks=[_KillAt(3)])
    lm = tiny_llama(seed=4)  # a fresh process: the model comes back from last.ckpt
    res = fine_tune_qg(tmp_path / "run", lm, pairs, opts, dev_fraction=0.25, seed=0)
    assert res.global_step == 8
    # one metrics.csv across the kill, with the steps of the unbroken run, each once
    assert list((tmp_path / "run").rglob("metrics.csv")) == [tmp_path / "run" / "logs" / "metrics.csv"]
    assert _logged_steps(tmp_path / "run") == _logged_steps(tmp_path / "ref")
    for (n, a), (_, b) in zip(ref.model.named_parameters(), lm.model.named_parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


def _logged_steps(out) -> list[tuple[str, str]]:
    """(step, metric) of every value in ``logs/metrics.csv``."""
    import csv

    with open(out / "logs" / "metrics.csv", newline="") as f:
        return sorted((r["step"], k) for r in csv.DictReader(f) for k, v in r.items() if v != "" and k != "step")


def test_the_token_nll_scores_only_the_query_tokens_and_equals_the_full_log_softmax_bit_for_bit():
    """The fine-tune's loss takes the log-softmax at the scored tokens alone: the per-sequence sums and every
    gradient equal those of the log-softmax over every position, masked, to the bit."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from gdr.training.qg import QGModule

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    module = QGModule(model, lr=1e-3, weight_decay=0.0, warmup_steps=1, seq2seq=False)
    ids = torch.randint(0, 500, (4, 30))
    mask = torch.ones(4, 30, dtype=torch.long)
    mask[1, 25:] = 0
    labels = torch.full((4, 30), -100)
    labels[:, 20:] = ids[:, 20:]
    labels[1, 25:] = -100
    batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}

    def every_position(batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        tgt = batch["labels"][:, 1:]
        valid = tgt != -100
        lp = torch.log_softmax(logits.float(), -1).gather(-1, tgt.clamp_min(0)[..., None])[..., 0]
        return -(lp * valid).sum(-1), valid.sum(-1)

    out = []
    for nll_of in (every_position, module._token_nll):
        model.zero_grad()
        nll, n = nll_of(batch)
        (nll.sum() / n.sum()).backward()
        out.append((nll.detach(), n, [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert out[1][1].tolist() == [10, 5, 10, 10]
    assert all(torch.equal(a, b) for a, b in zip(out[0][2], out[1][2]))
