"""Collect ``metrics*.json`` of ``gdr cluster`` runs into one markdown table and a bar plot.

    python -m gdr.eval.report runs/r5/metrics.json runs/r5/metrics.earn-acq.json --out reports/reuters
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

PAPER = {  # the paper's Table 2 (full data, doc2query T5-base), for orientation only
    "r5": {"GC": (79.1, 71.5, 69.1), "k-means (embedding:all-MiniLM-L12-v2, paper)": (76.7, 65.6, 58.6)},
    "earn-acq": {"GC": (96.1, 77.8, 84.9), "k-means (embedding:all-MiniLM-L12-v2, paper)": (86.9, 54.3, 54.5)},
}


def load(paths: list[str]) -> list[dict]:
    out = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            out.append(json.load(f))
    return out


def table(m: dict) -> str:
    lines = [f"### {m['dataset']}: {m['n_docs']} documents, J = {m['n_queries']}, K = {m['n_clusters']} "
             f"(mean (std) over {m['repeats']} repeats of best-of-{m['n_init']})", "",
             "| method | ACC | NMI | ARI |", "|---|---|---|---|"]
    for name, r in m["methods"].items():
        if r.get("mean"):
            lines.append(f"| {name} | " + " | ".join(f"{r['mean'][k]:.1f} ({r['std'][k]:.1f})"
                                                   for k in ("acc", "nmi", "ari")) + " |")
    for name, v in PAPER.get(m["dataset"], {}).items():
        lines.append(f"| *paper: {name}* | " + " | ".join(f"*{x}*" for x in v) + " |")
    return "\n".join(lines) + "\n"


def plot(ms: list[dict], path: Path) -> None:
    matplotlib.use("Agg")

    fig, axes = plt.subplots(1, len(ms), figsize=(6.5 * len(ms), 4.2), squeeze=False)
    for ax, m in zip(axes[0], ms):
        names = [n for n, r in m["methods"].items() if r.get("mean")]
        x = np.arange(len(names))
        for i, k in enumerate(("acc", "nmi", "ari")):
            ax.bar(x + (i - 1) * 0.27, [m["methods"][n]["mean"][k] for n in names], 0.27,
                   yerr=[m["methods"][n]["std"][k] for n in names], label=k.upper(), capsize=2)
        ax.set_xticks(x, [n.replace("k-means ", "km ").replace("embedding:", "") for n in names], rotation=30,
                      ha="right", fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_title(f"{m['dataset']} (N={m['n_docs']}, J={m['n_queries']})")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("--out", required=True, help="output prefix: writes <out>.md and <out>.png")
    args = ap.parse_args(argv)
    ms = load(args.metrics)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(table(m) for m in ms), encoding="utf-8")
    plot(ms, out.with_suffix(".png"))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
