# One table of the recipe ablation from the runs of reports/ablation/run.sh:
#   python reports/ablation/table.py reports/ablation.md runs/abl-base runs/abl-gen0 ...
# Per (variant, docid scheme): Recall@1 and MRR@100 (in %, seeds averaged per test query) with 95% bootstrap
# intervals over the test queries, the paired difference to the baseline recipe (same scheme; 95% paired
# bootstrap interval, paired permutation p), GC vs HKmI within the variant (p of Recall@1), the seeds, the
# steps trained and the seconds of the scheme's train + eval stages.
import json
import sys
from pathlib import Path

import numpy as np

from eval.compare import mean_interval, paired_test
from eval.retrieval import PER_QUERY_FILE, per_query_metrics, read_per_query

out_md, runs = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]


def load(run: Path) -> dict:
    rep = json.loads((run / "report.json").read_text())
    stages = {s["name"]: s for s in rep["stages"]}
    res = {"command": rep["command"], "seconds": rep["seconds"], "comparisons": rep.get("comparisons") or [],
           "schemes": {}}
    for scheme in ("gc", "hkmi", "bm25"):
        names = ["bm25"] if scheme == "bm25" else sorted(n for n in stages if n.startswith(f"eval-{scheme}-s"))
        if not names or names[0] not in stages:
            continue
        qids, rows, secs, steps = None, [], 0.0, []
        for n in names:
            q, first = read_per_query(run / stages[n]["folder"] / PER_QUERY_FILE)
            qids = qids or q
            assert q == qids, f"{run}: {n} scored other queries"
            rows.append(per_query_metrics(first))
            secs += stages[n]["seconds"]
            tr = n.replace("eval-", "train-")
            if tr in stages:
                secs += stages[tr]["seconds"]
                info = json.loads((run / stages[tr]["folder"] / "stage.json").read_text()).get("info", {})
                steps.append(info.get("global_step"))
        res["schemes"][scheme] = {"qids": qids, "seeds": len(names), "seconds": round(secs, 1), "steps": steps,
                                  **{m: np.mean([r[m] for r in rows], axis=0) for m in ("recall@1", "mrr@100")}}
    return res


data = {r.name.removeprefix("abl-"): load(r) for r in runs}
base = data.get("base")
lines = ["| variant | docids | seeds | steps | R@1 (95% CI) | MRR@100 (95% CI) | R@1 vs base: diff [CI], p "
         "| MRR vs base: diff [CI], p | GC vs HKmI R@1: diff, p | seconds (train + eval) |",
         "|---|---|---|---|---|---|---|---|---|---|"]
summary = {}
for v, d in data.items():
    for scheme, s in d["schemes"].items():
        if scheme == "bm25" and v != "base":
            continue
        cells = []
        for m in ("recall@1", "mrr@100"):
            mu, lo, hi = mean_interval(100 * s[m])
            cells.append(f"{mu:.1f} [{lo:.1f}, {hi:.1f}]")
            summary.setdefault(v, {}).setdefault(scheme, {})[m] = [round(mu, 2), round(lo, 2), round(hi, 2)]
        vs = []
        for m in ("recall@1", "mrr@100"):
            if base is None or v == "base" or scheme not in base["schemes"] or scheme == "bm25":
                vs.append("")
                continue
            b = base["schemes"][scheme]
            pos = {q: i for i, q in enumerate(b["qids"])}
            idx = [pos[q] for q in s["qids"]]
            diff, lo, hi, p = paired_test(100 * s[m], 100 * b[m][idx])
            vs.append(f"{diff:+.1f} [{lo:+.1f}, {hi:+.1f}], p = {p:.2g}")
            summary[v][scheme][f"{m}_vs_base"] = {"diff": round(diff, 2), "ci95": [round(lo, 2), round(hi, 2)],
                                                  "p_value": round(p, 4)}
        gh = next((c for c in d["comparisons"] if c["a"] == "gc" and c["b"] == "hkmi" and c["metric"] == "recall@1"),
                  None)
        ghs = f"{gh['diff']:+.1f}, p = {gh['p_value']:.2g}" if gh and scheme == "gc" else ""
        steps = "/".join(str(x) for x in s["steps"]) if s["steps"] else ""
        lines.append(f"| {v} | {scheme} | {s['seeds']} | {steps} | {cells[0]} | {cells[1]} | {vs[0]} | {vs[1]} | {ghs} "
                     f"| {s['seconds']:.0f} |")
cmds = ["", "Commands (each variant's `gdr run`, wall seconds of the whole invocation incl. reused stages):", ""]
for v, d in data.items():
    cmds.append(f"- {v} ({d['seconds']:.0f} s): `{d['command']}`")
out_md.write_text("\n".join(lines + cmds) + "\n", encoding="utf-8")
out_md.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
print("\n".join(lines + cmds))
