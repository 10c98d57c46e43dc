"""Options that more than one kernel reads, without torch: each default written once, here, at the floor below them.

- :class:`GCFitOptions`: generative clustering (:mod:`gdr.cluster`), the paper's defaults.
  :class:`gdr.cluster.GenerativeClustering`, the kernel's functions and the evaluation protocol take their defaults
  from these fields, and so do the settings built on them: the flat clustering's ``cluster.gc`` and ``cluster.*``
  keys (:class:`gdr.stages.settings.ClusterGC`, :class:`~gdr.stages.settings.ClusterSettings`) and the GC
  indexer's ``index.gc`` (:class:`gdr.indexing.options.GCOptions`).
- :class:`RankingOptions`: a ranked run of documents for each query: the retriever's constrained beam search
  (:mod:`gdr.training.search`), BM25 and the run files (:mod:`gdr.eval`), ``gdr evaluate``'s keys
  (:class:`gdr.stages.settings.EvaluateSettings`).
"""
from __future__ import annotations

from dataclasses import dataclass

from gdr.rules import POSITIVE, any_value, auto_or, device, number, one_of, optional, setting

__all__ = ["GCFitOptions", "RankingOptions"]


@dataclass
class GCFitOptions:
    """One generative clustering (Algorithm 1): clipping, the proposal, the weights' alpha and the two-step loop."""

    alpha: float | str = setting(0.25, "the weights' regularisation (Eq. ris / vmp; the paper uses 0.25); auto = the "
                                       "largest alpha whose weights keep a mean effective sample size of "
                                       "ess_target * J", effect="result",
                                 rule=auto_or(number(0, 1)),
                                 rule_help="GC's regularisation; the paper uses 0.25; auto = by effective sample size")
    ess_target: float = setting(0.5, "alpha=auto: the mean ESS of the importance weights as a fraction of J",
                                effect="result", rule=number(0, 1, hi_open=True),
                                rule_help="alpha=auto's mean ESS as a fraction of J")
    clip_sigma: float | None = setting(5.0, "Eq. clip: per column, values above mu_j + clip_sigma sigma_j are set "
                                            "to that bound; null = no clipping", effect="result",
                                       rule=optional(number(0)), rule_help="clipping at mu + n sigma; null = none")
    phi: str = setting("power", "the proposal: power (Eq. vmp) | naive (column mean of P)", effect="result",
                       rule=one_of("power", "naive"), rule_help="the proposal phi")
    init: str = setting("greedy-k-means++", "greedy-k-means++ (+ split/merge moves) | random (Eq. init) | k-means++",
                        effect="result", rule=one_of("greedy-k-means++", "random", "k-means++"))
    n_init: int = setting(10, "runs per fit; the lowest total distortion wins (no labels used)", effect="result",
                          rule=POSITIVE, rule_help="runs per fit")
    max_iter: int = setting(100, "iterations of the two-step loop at most", effect="result", rule=POSITIVE)
    tol: float = setting(1e-6, "relative improvement of the total distortion below which the loop stops",
                         effect="result", rule=number(0, lo_open=False))
    device: str = setting("cpu", "the torch device of the kernel", effect="result", rule=device("cpu"))


@dataclass
class RankingOptions:
    """A ranked run: how deep, how it is searched and how a run file names it."""

    k: int = setting(100, "results per query (run file depth)", effect="result", rule=POSITIVE)
    beam: int = setting(100, "beams of the constrained beam search over the docid trie", effect="result", rule=POSITIVE,
                        rule_help="beam width")
    length_penalty: float = setting(1.0, "a docid scores log p / length**length_penalty (matters where codes differ "
                                         "in length)", effect="result",
                                    rule=number(), rule_help="a docid scores log p / length**length_penalty")
    tag: str = setting("gdr", "the run's name in its TREC run file", effect="result", rule=any_value)
