"""`gdr plan` (gdr/plan.py): per-stage seconds and peak memory from the cost model and the committed GPU figures."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gdr import cost
from gdr.config import load_config
from gdr.plan import (
    BMI_INPUTS_COST,
    DEVICES,
    LM_LOAD_S,
    StagePlan,
    _meta_lm,
    format_plan,
    measured_figures,
    plan_run,
    predict,
)
from gdr.training.train import concurrent_for_memory

STAGES = ["lm_load", "sampling", "scoring", "clustering", "doc_queries", "indexing", "bm25", "training", "evaluation",
          "reports"]
# +experiment=bbc (qg.enabled, qg.compare_two_shot): the generator fine-tuned first, the base model's P scored and
# clustered a second time after the generated queries
TWO_SHOT = ["lm_load (two-shot)", "sampling (two-shot)", "scoring (two-shot)", "clustering (two-shot)"]
BBC_STAGES = ["qg", *STAGES[:5], *TWO_SHOT, *STAGES[5:]]
# the protocol of the committed H200 run (reports/gpu-runs/2026-11-27-bbc-compare/): early stopping, K = 10
BBC_1127 = "bbc-2026-11-27"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """`gdr plan` writes the plan into the config's out folder (relative: under the working folder): a test's own."""
    monkeypatch.chdir(tmp_path)


def _runs(tmp_path, scoring_fraction: float, warmup: float = 10.0):
    """A gpu-runs folder with one chain JSON and one scoring JSON of known figures."""
    chain = {"device": "NVIDIA H200", "sampling_fraction_of_limit": 0.05, "sampling_load_s": 30.0,
             "sampling_warmup_s": 20.0, "training_small30m_fraction_of_limit": 0.1, "training_small30m_batch": 1024,
             "training_small30m_warmup_s": 1.0, "search_fraction_of_limit": 0.02, "search_load_s": 5.0,
             "search_warmup_s": 1.0, "scoring_fraction_of_limit": scoring_fraction / 2, "steps": {}}
    (tmp_path / "2026-01-01-h200-chain.json").write_text(json.dumps(chain) + "\n")
    bench = {"device": "NVIDIA H200", "engine_pairs_per_s": 1.0, "fraction_of_limit": scoring_fraction,
             "warmup_s": warmup}
    (tmp_path / "2026-01-02-h200-x-scoring.json").write_text("log line\n" + json.dumps(bench) + "\n")
    return tmp_path


def test_measured_figures_take_the_best_fraction_and_name_its_file(tmp_path):
    figs = measured_figures("h200", _runs(tmp_path, 0.2))
    assert figs["scoring_fraction_of_limit"] == (0.2, "2026-01-02-h200-x-scoring.json")  # not the chain's 0.1
    assert figs["sampling_load_s"] == (30.0, "2026-01-01-h200-chain.json")
    assert measured_figures("a100", tmp_path) == {}


def test_scoring_seconds_are_pairs_over_the_measured_fraction_of_the_limit_plus_the_warm_up(tmp_path):
    """Checked by hand from the cost model: doubling the measured fraction halves the compute part, 8 GPUs
    divide it by 8, the warm-up stays."""
    cfg = load_config("run", ["+experiment=bbc", "data.n_docs=1000", "sample.n_queries=512"])
    one = {s.name: s for s in plan_run(cfg, "h200", 1, _runs(tmp_path, 0.2))}
    assert list(one) == BBC_STAGES
    lm = _meta_lm("smollm2-135m")
    prompt, n = 128 + 32, 16
    per_doc, tile = cost.score_memory(cost.dims(lm.config), prompt, 4096)
    batch = cost.batch_for_memory(141e9, per_doc, share=0.5, fixed=tile, cap=64)
    limit = min(989e12 / cost.scoring_flops_per_pair(lm, prompt, n, 512),
                4.8e12 / cost.scoring_bytes_per_pair(lm, prompt, n, 512, batch, 4096, 2))
    assert one["scoring"].seconds == pytest.approx(10.0 + 1000 * 512 / (0.2 * limit))
    assert "2026-01-02-h200-x-scoring.json" in one["scoring"].basis and "20.0%" in one["scoring"].basis
    twice = {s.name: s for s in plan_run(cfg, "h200", 1, _runs(tmp_path, 0.4))}
    assert twice["scoring"].seconds - 10.0 == pytest.approx((one["scoring"].seconds - 10.0) / 2)
    eight = {s.name: s for s in plan_run(cfg, "h200", 8, _runs(tmp_path, 0.2))}
    assert eight["scoring"].seconds - 10.0 == pytest.approx((one["scoring"].seconds - 10.0) / 8)
    assert " 1 at once" in eight["training"].basis  # each retriever data-parallel over the 8 GPUs
    assert one["lm_load (two-shot)"].seconds == LM_LOAD_S and one["scoring"].peak_bytes > one["sampling"].peak_bytes > 0
    assert one["lm_load"].seconds == 30.0  # the fine-tuned generator: from its folder, at the cold load measured


def test_a_device_without_figures_takes_the_h200_fractions_and_says_so(tmp_path):
    cfg = load_config("run", ["+experiment=bbc", "data.n_docs=500"])
    h100 = {s.name: s for s in plan_run(cfg, "h100", 1, _runs(tmp_path, 0.2))}
    assert "H200 figures: none for h100" in h100["scoring"].basis
    cpu = {s.name: s for s in plan_run(cfg, "cpu", 1, tmp_path)}
    assert "CPU default" in cpu["scoring"].basis and cpu["scoring"].seconds > h100["scoring"].seconds


def test_predict_gives_seconds_per_stage_for_the_report():
    cfg = load_config("run", ["+experiment=bbc"])
    pred = predict(cfg, "h200")
    assert list(pred) == BBC_STAGES and all(v > 0 for v in pred.values())


def test_the_committed_figures_plan_the_bbc_run_and_name_their_files(capsys):
    from gdr.cli import main

    assert main(["plan", "+experiment=bbc", "device=h200"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert list(summary["stages"]) == BBC_STAGES and summary["device"] == "h200"
    for name in ("sampling", "scoring", "training", "evaluation"):
        assert "2026-11-27-h200" in summary["stages"][name]["basis"], name
    assert summary["seconds"] == pytest.approx(sum(s["seconds"] for s in summary["stages"].values()), abs=0.5)
    assert out[0] == "gdr plan on 1 x H200:" and out[-3].startswith("total, epoch cap")
    assert out[-2].split()[:2] == ["wall", f"{summary['seconds_wall']:.1f}"] and summary["overlap"]["on"]
    written = json.loads(Path(summary["plan_file"]).read_text())
    assert written["seconds_wall"] == summary["seconds_wall"] and written["overlap"] == summary["overlap"]


def test_plan_refuses_what_it_cannot_plan(capsys):
    from gdr.cli import main

    assert main(["plan", "+experiment=bbc", "gpus=0"]) == 2
    assert "gpus='0'" in capsys.readouterr().err
    assert main(["plan", "+experiment=bbc", "gpus=100000"]) == 2  # planned as if one machine held them
    assert "gpus='100000': a whole number of GPUs, 1 to 16" in capsys.readouterr().err
    assert main(["plan", "+experiment=bbc", "device=cpu", "gpus=4"]) == 2  # a CPU plan divided by 4
    assert "gpus=4: device=cpu has no GPUs" in capsys.readouterr().err
    assert main(["plan", "+experiment=bbc", "device=tpu"]) == 2
    assert "device=h200 | h100 | a100 | cpu" in capsys.readouterr().err
    cfg = load_config("run", ["data=jsonl", "data.path=/nowhere"])
    with pytest.raises(ValueError, match="set data.n_docs"):
        plan_run(cfg, "h200")
    assert set(DEVICES) == {"h200", "h100", "a100", "cpu"}


def test_format_plan_lists_the_stages_and_both_totals():
    text = format_plan([StagePlan("a", 1.5, 2e9, "x"), StagePlan("b", 2.0, None, "y", low=1.0, high=4.0)], "h100",
                       8)
    lines = text.splitlines()
    assert lines[0] == "gdr plan on 8 x H100:" and "2.0" in text
    assert lines[-3].split()[:2] == ["total", "3.5"] and lines[-2].split()[:4] == ["total,", "early", "stop", "2.5"]
    assert lines[-1].split()[:4] == ["total,", "epoch", "cap", "5.5"]


def _training(tmp_path, *overrides: str, device: str = "h200") -> StagePlan:
    cfg = load_config("run", [f"+experiment={BBC_1127}", "train.trainer.batch_size=1024", *overrides])
    return {s.name: s for s in plan_run(cfg, device, 1, _runs(tmp_path, 0.2))}["training"]


def test_the_bbc_plan_trains_the_four_schemes_three_seeds_each(tmp_path):
    cfg = load_config("run", [f"+experiment={BBC_1127}"])
    assert list(cfg.indexers) == ["gc", "hkmi", "bmi", "random"]
    assert _training(tmp_path).basis.startswith("12 retrievers x 500 steps (assumed: the dev score best at the floor, "
                                                "then the patience) from 300 ")
    assert "to 900 (30 epochs, the cap)" in _training(tmp_path).basis
    # the protocol's fixed budget: one figure, the cap, and no early stop assumed
    cfg = load_config("run", ["+experiment=bbc", "train.trainer.batch_size=1024"])
    fixed = {s.name: s for s in plan_run(cfg, "h200", 1, _runs(tmp_path, 0.2))}["training"]
    assert re.match(r"12 retrievers x [\d,]+ steps \(40 epochs; no early stopping: the cap\) x batch 1024", fixed.basis)


def test_an_index_per_retriever_seed_is_planned_and_each_index_stage_predicted(tmp_path):
    """index_seed=retriever (bbc.yaml's): the indexing plans one index per seed of each seeded scheme, and each
    ``index-<scheme>-s<seed>`` stage of the run is predicted the seconds of one index (gdr.stages.plan_file)."""
    from gdr.stages.plan_file import stage_seconds

    def indexing(*overrides):
        cfg = load_config("run", ["+experiment=bbc", "indexers=[gc,hkmi,atomic]", *overrides])
        return {s.name: s for s in plan_run(cfg, "h200", 1, _runs(tmp_path, 0.2))}["indexing"]

    shared, each = indexing("index_seed=shared"), indexing("index_seed=retriever")
    one = shared.parts
    assert each.parts == one
    assert each.seconds == pytest.approx(3 * (one["gc"] + one["hkmi"]) + one["atomic"])
    assert "gc" in each.basis and "x 3 seeds" in each.basis and "x 3 seeds" not in shared.basis
    got = stage_seconds({"indexing": each.seconds}, each.parts, ["index-gc-s2", "index-atomic", "index-hkmi"], 1)
    assert got == {"index-gc-s2": one["gc"], "index-atomic": one["atomic"], "index-hkmi": one["hkmi"]}
    # BMI's own vector (bbc's realq_genq_docseg) embeds its segments and real queries too: the measured ratio over
    # its generated queries alone (the 2026-11-27 run's genq, whose index_bmi_doc the plan holds)
    own, genq = (indexing("indexers=[bmi]", f"index.bmi.inputs={i}").parts["bmi"]
                 for i in ("realq_genq_docseg", "genq"))
    assert own == pytest.approx(genq * BMI_INPUTS_COST["realq_genq_docseg"]) and own > 2 * genq


def test_a_dev_split_of_the_query_set_holds_no_training_title_out_in_the_plan():
    """queries.dev_split=dev (bbc.yaml's): every train title is a training example an epoch, and the dev titles are
    what validates; null: the trainer's held-out share of the train titles."""
    from gdr.plan import _dev_split_size, _examples, _sizes

    def sizes(*overrides):
        cfg = load_config("run", ["+experiment=bbc", *overrides])
        n_docs, n_train, _ = _sizes(cfg)
        return n_train, _dev_split_size(cfg), _examples(cfg.train.examples, n_docs, n_train, 15, _dev_split_size(cfg))

    n_train, given, (per_epoch, dev) = sizes()
    _, none, (held_epoch, held_dev) = sizes("queries.dev_split=null")
    assert none is None and 80 <= given <= 100 and dev == given
    assert per_epoch - held_epoch == held_dev == round(0.1 * n_train)  # the train titles held out otherwise
    assert sizes("train.examples.dev_min=100")[2][1] == 100  # dev_min tops the dev titles up with generated queries


def test_retrievers_at_once_multiply_the_single_rate_up_to_the_limit_and_say_it_is_assumed(tmp_path):
    """The fixture's single retriever reaches 10% of the limit with a 1 s warm-up: 2 at once halve the compute
    part and the warm-ups and add 2 worker spawns; 12 at once reach 120%, capped at the limit: a tenth of the
    compute part, and 12 spawns."""
    from gdr.plan import SPAWN_S

    one = _training(tmp_path, "train.concurrent=1")
    two = _training(tmp_path, "train.concurrent=2")
    all_ = _training(tmp_path, "train.concurrent=12")
    assert two.seconds - 6 - 2 * SPAWN_S == pytest.approx((one.seconds - 12) / 2)
    assert all_.seconds - 1 - 12 * SPAWN_S == pytest.approx((one.seconds - 12) / 10)
    assert "2 worker spawns" in two.basis and "spawn" not in one.basis
    assert "100.0% of the limit" in all_.basis and "assumed: concurrent runs overlap" in two.basis
    assert "assumed: concurrent" not in one.basis
    cfg = load_config("run", [f"+experiment={BBC_1127}", "train.trainer.batch_size=1024", "train.concurrent=12"])
    eight = {s.name: s for s in plan_run(cfg, "h200", 8, _runs(tmp_path, 0.2))}["training"]
    assert " 1 at once" in eight.basis  # each retriever data-parallel over the 8 GPUs, as the run resolves it
    assert eight.seconds - 12 == pytest.approx((one.seconds - 12) / 8)


def test_auto_concurrency_is_what_the_device_memory_holds(tmp_path, monkeypatch):
    """``train.concurrent: auto`` (bbc.yaml's) takes the run's rule, gdr.training.train.concurrent_for_memory, at
    the device's memory and R-drop's two forward passes: more retrievers at once on an H200 than on an H100, each
    with its own memory."""
    import gdr.plan

    asked = []

    def rule(config, batch, free, n_jobs, passes):
        asked.append((batch, free, n_jobs, passes))
        return concurrent_for_memory(config, batch, free, n_jobs, passes)

    monkeypatch.setattr(gdr.plan, "concurrent_for_memory", rule)
    assert load_config("run", ["+experiment=bbc"]).train.concurrent == "auto"
    h200, h100 = _training(tmp_path, device="h200"), _training(tmp_path, device="h100")
    assert [(b, n, p) for b, _, n, p in asked] == [(1024, 12, 1), (1024, 12, 1)]  # that run: no R-drop
    assert asked[0][1] == cost.device_peaks("H200").memory and asked[1][1] == cost.device_peaks("H100").memory
    n200, n100 = (int(re.search(r"(\d+) at once \(auto", s.basis).group(1)) for s in (h200, h100))
    assert n200 > n100 >= 1
    assert h200.peak_bytes / n200 == pytest.approx(h100.peak_bytes / n100)
    # R-drop (bbc.yaml's consistency_weight 0.15): two forward passes held until the backward, fewer at once
    rdrop = _training(tmp_path, "train.optim.consistency_weight=0.15", device="h200")
    assert asked[-1][3] == 2 and "two passes each" in rdrop.basis
    assert int(re.search(r"(\d+) at once \(auto", rdrop.basis).group(1)) < n200


def test_length_buckets_move_training_time_only_as_far_as_the_limit_moves(tmp_path, monkeypatch):
    import gdr.plan

    """At batch 1,024 the buckets' measured width is 39.0 of 64 positions (real tokens plus pad): training gets
    faster by less than 64 / 39.0, as the decoder's docid positions do not shrink."""
    full = _training(tmp_path, "train.concurrent=1", "train.trainer.length_buckets=false")
    short = _training(tmp_path, "train.concurrent=1")
    ratio = (full.seconds - 12) / (short.seconds - 12)
    assert 1.1 < ratio < 64 / 39.0
    assert f"a limit {ratio:.1f}x the full width's" in short.basis and "assumed: the measured fraction" in short.basis
    assert "39.0 input positions an example at batch 1024" in short.basis
    monkeypatch.setattr(gdr.plan, "BUCKETED_WIDTH", {64: 1.0, 1024: 1.0})
    assert _training(tmp_path, "train.concurrent=1").seconds == pytest.approx(full.seconds)


def test_the_padded_width_is_interpolated_between_the_measured_batches():
    from gdr.plan import BUCKETED_WIDTH, _padded_width

    assert _padded_width(64, 576, False) == 64
    assert _padded_width(64, 576, True) == pytest.approx(64 * BUCKETED_WIDTH[576])
    assert 64 * BUCKETED_WIDTH[576] < _padded_width(64, 768, True) < 64 * BUCKETED_WIDTH[1024]
    assert _padded_width(64, 4096, True) == pytest.approx(64 * BUCKETED_WIDTH[1024])  # held past the last


def test_training_runs_from_the_earliest_early_stop_to_the_epoch_cap(tmp_path):
    from gdr.plan import _train_steps
    from gdr.training.options import TrainerOptions

    bbc = dict(max_epochs=30, min_steps=300, patience_steps=200, val_check_interval=50,
               check_val_every_n_epoch=None)
    assert _train_steps(TrainerOptions(**bbc), 30037, 1024)[:2] == (900, 300)
    assert _train_steps(TrainerOptions(**bbc), 30037, 1024)[3] == 500  # best at the floor 300, patience 200
    assert _train_steps(TrainerOptions(**{**bbc, "min_steps": 0}), 30037, 1024)[:2] == (900, 250)  # 50 + 4 checks
    no_stop = {**bbc, "patience_steps": None, "patience": 0}  # no early stopping: the epoch cap
    assert _train_steps(TrainerOptions(**no_stop), 30037, 1024)[:2] == (900, 900)
    checks = dict(max_epochs=30, min_steps=0, patience=5, check_val_every_n_epoch=1, val_check_interval=None)
    assert _train_steps(TrainerOptions(**checks), 30037, 1024)[:2] == (900, 180)  # 30-step epochs: 1 + 5 checks
    assert _train_steps(TrainerOptions(**{**bbc, "max_steps": 200}), 30037, 1024)[:2] == (200, 200)
    st = _training(tmp_path, "train.concurrent=1")
    assert st.low - 12 == pytest.approx((st.high - 12) / 3)
    assert st.seconds - 12 == pytest.approx((st.high - 12) * 5 / 9)
    assert st.at_steps(400) == pytest.approx((st.low + st.seconds) / 2)


def test_the_bundled_gguf_lm_loads_by_the_fast_conversion(tmp_path):
    cfg = load_config("run", ["+experiment=bbc", "qg.enabled=false"])
    st = {s.name: s for s in plan_run(cfg, "h200", 1, _runs(tmp_path, 0.2))}
    assert st["lm_load"].seconds == LM_LOAD_S and "reports/lm-cold-start.md" in st["lm_load"].basis
    assert "30.0 s (2026-01-01-h200-chain.json)" in st["lm_load"].basis
    t5 = load_config("run", ["+experiment=msmarco-lite"])
    assert {s.name: s for s in plan_run(t5, "h200", 1, _runs(tmp_path, 0.2))}["lm_load"].seconds == 30.0


def test_the_plan_prints_both_totals(capsys):
    from gdr.cli import main

    assert main(["plan", f"+experiment={BBC_1127}", "device=h100"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert out[-5].startswith("total ") and out[-4].startswith("total, early stop")
    assert out[-3].startswith("total, epoch cap") and out[-2].startswith("wall ")
    assert summary["seconds_early_stop"] < summary["seconds"]
    assert f"{summary['seconds_early_stop']:.1f}" in out[-4]


BBC_RUN = Path(__file__).resolve().parents[1] / "reports" / "gpu-runs" / "2026-11-27-bbc-compare"


def test_check_sets_a_finished_run_beside_its_plan_and_its_factors_reproduce_it(tmp_path, capsys):
    """The committed H200 run: its log's resolved inputs (batch 576 at 20.6 GB free, 1 at once) reach the plan;
    each row's ratio is the plan over the measured seconds; factors written from the run, then read back by the
    plan of that device, reproduce the run's measured totals per plan stage (training at the steps taken)."""
    from gdr.plan import check_run, format_check, write_factors

    (tmp_path / "runs").mkdir()
    runs = _runs(tmp_path / "runs", 0.11)
    before = check_run(BBC_RUN, folder=runs)
    assert before.device == "h200" and any("batch 576, 20.6 GB free" in n for n in before.notes)
    rows = {r[0]: r for r in before.rows}
    assert rows["total"][3] == 751.1 and rows["train, all 12"][3] == pytest.approx(388.7, abs=0.1)
    assert rows["score"][1] == rows["score"][2]  # no factors in that folder yet
    assert "batch 576 (auto for 20.6 GB free)" in {s.name: s for s in plan_run(
        load_config("run", [f"+experiment={BBC_1127}"]), "h200", 1, runs, free=20.6e9)}["training"].basis
    write_factors(before, runs)
    after = check_run(BBC_RUN, folder=runs)
    rows = {r[0]: r for r in after.rows}
    for name in ("score", "cluster", "doc-queries", "eval, all 12", "outside stages"):
        assert rows[name][2] == pytest.approx(rows[name][3], rel=0.01), name
    assert rows["train, all 12"][2] != pytest.approx(rows["train, all 12"][3], rel=0.01)  # central stop, not 438
    text = format_check(after)
    assert "in-sample" in text and f"{rows['total'][2] / 751.1:.2f}" in text.splitlines()[-2]


def test_check_refuses_a_folder_without_a_report(tmp_path, capsys):
    from gdr.cli import main

    assert main(["plan", "--check", str(tmp_path)]) == 2
    assert f"gdr plan --check {tmp_path}: no report.json there" in capsys.readouterr().err
    assert main(["plan", "--check"]) == 2
    assert "name the run folder" in capsys.readouterr().err


def test_the_committed_h200_plan_of_the_bbc_run_is_within_30_percent_of_its_stages(capsys):
    """The committed figures and factors, at the inputs the run resolved (20.6 GB free at training): each stage
    of 10 s or more, the 12 retrievers' training and the total within 30% of what the run measured."""
    from gdr.plan import check_run

    rows = {r[0]: r for r in check_run(BBC_RUN).rows}
    for name in ("score", "cluster", "doc-queries", "train, all 12", "eval, all 12", "total"):
        assert 0.7 <= rows[name][2] / rows[name][3] <= 1.3, (name, rows[name])


def test_free_gb_resolves_the_batch_and_the_retrievers_at_once_as_the_run_did(capsys):
    """The H200 BBC run found 20.6 GB free at training (the LM stages still held the rest): batch 576, one at
    once; with the whole memory free the same rules give batch 1,024 and several at once."""
    from gdr.cli import main

    assert main(["plan", f"+experiment={BBC_1127}", "device=h200", "free_gb=20.6"]) == 0
    basis = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stages"]["training"]["basis"]
    assert "batch 576 (auto for 20.6 GB free)" in basis and "1 at once (auto: what the memory holds for 20.6" in basis
    assert main(["plan", f"+experiment={BBC_1127}", "device=h200"]) == 0
    basis = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stages"]["training"]["basis"]
    assert "batch 1024 (auto)" in basis and "1 at once" not in basis
    assert main(["plan", "+experiment=bbc", "free_gb=lots"]) == 2
    assert "free_gb='lots'" in capsys.readouterr().err
    for bad in ("-3", "0", "nan", "inf"):  # no plan for memory that cannot be
        assert main(["plan", "+experiment=bbc", f"free_gb={bad}"]) == 2
        assert f"free_gb='{bad}': must be a number > 0" in capsys.readouterr().err


def test_cross_validation_plans_k_retrievers_per_scheme_and_seed_each_searching_its_fold(tmp_path):
    runs = _runs(tmp_path, 0.2)
    one = {s.name: s for s in plan_run(load_config("run", ["+experiment=cranfield", "seeds=[0]", "queries.folds=null"]),
                                       "h200", 1, runs)}
    five = {s.name: s for s in plan_run(load_config("run", ["+experiment=cranfield", "seeds=[0]"]), "h200", 1, runs)}
    n = len(load_config("run", ["+experiment=cranfield"]).indexers)
    assert f"{n} retrievers" in one["training"].basis and f"{5 * n} retrievers" in five["training"].basis
    n_ret, tested = re.search(r"(\d+) x \(?[^(]*?([\d,]+) test queries", five["evaluation"].basis).groups()
    assert int(n_ret) == 5 * n and int(tested.replace(",", "")) * 5 == 225  # each fold's share of Cranfield's 225
    # topics: every topic once per scheme
    assert five["scoring"].seconds == one["scoring"].seconds  # P does not depend on the split


@pytest.mark.parametrize("form", ["tsv", "trec", "beir", "beir as data.name"])
def test_a_collection_of_ones_own_is_planned_with_the_test_queries_of_its_qrels(tmp_path, form):
    """Six judged test topics (one judged twice, one not relevant): six searched, not an assumed 1,000; a BEIR
    folder named by data=beir data.path=<folder> or by data.name=<folder>."""
    lines = [("q1", "d1", 1), ("q1", "d2", 1), ("q2", "d3", 0), *((f"q{i}", f"d{i}", 1) for i in range(3, 7))]
    text = ("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{r}\n" for q, d, r in lines) if form != "trec"
            else "".join(f"{q} 0 {d} {r}\n" for q, d, r in lines))
    if form.startswith("beir"):
        (tmp_path / "beir" / "qrels").mkdir(parents=True)
        (tmp_path / "beir" / "qrels" / "test.tsv").write_text(text)
        (tmp_path / "beir" / "corpus.jsonl").write_text('{"_id": "d1", "text": "a document"}\n')
        data = ["data=beir", f"data.path={tmp_path / 'beir'}"] if form == "beir" else [f"data.name={tmp_path / 'beir'}"]
    else:
        (tmp_path / "judged.txt").write_text(text)
        data = ["data=jsonl", f"data.path={tmp_path / 'docs.jsonl'}", f"data.queries={tmp_path / 'q.jsonl'}",
                f"data.qrels={tmp_path / 'judged.txt'}"]
    cfg = load_config("run", [*data, "data.n_docs=30", "seeds=[0]"])
    evaluation = {s.name: s for s in plan_run(cfg, "h200", 1, _runs(tmp_path, 0.2))}["evaluation"]
    assert re.search(r"\b6 test queries", evaluation.basis), evaluation.basis


def test_cranfield_plans_its_generator_on_the_corpus_title_pairs(tmp_path):
    """+experiment=cranfield fine-tunes its generator on (abstract, title) pairs (qg.pairs=titles): one a document
    with a title of its own (1,350 of 1,400), less the held-out documents' (qg.dev_fraction 5%: 68), with or
    without folds; no two-shot pass (Cranfield has no labels to cluster against)."""
    from gdr.plan import TITLED_SHARE

    runs = _runs(tmp_path, 0.2)
    for extra in ([], ["queries.folds=null"]):
        rows = {s.name: s for s in plan_run(load_config("run", ["+experiment=cranfield", "seeds=[0]", *extra]),
                                            "h200", 1, runs, calibrate="off")}
        assert list(rows) == ["qg", *(n for n in STAGES if n != "clustering")]
        titled = round(1400 * TITLED_SHARE["cranfield"])
        held = round(0.05 * titled)
        assert titled == 1350 and f"on {titled - held:,} training pairs (document, title)" in rows["qg"].basis
        assert f"the {held} held-out documents' titles under both generators" in rows["qg"].basis


# --- the BBC protocol's run: the qg stage, the two-shot pass, the host stages overlapped (issues 46/47) -----------

def _names(*overrides: str, device: str = "h200", runs=None) -> dict[str, StagePlan]:
    cfg = load_config("run", ["+experiment=bbc", *overrides])
    return {s.name: s for s in plan_run(cfg, device, 1, runs, calibrate="off")} if runs else \
        {s.name: s for s in plan_run(cfg, device, 1, calibrate="off")}


def test_the_qg_and_two_shot_rows_appear_exactly_when_the_run_makes_those_stages(tmp_path):
    """qg.enabled: a qg row first and the generator loaded cold from its folder; qg.compare_two_shot (with the
    clustering on): the base model's load, sampling, scoring and clustering again; neither: today's rows."""
    runs = _runs(tmp_path, 0.2)
    assert list(_names(runs=runs)) == BBC_STAGES
    off = _names("qg.enabled=false", runs=runs)
    assert list(off) == STAGES and off["lm_load"].seconds == LM_LOAD_S
    tuned = _names("qg.compare_two_shot=false", runs=runs)
    assert list(tuned) == ["qg", *STAGES]
    assert tuned["lm_load"].seconds == 30.0 and "fine-tuned by the qg stage" in tuned["lm_load"].basis
    no_cluster = _names("cluster.enabled=false", runs=runs)  # compare_two_shot clusters the two-shot P: no run
    assert list(no_cluster) == ["qg", *(n for n in STAGES if n != "clustering")]
    both = _names(runs=runs)
    for name in ("sampling", "scoring", "clustering"):
        assert both[name + " (two-shot)"].seconds == pytest.approx(both[name].seconds), name
        assert both[name + " (two-shot)"].basis.startswith("the base model with its two-shot prompt")
    assert both["lm_load (two-shot)"].seconds == LM_LOAD_S  # the bundled base model: the GGUF conversion


def test_the_qg_stage_is_six_flops_a_parameter_and_token_at_an_assumed_fraction(tmp_path):
    """The fine-tune's compute part grows with its epochs and pairs; its basis names the pairs (the training titles
    less the held-out share), the tokens a pair, and says its fraction is assumed (GPU) or the CPU default."""
    from gdr.plan import PROMPT_TOKENS, QG_FRACTION, _sizes

    runs = _runs(tmp_path, 0.2)
    three, six = _names(runs=runs)["qg"], _names("qg.train.max_epochs=6", runs=runs)["qg"]
    fixed = 30.0 + LM_LOAD_S + 1.0  # the fixture's cold load (fine-tuned), the GGUF load (base), the warm-up
    assert 1.6 < (six.seconds - fixed) / (three.seconds - fixed) < 2.0  # the forward passes do not double
    n_pairs = _sizes(load_config("run", ["+experiment=bbc"]))[1]
    held = round(0.05 * n_pairs)
    assert f"on {n_pairs:,} training pairs less {held} held out" in three.basis
    assert f"{128 + PROMPT_TOKENS + 16} tokens a pair" in three.basis and "x 3 epochs" in three.basis
    assert f"{QG_FRACTION:.1%} of the limit, assumed" in three.basis
    lm = _meta_lm("smollm2-135m")
    P = cost.param_count(lm)
    rate = float(re.search(r"tokens at ([\d,.]+) pairs/s", three.basis).group(1).replace(",", ""))
    limit = min(989e12 / (6 * P * 176), 4.8e12 / cost.training_bytes_per_example(
        sum(p.numel() for p in lm.parameters()), P, 16, True))
    assert rate == pytest.approx(QG_FRACTION * limit, rel=0.01)
    cpu = _names(device="cpu", runs=runs)["qg"]
    assert "CPU default" in cpu.basis and cpu.seconds > three.seconds


def _device_sum(stages) -> float:
    host = ("clustering", "clustering (two-shot)", "indexing", "bm25")
    return sum(s.seconds for s in stages if s.name not in host)


def test_the_wall_is_the_sum_without_overlap_and_less_with_it_on_a_gpu(tmp_path):
    """overlap auto: off on the CPU (the wall is the stages' sum), on on a GPU, where the host stages run beside the
    device stages: the wall is less than the sum and at least the main thread's stages."""
    from gdr.plan import plan_wall

    runs = _runs(tmp_path, 0.2)
    cfg = load_config("run", ["+experiment=bbc"])
    gpu = plan_run(cfg, "h200", 1, runs)
    on = plan_wall(cfg, gpu, "h200")
    total = sum(s.seconds for s in gpu)
    assert on.overlap and _device_sum(gpu) <= on.seconds < total
    assert on.host == pytest.approx(total - _device_sum(gpu))
    assert "not modelled: the host thread's hold on the GIL" in on.basis and "reports/benchmarks.md" in on.basis
    off = plan_wall(load_config("run", ["+experiment=bbc", "overlap=false"]), gpu, "h200")
    assert not off.overlap and off.seconds == pytest.approx(total)
    cpu = plan_run(cfg, "cpu", 1, runs, calibrate="off")
    wall = plan_wall(cfg, cpu, "cpu")
    assert not wall.overlap and wall.seconds == pytest.approx(sum(s.seconds for s in cpu))


def test_the_overlap_simulation_waits_before_training_for_indexes_longer_than_the_device_stages():
    """One worker, the lowest priority first among what has started, never pre-empted: GC's index (100 s) from the
    end of scoring (10 s) and BMI's (10 s) from the end of doc_queries (15 s) finish at 120 s, so the main thread
    waits 105 s before training; the clustering (50 s) and BM25 (5 s) after them, by the first report."""
    from gdr.plan import HostTask, simulate_overlap
    from gdr.stages.overlap import Priority

    main = [("qg", 0.0), ("score", 10.0), ("doc_queries", 5.0), ("score (two-shot)", 0.0), ("first retriever", 20.0),
            ("the rest", 30.0)]
    host = [HostTask("index-gc", 100.0, Priority.INDEX, "score"), HostTask("cluster", 50.0, Priority.CLUSTER, "score"),
            HostTask("bm25", 5.0, Priority.BM25, "score"), HostTask("index-bmi", 10.0, Priority.INDEX, "doc_queries")]
    wall = simulate_overlap(main, host, "first retriever", "the rest")
    assert wall.finish == {"index-gc": 110.0, "index-bmi": 120.0, "cluster": 170.0, "bm25": 175.0}
    assert wall.waits == {"first retriever": 105.0, "the rest": 35.0} and wall.seconds == 205.0
    quick = [HostTask(h.name, 1.0, h.priority, h.after) for h in host]  # host work of 1 s each: BMI's index, from
    fast = simulate_overlap(main, quick, "first retriever", "the rest")  # the end of doc_queries, alone is waited for
    assert fast.waits == {"first retriever": 1.0} and fast.seconds == sum(s for _, s in main) + 1.0
    two_shot = [*main[:3], ("score (two-shot)", 8.0), *main[4:]]  # the two-shot pass covers it
    assert simulate_overlap(two_shot, quick, "first retriever", "the rest").seconds == sum(s for _, s in two_shot)
    with pytest.raises(ValueError, match="start after the main thread first waits"):
        simulate_overlap(main, [HostTask("late", 1.0, Priority.BM25, "the rest")], "first retriever", "the rest")


def test_the_planned_wall_waits_for_long_indexes_before_training(tmp_path):
    """The plan's own wall: indexes of 500 s each against a few minutes of LM stages make the main thread wait
    before the retrievers train, and the wait is said."""
    from gdr.plan import plan_wall

    cfg = load_config("run", ["+experiment=bbc"])
    stages = plan_run(cfg, "h200", 1, _runs(tmp_path, 0.2))
    short = plan_wall(cfg, stages, "h200")
    by = {s.name: s for s in stages}
    by["indexing"].parts = {m: 500.0 for m in by["indexing"].parts}
    long = plan_wall(cfg, stages, "h200")
    before = sum(s.seconds for s in stages if s.name in ("qg", "lm_load", "sampling", "scoring", "doc_queries",
                                                            "lm_load (two-shot)", "sampling (two-shot)",
                                                            "scoring (two-shot)"))
    assert "first retriever" not in short.waits
    assert long.waits["first retriever"] > 12 * 500.0 - before - 1  # 12 indexes one after another
    assert "s before training" in long.basis


def test_a_second_score_and_cluster_are_the_two_shot_generators_in_the_plan_and_the_report():
    from gdr.pipeline import StageRecord
    from gdr.stages.plan_file import planned_names, stage_seconds
    from gdr.stages.report import _stage_rows

    names = ["qg", "score", "cluster", "doc-queries", "score", "cluster", "train-gc-s0"]
    assert planned_names(names) == ["qg", "score", "cluster", "doc-queries", "score (two-shot)", "cluster (two-shot)",
                                    "train-gc-s0"]
    plan = {"qg": 9.0, "lm_load": 1.0, "sampling": 2.0, "scoring": 3.0, "clustering": 4.0, "doc_queries": 5.0,
            "lm_load (two-shot)": 10.0, "sampling (two-shot)": 20.0, "scoring (two-shot)": 30.0,
            "clustering (two-shot)": 40.0, "training": 7.0}
    got = stage_seconds(plan, {}, names, 1)
    assert got == {"qg": 9.0, "score": 6.0, "cluster": 4.0, "doc-queries": 5.0, "score (two-shot)": 60.0,
                   "cluster (two-shot)": 40.0, "train-gc-s0": 7.0}
    rows = _stage_rows([StageRecord(n, Path(n), "k", 1.0, False) for n in names], got)
    assert [r["predicted_seconds"] for r in rows] == [9.0, 6.0, 4.0, 5.0, 60.0, 40.0, 7.0]


def _finished_run(run: Path, cfg, report: dict) -> Path:
    """A run folder as `gdr plan --check` reads it: the run's config and its report.json."""
    run.mkdir()
    OmegaConf.save(cfg, run / "run.config.yaml")
    (run / "report.json").write_text(json.dumps(report))
    return run


def test_check_sums_repeated_stages_in_order_and_reads_the_overlapped_accounts(tmp_path):
    """A synthetic run of +experiment=bbc on the H200 with overlap: the first score took 2x its plan, the second
    (two-shot) 3x, the two-shot clustering half; the report's outside accounts (LM loads apart) and the total against
    the plan's wall with the host stages overlapped."""
    from gdr.plan import check_run, plan_wall
    from gdr.stages.plan_file import planned_names, stage_seconds

    (tmp_path / "runs").mkdir()
    runs = _runs(tmp_path / "runs", 0.2)
    cfg = load_config("run", ["+experiment=bbc", "seeds=[0]"])
    raw = plan_run(cfg, "h200", 1, runs, factors=False)
    names = ["qg", "score", "cluster", "index-gc-s0", "index-hkmi-s0", "index-random-s0", "bm25", "doc-queries",
             "index-bmi-s0", "score", "cluster", *(f"{k}-{m}-s0" for m in cfg.indexers for k in ("train", "eval"))]
    pred = stage_seconds({s.name: s.seconds for s in raw}, next(s.parts for s in raw if s.name == "indexing"), names, 4)
    times = {"score": 2.0, "score (two-shot)": 3.0, "cluster (two-shot)": 0.5}
    stages = [{"name": n, "seconds": round(pred[k] * times.get(k, 1.0), 2)}
              for n, k in zip(names, planned_names(names))]
    run = _finished_run(tmp_path / "run", cfg, {
        "command": "gdr run +experiment=bbc seeds=[0]", "seconds": 999.0, "n_docs": 2225, "stages": stages,
        "outside_stages": {"seconds": 40.0, "lm_load": 30.0, "report_rewrites": 4.0, "other": 6.0},
        "overlapped": {"stages": {"cluster": {"seconds": 70.0, "waited": 0.0}}, "seconds": 70.0, "waited": 0.0},
        "training": {"peak_gb": 40.0, "estimate_gb": 80.0}})
    check = check_run(run, "h200", folder=runs)
    assert ("training memory: one retriever's measured peak 40.0 GB against the batch rule's 80.0 GB (0.50x; the rule "
            "fills 60% of the free memory with its estimate)") in check.notes
    rows = {r[0]: r for r in check.rows}
    assert rows["score"][3] == pytest.approx(2 * pred["score"], abs=0.01)
    assert rows["score (two-shot)"][3] == pytest.approx(3 * pred["score (two-shot)"], abs=0.01)
    assert rows["score (two-shot)"][1] == pytest.approx(pred["score (two-shot)"])
    f = check.factors
    assert f["scoring"] == pytest.approx(2.0, abs=0.01) and f["lm_load"] == f["sampling"] == f["scoring"]
    assert f["scoring (two-shot)"] == pytest.approx(3.0, abs=0.01)
    assert f["clustering (two-shot)"] == pytest.approx(0.5, abs=0.01) and f["clustering"] == pytest.approx(1.0, 0.01)
    assert f["qg"] == pytest.approx(1.0, abs=0.01)
    reports = next(s for s in raw if s.name == "reports")
    assert rows["outside stages"][3] == 10.0 and f["reports"] == pytest.approx(10.0 / reports.seconds, abs=0.001)
    assert rows["  report rewrites"][3] == 4.0 and rows["  other outside"][3] == 6.0
    wall = plan_wall(cfg, raw, "h200", overlap=True)
    assert rows["total"][1] == pytest.approx(wall.seconds) and rows["total"][3] == 999.0
    assert wall.seconds < sum(s.seconds for s in raw)
    assert any(n.startswith("overlap: cluster ran in the background") for n in check.notes)


def _finished(folder: Path, *names: str, status: str = "complete") -> Path:
    """A run folder holding a ``stage.json`` of each stage ``names`` (``<name>-<key>/``) with ``status``."""
    for i, name in enumerate(names):
        d = folder / f"{name}-{i:010x}"
        d.mkdir(parents=True)
        (d / "stage.json").write_text(json.dumps({"stage": name, "key": f"{i:010x}", "status": status}))
    return folder


def test_what_is_left_of_a_run_folder_is_planned_by_its_finished_stages(tmp_path):
    """A later lease of the BBC protocol: the qg stage, the generator's P and clustering, both seeds' GC and HKmI
    indexes and seed 0's four retrievers are finished. Left: the LM's load (the generated queries are not made), the
    generated queries, the two-shot pass, the other indexes, BM25, 8 of 12 retrievers and the rewrites after them."""
    from gdr.plan import finished_stages, plan_wall, remaining

    cfg = load_config("run", ["+experiment=bbc"])
    stages = plan_run(cfg, "h200", 1, _runs(tmp_path, 0.2))
    done = ["qg", "score", "cluster", *(f"index-{m}-s{s}" for m in ("gc", "hkmi") for s in (0, 1))]
    done += [f"{k}-{m}-s0" for k in ("train", "eval") for m in ("gc", "hkmi", "bmi", "random")]
    folder = _finished(tmp_path / "run", *done)
    _finished(folder / "x", "bm25", status="running")  # not a stage of the run's folder: one level deeper
    _finished(tmp_path / "run2", "bm25", status="running")
    assert finished_stages(tmp_path / "run2") == {}
    finished = finished_stages(folder)
    assert finished == {name: 1 for name in done}
    left, facts = remaining(cfg, stages, finished)
    by, was = {s.name: s.seconds for s in left}, {s.name: s for s in stages}
    assert (facts.retrievers, facts.total) == (8, 12)
    assert by["qg"] == by["sampling"] == by["scoring"] == by["clustering"] == 0.0
    assert by["lm_load"] == was["lm_load"].seconds > 0  # loaded again for the generated queries
    for name in ("doc_queries", "bm25", "scoring (two-shot)", "clustering (two-shot)"):
        assert by[name] == was[name].seconds > 0, name
    parts = was["indexing"].parts
    assert by["indexing"] == pytest.approx(3 * (parts["bmi"] + parts["random"]) + parts["gc"] + parts["hkmi"])
    assert by["training"] == pytest.approx(was["training"].seconds * 8 / 12)
    assert by["evaluation"] == pytest.approx(was["evaluation"].seconds * 8 / 12)
    assert 0 < by["reports"] < was["reports"].seconds
    wall, full = plan_wall(cfg, left, "h200", left=facts), plan_wall(cfg, stages, "h200")
    assert wall.seconds < full.seconds and wall.seconds <= sum(by.values())

    # the two-shot pass and the generated queries made too: the LM is never loaded again
    _finished(tmp_path / "more", *done, "score", "cluster", "doc-queries")
    left, _ = remaining(cfg, stages, finished_stages(tmp_path / "more"))
    by = {s.name: s.seconds for s in left}
    assert by["lm_load"] == by["lm_load (two-shot)"] == by["scoring (two-shot)"] == by["doc_queries"] == 0.0


def test_gdr_plan_on_a_run_folder_prints_what_is_left_and_a_fresh_one_prints_none(tmp_path, capsys):
    from gdr.cli import main

    fresh = tmp_path / "fresh"
    assert main(["plan", "+experiment=bbc", "device=h200", f"out={fresh}"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out.strip().splitlines()[-1])["remaining"] is None and "remaining:" not in out
    folder = _finished(tmp_path / "lease2", "qg", "score", "cluster", "doc-queries", "eval-gc-s0", "train-gc-s0")
    assert main(["plan", "+experiment=bbc", "device=h200", f"out={folder}"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    left = json.loads(lines[-1])["remaining"]
    assert left["finished"]["eval-gc-s0"] == 1 and (left["retrievers_left"], left["retrievers"]) == (11, 12)
    assert 0 < left["seconds_wall"] < json.loads(lines[-1])["seconds_wall"]
    assert any(x.startswith("remaining wall") and f"{left['seconds_wall']:.1f}" in x for x in lines)
    assert any("1 of 12 retrievers evaluated" in x for x in lines)


def test_a_run_folder_with_only_its_report_is_planned_from_the_command_as_written(tmp_path):
    """A lease brings back report.json without run.config.yaml: the check composes the config from the report's
    command, whose overrides gdr run shell-quoted (`'seeds=[0,1]'`), as the shell would split them."""
    from gdr.pipeline import _command
    from gdr.plan import _run_config

    (tmp_path / "report.json").write_text(json.dumps({"command": _command(["+experiment=demo", "seeds=[0,1]",
                                                                           "indexers=[gc, random]", "out=x y"])}))
    cfg = _run_config(tmp_path, json.loads((tmp_path / "report.json").read_text()))
    assert list(cfg.seeds) == [0, 1] and list(cfg.indexers) == ["gc", "random"]


def test_a_resumed_run_is_checked_stage_by_stage_and_its_total_is_not_compared(tmp_path):
    """A run carried to a second lease: its report's seconds and outside accounts are the last invocation's, the
    stages an earlier one made are marked reused. Each stage row keeps its own seconds; the total and outside rows
    are not set against the whole run's plan (n/a), and a note says why; no reports factor comes of them."""
    from gdr.plan import check_run, format_check

    (tmp_path / "runs").mkdir()
    runs = _runs(tmp_path / "runs", 0.2)
    cfg = load_config("run", ["+experiment=demo", "seeds=[0]"])
    names = ["score", "cluster", "index-gc-s0", "index-hkmi-s0", "bm25", "doc-queries",
             *(f"{k}-{m}-s0" for m in cfg.indexers for k in ("train", "eval"))]
    stages = [{"name": n, "seconds": 10.0, "reused": not n.endswith("-s0") or n.startswith("index")} for n in names]
    run = _finished_run(tmp_path / "run", cfg, {
        "command": "gdr run +experiment=demo seeds=[0]", "seconds": 45.0, "n_docs": 80, "stages": stages,
        "outside_stages": {"seconds": 5.0, "lm_load": 0.0, "report_rewrites": 2.0, "other": 3.0},
        "partial": {"retrievers_done": 1, "retrievers": 2}})
    check = check_run(run, "h200", folder=runs)
    rows = {r[0]: r for r in check.rows}
    assert rows["total"][3] is None and rows["outside stages"][3] is None and rows["score"][3] == 10.0
    assert any(n.startswith("resumed: 6 of 10 stages were made by an earlier invocation") for n in check.notes)
    assert any(n.startswith("partial: 1 of 2 retrievers finished") for n in check.notes)
    assert "reports" not in check.factors and "scoring" in check.factors
    assert "n/a" in next(line for line in format_check(check).splitlines() if line.startswith("total"))
