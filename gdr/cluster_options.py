"""Generative clustering's options without torch (:mod:`gdr.cluster`): each default written once, the paper's.

:class:`gdr.cluster.GenerativeClustering` and the kernel's functions take their defaults from these fields, and so do
the settings built on them: the flat clustering's ``cluster.gc`` and ``cluster.*`` keys
(:class:`gdr.stages.settings.ClusterGC`, :class:`~gdr.stages.settings.ClusterSettings`) and the GC indexer's
``index.gc`` (:class:`gdr.indexing.options.GCOptions`).
"""
from __future__ import annotations

from dataclasses import dataclass

from gdr.rules import setting

__all__ = ["GCFitOptions"]


@dataclass
class GCFitOptions:
    """One generative clustering (Algorithm 1): clipping, the proposal, the weights' alpha and the two-step loop."""

    alpha: float | str = setting(0.25, "Eq. ris / vmp; auto = the largest alpha whose weights keep a mean effective "
                                       "sample size of ess_target * J")
    ess_target: float = setting(0.5, "alpha=auto: the mean ESS of the importance weights as a fraction of J")
    clip_sigma: float | None = setting(5.0, "Eq. clip: per column, values above mu_j + clip_sigma sigma_j are set "
                                            "to that bound; null = no clipping")
    phi: str = setting("power", "the proposal: power (Eq. vmp) | naive (column mean of P)")
    init: str = setting("greedy-k-means++", "greedy-k-means++ (+ split/merge moves) | random (Eq. init) | k-means++")
    n_init: int = setting(10, "runs per fit; the lowest total distortion wins (no labels used)")
    max_iter: int = setting(100, "iterations of the two-step loop at most")
    tol: float = setting(1e-6, "relative improvement of the total distortion below which the loop stops")
