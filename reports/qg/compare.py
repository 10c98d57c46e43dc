"""Side-by-side tables (and one figure) of `gdr cluster` metrics: two-shot prompt vs a `gdr qg` generator.

python reports/qg/compare.py --pair R5 TWO/metrics.json FT/metrics.json [--pair R2 ...] --md T.md --png F.png

Per data set: every GC variant and the log-P k-means baseline of each run (their P differs), and the text
baselines (tf-idf, MiniLM) once; those must agree between the runs (same documents, same seeds): checked.
"""
from __future__ import annotations

import argparse
import json
import sys

TEXT = ("k-means (tfidf)", "k-means (embedding:minilm-l6)")
KEYS = ("acc", "nmi", "ari")


def _row(name: str, m: dict) -> str:
    mean, std = m["mean"], m["std"]
    return f"| {name} | " + " | ".join(f"{mean[k]:.1f} ({std[k]:.1f})" for k in KEYS) + " |"


def rows(two: dict, ft: dict) -> list[tuple[str, dict]]:
    if (two["n_docs"], two["n_clusters"]) != (ft["n_docs"], ft["n_clusters"]):
        sys.exit(f"the runs differ in documents/clusters: {two['n_docs']}/{two['n_clusters']} vs "
                 f"{ft['n_docs']}/{ft['n_clusters']}")
    out = []
    for tag, run in (("two-shot", two), ("fine-tuned", ft)):
        out += [(f"{name}, {tag}", m) for name, m in run["methods"].items() if name not in TEXT]
    for name in TEXT:
        a, b = two["methods"].get(name), ft["methods"].get(name)
        if a is None or b is None:
            continue
        if any(abs(a["mean"][k] - b["mean"][k]) > 1e-6 for k in KEYS):
            sys.exit(f"{name} differs between the runs ({a['mean']} vs {b['mean']}): not the same documents")
        out.append((name, b))
    return out


def table(title: str, two: dict, ft: dict) -> str:
    lines = [f"**{title}**: {ft['n_docs']} documents, K = {ft['n_clusters']}, J = {two['n_queries']} (two-shot) / "
             f"{ft['n_queries']} (fine-tuned); mean (std) over {ft['repeats']} repeats of best-of-{ft['n_init']}",
             "", "| method | ACC | NMI | ARI |", "|---|---|---|---|"]
    lines += [_row(n, m) for n, m in rows(two, ft)]
    return "\n".join(lines) + "\n"


def figure(pairs: list[tuple[str, dict, dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(pairs), figsize=(5.5 * len(pairs), 4.2), squeeze=False)
    for ax, (title, two, ft) in zip(axes[0], pairs):
        keep = [(n, m) for n, m in rows(two, ft) if n.split(",")[0] in ("GC", "k-means (logp)") or n in TEXT]
        x = np.arange(len(KEYS))
        w = 0.8 / len(keep)
        for i, (n, m) in enumerate(keep):
            ax.bar(x + i * w - 0.4 + w / 2, [m["mean"][k] for k in KEYS], w, yerr=[m["std"][k] for k in KEYS],
                   label=n.replace("k-means (embedding:minilm-l6)", "k-means (MiniLM)"), capsize=2)
        ax.set_xticks(x, [k.upper() for k in KEYS])
        ax.set_title(f"{title} ({ft['n_docs']} docs, K={ft['n_clusters']})")
        ax.set_ylim(0, 100)
    axes[0][0].set_ylabel("percent")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs=3, action="append", metavar=("TITLE", "TWO_SHOT", "FINE_TUNED"), required=True)
    ap.add_argument("--md")
    ap.add_argument("--png")
    a = ap.parse_args()
    pairs = [(t, json.load(open(x)), json.load(open(y))) for t, x, y in a.pair]
    text = "\n".join(table(*p) for p in pairs)
    print(text)
    if a.md:
        open(a.md, "w").write(text)
    if a.png:
        figure(pairs, a.png)


if __name__ == "__main__":
    main()
