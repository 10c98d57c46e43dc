# Put an already computed P (same settings, checked by the store's identity) where `gdr run` looks for its
# score stage, so the pipeline continues from it instead of recomputing 19,200 pairs.
import shutil, sys
from pathlib import Path
from gdr.config import load_config, to_container
from gdr.cli.run import stage_key, _keyed
from gdr.cli.score import load_data
from gdr.io import hash_strings
src, argv = Path(sys.argv[1]), sys.argv[2:]
cfg = load_config("run", argv)
corpus = load_data(cfg)
texts = corpus.model_inputs()
corpus_sig = {"data": to_container(cfg.data), "doc_ids": hash_strings(corpus.doc_ids), "texts": hash_strings(texts), "n_docs": len(corpus)}
import json
inputs = json.loads(json.dumps({"corpus": corpus_sig, "lm": to_container(cfg.model), "sample": _keyed(to_container(cfg.sample)), "score": _keyed(to_container(cfg.score))}, default=str))
dst = Path(cfg.out) / f"score-{stage_key(inputs)}"
dst.mkdir(parents=True, exist_ok=True)
for f in ["queries.jsonl", "queries.manifest.json", "P.npy", "P.manifest.json", "doc_ids.json"]:
    shutil.copy2(src / f, dst / f)
shutil.copytree(src / "P.shards", dst / "P.shards", dirs_exist_ok=True)
print(dst)
