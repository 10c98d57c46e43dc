"""The report's section on the query generator of a ``gdr run`` with ``qg.enabled``: the fine-tuned generator's
held-out loss on the run's dev split (``qg.pairs=titles``: on held-out documents' titles) against the two-shot
prompt's on the same pairs, and the flat clustering's
ACC/NMI/ARI with each generator (``qg.compare_two_shot``). Kept apart from :func:`gdr.stages.report.write_report`:
it adds its section to the files that function wrote."""
from __future__ import annotations

import json
from pathlib import Path

from gdr.io import atomic_write_text

__all__ = ["generator_summary", "generator_lines", "add_generator_section"]

_CLUSTER_KEYS = ("gc_acc", "gc_nmi", "gc_ari", "logp_kmeans_acc", "logp_kmeans_nmi", "logp_kmeans_ari")


def generator_summary(qg: dict, cluster_tuned: dict | None, cluster_two_shot: dict | None) -> dict:
    """What the report says of the generator: ``qg`` is the qg stage's info (its pairs, the held-out losses);
    ``cluster_*`` the flat clustering's headline (:func:`gdr.stages.report.cluster_headline`) with the fine-tuned
    and with the two-shot generator, or None where that clustering did not run."""
    def pick(c):
        return None if c is None else {k: c[k] for k in _CLUSTER_KEYS if k in c}

    return {"pairs": qg.get("pairs"), "held_out": qg.get("held_out"), "global_step": qg.get("global_step"),
            "n_train": qg.get("n_train"), "n_checkpoint_dev": qg.get("n_checkpoint_dev"),
            "cluster": {"fine_tuned": pick(cluster_tuned), "two_shot": pick(cluster_two_shot)}}


def generator_lines(summary: dict) -> list[str]:
    """The section's markdown lines."""
    pairs = summary.get("pairs") or {}
    titles = pairs.get("source") == "titles"
    what = (f"(document, its own title) pairs of the corpus ({pairs.get('documents', '?')} documents, each read "
            "without its title; no query of the run)" if titles else
            f"(document, query) pairs of the training split only ({pairs.get('documents', '?')} documents; no dev or "
            "test query, nor its pairing)")
    n_train, n_pick = summary.get("n_train"), summary.get("n_checkpoint_dev") or 0
    picked = f" ({n_pick} more of them held out to pick the checkpoint)" if n_pick else ""
    lines = ["## Query generator", "",
             f"Fine-tuned in the run on {n_train if n_train is not None else pairs.get('pairs', '?')} {what}{picked}, "
             f"{summary.get('global_step', '?')} steps. P's queries, P and the retrievers' generated training "
             "queries come from it.", ""]
    held = summary.get("held_out") or {}
    if held.get("n_pairs"):
        where = (f"the titles of {held['n_pairs']} held-out documents (never trained on, nor used to pick the "
                 "checkpoint)" if titles else f"the run's dev split ({held['n_pairs']} pairs)")
        lines += [f"Held-out loss on {where}:", "",
                  "| generator | loss per query token | NLL per query |", "|---|---|---|"]
        for name, key in (("two-shot prompt (base model)", "two_shot"), ("fine-tuned", "fine_tuned")):
            r = held.get(key) or {}
            lines.append(f"| {name} | {r.get('loss_per_token', float('nan')):.4f} | "
                         f"{r.get('nll_per_query', float('nan')):.3f} |")
        lines.append("")
    else:
        lines += ["No held-out pairs: no held-out loss.", ""]
    cl = summary.get("cluster") or {}
    if cl.get("fine_tuned") or cl.get("two_shot"):
        lines += ["Flat clustering against the labels with each generator (mean over repeats):", "",
                  "| generator | GC ACC | GC NMI | GC ARI | k-means (log P) ACC | NMI | ARI |",
                  "|---|---|---|---|---|---|---|"]
        for name, key in (("two-shot prompt (base model)", "two_shot"), ("fine-tuned", "fine_tuned")):
            c = cl.get(key)
            if c:
                cells = " | ".join(f"{c[k]:.2f}" if k in c else "-" for k in _CLUSTER_KEYS)
                lines.append(f"| {name} | {cells} |")
        lines.append("")
    return lines


def add_generator_section(root: Path, report: dict, summary: dict) -> dict:
    """Add the section to ``root``'s report.md and ``generator`` to its report.json (both as
    :func:`gdr.stages.report.write_report` just wrote them); returns the report with it."""
    root = Path(root)
    md = root / "report.md"
    text = md.read_text(encoding="utf-8") if md.exists() else ""
    atomic_write_text(md, text.rstrip("\n") + "\n\n" + "\n".join(generator_lines(summary)))
    report = {**report, "generator": summary}
    atomic_write_text(root / "report.json", json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
    return report
