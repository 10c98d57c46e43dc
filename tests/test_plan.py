"""`gdr plan` (gdr/plan.py): per-stage seconds and peak memory from the cost model and the committed GPU figures."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gdr import cost
from gdr.config import load_config
from gdr.plan import DEVICES, LM_LOAD_S, StagePlan, _meta_lm, format_plan, measured_figures, plan_run, predict
from gdr.training.concurrent import concurrent_for_memory

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
    """``train.concurrent: auto`` (bbc.yaml's) takes the run's rule, gdr.training.concurrent.concurrent_for_memory, at
    the device's memory: more retrievers at once on an H200 than on an H100, each with its own memory."""
    import gdr.plan

    asked = []

    def rule(config, batch, free, n_jobs):
        asked.append((batch, free, n_jobs))
        return concurrent_for_memory(config, batch, free, n_jobs)

    monkeypatch.setattr(gdr.plan, "concurrent_for_memory", rule)
    assert load_config("run", ["+experiment=bbc"]).train.concurrent == "auto"
    h200, h100 = _training(tmp_path, device="h200"), _training(tmp_path, device="h100")
    assert [(b, n) for b, _, n in asked] == [(1024, 12), (1024, 12)]
    assert asked[0][1] == cost.device_peaks("H200").memory and asked[1][1] == cost.device_peaks("H100").memory
    n200, n100 = (int(re.search(r"(\d+) at once \(auto", s.basis).group(1)) for s in (h200, h100))
    assert n200 > n100 >= 1
    assert h200.peak_bytes / n200 == pytest.approx(h100.peak_bytes / n100)


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
