# One table of the recipe ablation from the runs of reports/ablation/run.sh (one folder per variant and seed):
#   python reports/ablation/table.py reports/ablation/table.md runs/abl-*-s*
# Per (variant, docid scheme): Recall@1 and MRR@100 (in %, seeds averaged per test query) with 95% bootstrap
# intervals over the test queries, the paired difference to the baseline variant (the first one named on the
# command line, same scheme; 95% paired bootstrap interval, paired permutation p), GC vs HKmI within the variant
# (Recall@1) where both ran, the seeds, the steps trained and the seconds of the scheme's train + eval stages.
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from gdr.eval.compare import mean_interval, paired_test
from gdr.eval.retrieval import PER_QUERY_FILE, per_query_metrics, read_per_query

out_md, runs = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
METRICS = ("recall@1", "mrr@100")

by_variant: dict[str, list[Path]] = defaultdict(list)
for r in runs:
    if (r / "report.json").exists():
        by_variant[re.sub(r"-s\d+$", "", r.name.removeprefix("abl-"))].append(r)


def load(folders: list[Path]) -> dict:
    res = {"commands": [], "seconds": 0.0, "schemes": {}}
    per = defaultdict(lambda: {"rows": [], "qids": None, "seconds": 0.0, "steps": []})
    for run in folders:
        rep = json.loads((run / "report.json").read_text())
        res["commands"].append((rep["command"], rep["seconds"]))
        stages = {s["name"]: s for s in rep["stages"]}
        for name, st in stages.items():
            m = re.fullmatch(r"eval-(\w+)-s\d+", name)
            scheme = m.group(1) if m else ("bm25" if name == "bm25" else None)
            if scheme is None or (scheme == "bm25" and per["bm25"]["rows"]):
                continue
            q, first = read_per_query(run / st["folder"] / PER_QUERY_FILE)
            d = per[scheme]
            if d["qids"] is None:
                d["qids"] = q
            pos = {x: i for i, x in enumerate(q)}
            d["rows"].append(per_query_metrics(first[[pos[x] for x in d["qids"]]]))
            d["seconds"] += st["seconds"]
            tr = name.replace("eval-", "train-")
            if tr in stages:
                d["seconds"] += stages[tr]["seconds"]
                info = json.loads((run / stages[tr]["folder"] / "stage.json").read_text()).get("info", {})
                d["steps"].append(info.get("global_step"))
    for scheme, d in per.items():
        res["schemes"][scheme] = {"qids": d["qids"], "seeds": len(d["rows"]), "seconds": d["seconds"],
                                  "steps": d["steps"],
                                  **{m: np.mean([r[m] for r in d["rows"]], axis=0) for m in METRICS}}
    return res


data = {v: load(f) for v, f in by_variant.items()}
base_name = next(iter(data))
base = data[base_name]
lines = [f"| variant | docids | seeds | steps | R@1 (95% CI) | MRR@100 (95% CI) | R@1 vs {base_name}: diff [CI], p "
         f"| MRR@100 vs {base_name}: diff [CI], p | seconds (train + eval, all seeds) |",
         "|---|---|---|---|---|---|---|---|---|"]
summary: dict = {}
for v, d in data.items():
    for scheme, s in d["schemes"].items():
        if scheme == "bm25" and v != base_name:
            continue
        cells, vs = [], []
        for m in METRICS:
            mu, lo, hi = mean_interval(100 * s[m])
            cells.append(f"{mu:.1f} [{lo:.1f}, {hi:.1f}]")
            summary.setdefault(v, {}).setdefault(scheme, {})[m] = [round(mu, 2), round(lo, 2), round(hi, 2)]
            if v == base_name or scheme == "bm25" or scheme not in base["schemes"]:
                vs.append("")
                continue
            b = base["schemes"][scheme]
            pos = {q: i for i, q in enumerate(b["qids"])}
            diff, lo, hi, p = paired_test(100 * s[m], 100 * b[m][[pos[q] for q in s["qids"]]])
            vs.append(f"{diff:+.1f} [{lo:+.1f}, {hi:+.1f}], p = {p:.2g}")
            summary[v][scheme][f"{m}_vs_{base_name}"] = {"diff": round(diff, 2), "ci95": [round(lo, 2), round(hi, 2)],
                                                         "p_value": round(p, 4)}
        steps = "/".join(str(x) for x in s["steps"]) if s["steps"] else ""
        lines.append(f"| {v} | {scheme} | {s['seeds'] if scheme != 'bm25' else ''} | {steps} | {cells[0]} | {cells[1]} "
                     f"| {vs[0]} | {vs[1]} | {s['seconds']:.0f} |")
cmds = ["", "Commands (each folder's `gdr run`; wall seconds of that invocation on this shared 2-core CPU):", ""]
for v, d in data.items():
    for c, sec in d["commands"]:
        cmds.append(f"- {v} ({sec:.0f} s): `{c}`")
out_md.write_text("\n".join(lines + cmds) + "\n", encoding="utf-8")
out_md.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
print("\n".join(lines + cmds))
