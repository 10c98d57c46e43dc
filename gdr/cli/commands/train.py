"""``gdr train``: compose ``conf/train.yaml``, call :func:`gdr.stages.train.train_retriever`."""
from __future__ import annotations

import shlex

from gdr.cli.common import compose, corpus_and_queries, next_command
from gdr.config import save_config
from gdr.stages.settings import TrainSettings
from gdr.stages.train import check_train_inputs, train_retriever
from gdr.upgrade import refuse_format_0_training


def train_main(argv: list[str]) -> int:
    # a bad docids.tsv or generated-queries file is refused before out_dir is made (it held only config.yaml)
    cfg = compose("train", argv, before_claim=lambda cfg: check_train_inputs(cfg.docids, cfg.get("generated")))
    c, out, corpus, qs = corpus_and_queries(cfg)
    settings = TrainSettings.from_config({k: c[k] for k in ("examples", "model", "model_presets", "optim", "trainer",
                                                          "seed")})
    refuse_format_0_training(out, bool(settings.trainer.resume))
    # config.yaml is written once out_dir is known to hold no other training (trained_on.json)
    res = train_retriever(corpus, c["docids"], out, settings, queries=qs, generated=c.get("generated"),
                          write_config=lambda folder: save_config(cfg, folder))
    print(f"model: {res.model_dir}  best {res.monitor}: {res.best_score}  steps: {res.global_step}")
    evaluate = next_command(argv, "evaluate", f"run_dir={out}", keep=("data", "queries"))
    print(f"next: evaluate it on the test queries, `{evaluate}`, or search it, "
          f"`gdr search \"a query\" run_dir={shlex.quote(str(out))}`")
    return 0
