"""``gdr qg``: fine-tune a query generator on (document, query) pairs; see ``conf/qg.yaml``."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from gdr.cli.common import compose, lm_settings
from gdr.config import save_config, to_container
from gdr.io import atomic_write_json
from gdr.lm import PromptConfig
from gdr.stages.qg import build_pairs
from gdr.stages.settings import QGQueries, QGSection, section_from
from gdr.training.qg import fine_tune_qg

log = logging.getLogger(__name__)


def qg_main(argv: list[str]) -> int:
    cfg = compose("qg", argv)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out, "qg.config.yaml")
    t0 = time.time()
    qg = section_from(QGSection, to_container(cfg.qg), "qg")  # checked at the door (compose), typed once
    pairs, info = build_pairs(qg, to_container(cfg.data), section_from(QGQueries, to_container(cfg.queries), "queries"),
                              seed=int(cfg.seed))
    if len(pairs) == 0:
        raise SystemExit(f"qg.pairs={qg.pairs}: no training pairs left (after qg.exclude / the split filter)")
    lm = lm_settings(cfg).build()
    if not lm.is_seq2seq and lm.prompt.shots:
        p = lm.prompt
        lm.prompt = PromptConfig(style=p.style, prefix=p.prefix, system=p.system, user=p.user,
                                 shots=[list(s) for s in p.shots[:qg.shots]])
    atomic_write_json(out / "pairs.manifest.json", {**info, "examples": [
        {"doc": d[:200], "query": q} for d, q in zip(pairs.docs[:5], pairs.queries[:5])]})
    log.info("qg pairs: %s", info)
    res = fine_tune_qg(out, lm, pairs, qg.train, dev_fraction=qg.dev_fraction, dev_max=qg.dev_max,
                       seed=int(cfg.seed))
    manifest = {"command": "qg", "base_model": cfg.model.name, "model_dir": str(res.model_dir),
                "prompt": lm.describe()["prompt"], "max_doc_tokens": lm.max_doc_tokens, "pairs": info,
                "n_train": res.n_train, "n_dev": res.n_dev, "n_params": res.n_params, "global_step": res.global_step,
                "dev_loss_per_token_before": res.dev_loss_before, "dev_loss_per_token": res.dev_loss,
                "dev_nll_per_query_before": res.dev_nll_per_query_before, "dev_nll_per_query": res.dev_nll_per_query,
                "seconds": round(time.time() - t0, 1)}
    atomic_write_json(out / "qg.manifest.json", manifest)
    print(json.dumps({k: manifest[k] for k in ("model_dir", "n_train", "n_dev", "global_step",
                                               "dev_loss_per_token_before", "dev_loss_per_token", "seconds")}))
    return 0
