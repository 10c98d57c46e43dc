"""Generative clustering of documents (the paper's Algorithm 1).

Input is ``logp = log P`` of shape (n_docs, n_queries): ``logp[i, j] = log p(y_j | x_i)`` for J
texts sampled once from the generative LM. The pipeline, with the paper's equation names:

1. Eq. clip      ``clip_logp``      per column, values above ``mu_j + 5 sigma_j`` are set to that bound.
2. Eq. vmp       ``log_proposal``   ``log phi_j = (logsumexp_i(2 alpha logp_ij) - log N) / (2 alpha)``.
3. weights       ``log_weights``    ``log W_ij = alpha (logp_ij - log phi_j)``.
4. Eq. ris       ``distortion_matrix``  ``d(x_i, k) = (1/J) sum_j W_ij (logp_ij - log c_kj)``.
5. Eqs. init / optim-centroid and the two-step loop: ``fit_generative`` / ``GenerativeClustering``.

Numerics
--------
Everything is kept in the log domain until the last moment. The kernel factorises each row of W
exactly as ``W_ij = exp(r_i) * V_ij`` with ``r_i = max_j log W_ij`` (float64) and
``V_ij = exp(log W_ij - r_i)`` in (0, 1] (the kernel dtype). This is *not* a row rescaling that
is forgotten: ``exp(r_i)`` is carried along exactly, so

* assignment ``argmin_k d(x_i, k) = argmax_k V_i . log c_k`` only needs V (a row factor never
  changes a row's argmin), and every row has an entry equal to 1, so no row underflows to zeros;
* the centroid update weighs each document by ``exp(r_i - R_k)`` (``R_k`` = largest ``r_i`` in
  cluster k), which is Eq. optim-centroid up to the per-cluster factor ``exp(R_k)`` that the
  normalisation removes;
* distortions are assembled in float64 as ``exp(r_i) / J * (a_i - V_i . log c_k)`` with
  ``a_i = sum_j V_ij logp_ij``.

With this factorisation float32 (the default ``dtype``) never overflows, underflows a row to zeros
or produces NaN for log-probabilities anywhere in float range (tested with ``logp`` in [-400, -50]
and alpha = 1); ``dtype=torch.float64`` doubles the cost and is used by the equation tests. Entries
that underflow (``V_ij`` or ``c_kj`` below the dtype's smallest normal number, i.e. ``exp(-87)``
relative to the row maximum in float32) count as zero weight; ``log c`` is floored at ``log(tiny)``
so that ``0 * log 0`` never produces NaN. At the default alpha = 0.25 a row's log W spans a quarter
of its log P range and float32 gives float64's labels; at alpha = 1 on rows of log P wider than
~87 nats (a 187-nat median spread in [-400, -50]) the dropped entries are real weight, and the
labels of the two dtypes differ (ARI 0.42-0.77 over 5 seeds) at distortions neither dtype wins:
reproduce an alpha = 1 ablation with ``dtype=torch.float64``.

Empty clusters: when an assignment step leaves a cluster empty, it is re-seeded (as scikit-learn
does) with the document of largest current distortion taken from a cluster that keeps at least
one member; that document becomes the cluster's only member, so the new centroid is its normalised
W row. This never increases the total distortion: for a single document, its own normalised W row
is the distortion-minimising centroid (Eq. optim-centroid with one member).

Stopping: after each iteration (assign, update, total distortion as in Algorithm 1) the loop stops
when no label changed, when the relative improvement ``(D_prev - D) / |D_prev|`` is below ``tol``,
or after ``max_iter`` iterations. A final assignment with the final centroids makes ``labels``
consistent with ``log_centroids`` (as scikit-learn's k-means does), unless that would empty a
cluster. Model selection: the run with the lowest total distortion among ``n_init`` (no labels).

Seeding and split/merge moves (the default; ``init="random"`` is the paper's Eq. init)
-------------------------------------------------------------------------------------
The two-step loop stops in local optima: on the planted benchmark (``gdr.bench.clustering``)
the planted partition had a lower total distortion than every fitted run from random seeds. The
default ``init="greedy-k-means++"`` seeds as scikit-learn's greedy k-means++: at each step
``2 + floor(ln K)`` candidates are drawn with probability proportional to ``excess_i^2``, where
``excess_i = min_k d(x_i, k) - d(x_i, own row)`` (d at the document's own normalised W row is the
smallest distortion any centroid can give it), and the candidate that lowers the total distortion
most is kept. After the best of ``n_init`` runs is selected, split/merge moves (``split_merge``)
merge the pair of clusters whose union raises the distortion least (computed exactly from the
per-cluster W sums) and split in two the other cluster whose split lowers it most (all K clusters
are split at once as one 2K-cluster problem: greedy k-means++ with two seeds per cluster and the
two-step loop; best of three draws), whenever the predicted net change is a decrease; the loop
then resumes from the new partition, and the move is kept if the total distortion ends lower.
Every choice compares total distortions only; labels are never used.

Modules: :mod:`~gdr.cluster.equations` (the equations in numpy, float64, streamed), :mod:`~gdr.cluster.engine`
(the torch engine: W per row on the device, the seedings, the two-step loop), :mod:`~gdr.cluster.split_merge` (the
split/merge moves), :mod:`~gdr.cluster.estimator` (``fit_generative``, ``GenerativeClustering``,
``describe_clusters``); this package re-exports what the rest of gdr and the tests read.
"""
from __future__ import annotations

from gdr.cluster.engine import (  # noqa: F401  (the _private ones: the tests read them)
    GC_KERNEL,
    _greedy_probs,
    _init_greedy_kmeanspp,
    _kmeanspp_probs,
    _lloyd_from,
    cluster_sums,
    log_normalise,
    prepare_fit,
    torch_dtype,
    total_distortion,
)
from gdr.cluster.equations import (
    INITS,
    as_2d_float,
    auto_alpha,
    centroid_update,
    check_n_clusters,
    clip_bounds,
    clip_bounds_unchecked,
    clip_logp,
    distortion_matrix,
    effective_sample_size,
    log_proposal,
    log_proposal_unchecked,
    log_weights,
    resolve_alpha,
)
from gdr.cluster.estimator import (
    GCResult,
    GenerativeClustering,
    NotFittedError,
    describe_clusters,
    fit_generative,
    fit_prepared,
    init_centroids,
    use_split_merge,
)
from gdr.cluster.split_merge import _merge_costs, _split_gains, _split_merge  # noqa: F401  (the tests read them)

__all__ = [
    "GC_KERNEL",
    "GCResult",
    "GenerativeClustering",
    "NotFittedError",
    "auto_alpha",
    "effective_sample_size",
    "resolve_alpha",
    "centroid_update",
    "clip_bounds",
    "clip_logp",
    "describe_clusters",
    "distortion_matrix",
    "fit_generative",
    "init_centroids",
    "log_proposal",
    "log_weights",
    "INITS",
    "as_2d_float",
    "check_n_clusters",
    "clip_bounds_unchecked",
    "cluster_sums",
    "fit_prepared",
    "log_normalise",
    "log_proposal_unchecked",
    "prepare_fit",
    "torch_dtype",
    "total_distortion",
    "use_split_merge",
]
