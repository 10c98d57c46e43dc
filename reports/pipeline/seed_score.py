# Put an already computed P (same settings, checked by the store's identity) where `gdr run` looks for its
# score stage, so the pipeline continues from it instead of recomputing it:
#   python reports/pipeline/seed_score.py <folder with P.npy> <the gdr run overrides>
import json
import shutil
import sys
from pathlib import Path

from gdr.config import load_config, to_container
from gdr.data import corpus_from_config
from gdr.pipeline import corpus_signature, score_inputs, stage_key

src, argv = Path(sys.argv[1]), sys.argv[2:]
cfg = load_config("run", argv)
signature = corpus_signature(corpus_from_config(to_container(cfg.data)))
inputs = json.loads(json.dumps(score_inputs(cfg, signature), default=str))
dst = Path(cfg.out) / f"score-{stage_key(inputs)}"
dst.mkdir(parents=True, exist_ok=True)
for f in ["queries.jsonl", "queries.manifest.json", "P.npy", "P.manifest.json", "doc_ids.json"]:
    shutil.copy2(src / f, dst / f)
shutil.copytree(src / "P.shards", dst / "P.shards", dirs_exist_ok=True)
print(dst)
