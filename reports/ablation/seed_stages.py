# Put the ablation's precomputed P (a finished score stage) and generated training queries (pregen.py) where
# `gdr run <overrides>` looks for its score and doc-queries stages, so each variant (its own out= folder, so
# that variants run side by side) continues from them; the store re-checks both against their manifests:
#   python reports/ablation/seed_stages.py <score stage folder> <pregen folder> <gdr run overrides>
import json
import shutil
import sys
from pathlib import Path

from gdr.config import load_config, to_container
from gdr.data import corpus_from_config
from gdr.pipeline import corpus_signature, doc_queries_inputs, stage_key

score_src, dq_src, argv = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
cfg = load_config("run", argv)
sig = corpus_signature(corpus_from_config(to_container(cfg.data)))
out = Path(cfg.out)
out.mkdir(parents=True, exist_ok=True)
if (score_src.is_dir() and not (out / score_src.name).exists()
        and json.loads((score_src / "stage.json").read_text()).get("status") == "complete"):
    shutil.copytree(score_src, out / score_src.name, ignore=shutil.ignore_patterns(".gdr.lock"))
if int(cfg.doc_queries.per_doc) > 0:
    dst = out / f"doc-queries-{stage_key(json.loads(json.dumps(doc_queries_inputs(cfg, sig), default=str)))}"
    if json.loads((dq_src / "doc_queries.manifest.json").read_text()).get("status") != "complete":
        sys.exit(f"{dq_src}: the generated queries are not finished yet (precompute.sh)")
    dst.mkdir(parents=True, exist_ok=True)
    for f in ("doc_queries.jsonl", "doc_queries.manifest.json"):
        shutil.copy2(dq_src / f, dst / f)
    print(dst)
