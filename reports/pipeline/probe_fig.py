# Demo-settings probe on BBC (100 articles without titles, J = 192): flat GC (K = 5) vs k-means on the same log P,
# over J (first J sampled queries whose source is among the first N documents), alpha = 0.25 and alpha = auto.
import json
import sys

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from gdr.cluster import GenerativeClustering, effective_sample_size
from gdr.data import load_corpus
from gdr.eval.baselines import run_baselines
from gdr.eval.clustering import clustering_scores

matplotlib.use("Agg")
run, out = sys.argv[1], sys.argv[2]
P = np.load(f"{run}/P.npy").astype(np.float32)
c = load_corpus("bbc", n_docs=100, seed=0)
y = np.asarray(c.labels)
src = np.array([json.loads(l)["source_index"] for l in open(f"{run}/queries.jsonl")])
rows_out = []
for N in (60, 80, 100):
    rows = np.arange(N)
    allc = np.flatnonzero(np.isin(src, rows))
    for J in (48, 64, 96, 128, 192):
        if J > len(allc):
            continue
        lp = P[np.ix_(rows, allc[:J])]
        rec = {"N": N, "J": J}
        for name, a in (("gc_0.25", 0.25), ("gc_auto", "auto")):
            sh, ar, al = [], [], []
            for seed in range(5):
                g = GenerativeClustering(5, alpha=a, n_init=10, seed=seed).fit(lp)
                sh.append(np.bincount(g.labels_, minlength=5).max() / N)
                ar.append(clustering_scores(y[rows], g.labels_)["ari"])
                al.append(g.alpha_)
            rec[name] = {"largest_share": round(float(np.mean(sh)), 3), "ari": round(float(np.mean(ar)), 1),
                         "alpha": round(float(al[0]), 4),
                         "mean_ess": round(float(effective_sample_size(lp, al[0], upper=g.clip_upper_).mean()), 1)}
        km = run_baselines(None, lp, 5, n_init=10, repeats=5, seed=0, embed_model=None, y_true=y[rows])
        rec["kmeans_logp_ari"] = round(float(km["logp"].mean["ari"]), 1)
        rows_out.append(rec)
        print(json.dumps(rec), flush=True)
json.dump(rows_out, open(f"{out}/probe-bbc100.json", "w"), indent=1)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
for ax, N in zip(axes, (80, 100)):
    r = [x for x in rows_out if x["N"] == N]
    J = [x["J"] for x in r]
    ax.plot(J, [x["gc_0.25"]["ari"] for x in r], "o-", label="GC, alpha = 0.25 (paper)")
    ax.plot(J, [x["gc_auto"]["ari"] for x in r], "s-", label="GC, alpha = auto (ESS = J/2)")
    ax.plot(J, [x["kmeans_logp_ari"] for x in r], "^--", label="k-means on the same log P")
    ax2 = ax.twinx()
    ax2.plot(J, [x["gc_0.25"]["largest_share"] for x in r], ":", color="gray")
    ax2.plot(J, [x["gc_auto"]["largest_share"] for x in r], ":", color="black")
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("largest cluster share (dotted)")
    ax.set_xlabel("J (sampled queries)")
    ax.set_ylabel("ARI (%) vs topics")
    ax.set_ylim(0, 100)
    ax.set_title(f"BBC, {N} articles, K = 5")
axes[0].legend(fontsize=8, loc="upper left")
fig.tight_layout()
fig.savefig(f"{out}/probe-bbc100.png", dpi=110)
