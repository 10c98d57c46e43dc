"""Hierarchical GC indexing (Algorithm 2) and the baseline indexers: small synthetic inputs, CPU, seconds."""
from __future__ import annotations

import json
import math
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from gdr.cluster import clip_bounds, clip_logp, log_proposal, log_weights
from gdr.indexing.docids import read_docids
from gdr.indexing.gc import (
    GCOptions,
    GCSplitter,
    bootstrap_columns,
    build_gc_index,
    resampling_log_probs,
    root_statistics,
    row_groups,
)
from gdr.indexing.kmeans import build_kmeans_index, query_mean_embeddings, tfidf_svd_embeddings
from gdr.indexing.synthetic import planted_hierarchy, planted_logp, write_planted_npy
from gdr.indexing.tree import atomic_codes, balanced_labels, build_tree, check_prefix_code, densify_labels, random_tree
from gdr.store.rows import PMatrix

pytestmark = pytest.mark.cost(seconds=27)  # the file's tests in all, fast lane, 2 cores: dealt first

FAST = dict(n_init=2, n_init_inner=1, max_iter=30)


def gc_tree(x, K=6, c=6, seed=0, **opts):
    return build_gc_index(PMatrix(x), n_clusters=K, leaf_size=c, options=GCOptions(**{**FAST, **opts}), seed=seed,
                          progress=False)


def write_run(folder, x, doc_ids=None, qids=None):
    """A P-matrix run folder as `gdr score` writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "P.npy", x.astype(np.float16))
    doc_ids = doc_ids or [f"d{i}" for i in range(len(x))]
    (folder / "doc_ids.json").write_text(json.dumps(doc_ids))
    qids = qids or [f"q{j}" for j in range(x.shape[1])]
    (folder / "queries.jsonl").write_text("".join(
        json.dumps({"qid": q, "text": f"query {q}", "source_doc_id": doc_ids[0]}) + "\n" for q in qids))
    return folder


@pytest.fixture(scope="module")
def planted():
    h = planted_hierarchy(900, 192, n_top=5, n_sub=4, top_signal=8.0, sub_signal=5.0, seed=1)
    return h, planted_logp(h)


# --- the driver -------------------------------------------------------------------------------------------


def test_densify_drops_empty_clusters_and_renumbers():
    labels, kept = densify_labels(np.array([4, 4, 1, 1, 4]), 6)
    assert labels.tolist() == [1, 1, 0, 0, 1] and kept.tolist() == [1, 4]


def test_balanced_labels_groups():
    assert balanced_labels(10, 30, 3).tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]  # ceil(10/3) = 4 groups
    assert np.bincount(balanced_labels(5, 30, 30)).tolist() == [3, 2]            # at least 2 groups


def test_check_prefix_code_rejects_prefixes():
    check_prefix_code([(0, 1), (0, 2), (1,)], 3)
    with pytest.raises(ValueError, match="prefix"):
        check_prefix_code([(0,), (0, 1)])
    with pytest.raises(ValueError, match=">= K"):
        check_prefix_code([(0, 3)], 3)


def test_degenerate_splitter_always_terminates():
    """A splitter that puts everything in one cluster triggers the balanced fallback at every node."""
    def lump(rows, path, k):
        from gdr.indexing.tree import SplitResult
        return SplitResult(labels=np.full(len(rows), k - 1))

    tree = build_tree(1000, lump, n_clusters=4, leaf_size=3, progress=False)
    check_prefix_code(tree.codes, 4)
    assert tree.n_fallback == len(tree.internal_nodes) > 0
    assert tree.depth <= math.ceil(math.log(1000 / 3, 4)) + 2


# --- reading P --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["<f2", ">f4"])
def test_pmatrix_file_reads_match_the_array(tmp_path, monkeypatch, dtype):
    """Explicit reads (runs of nearby rows, bounded buffers) return exactly P[rows, :J] as float32."""
    import gdr.store.rows as pmatrix

    rng = np.random.default_rng(0)
    x = rng.standard_normal((301, 37)).astype(dtype)
    np.save(tmp_path / "P.npy", x)
    picks = [slice(None), slice(5, 299), slice(0, 0), slice(3, 100, 7), np.arange(301), np.array([0, 1, 2, 300]),
             np.sort(rng.choice(301, 100, replace=False)), np.r_[0:50, 52:90, 150:152, 290:301], np.array([7]),
             np.array([], dtype=np.int64)]
    # defaults, then tiny buffers (every run cut into 1-row spans), then merging across big gaps
    for buffer_bytes, merge_bytes in ((8 << 20, 32 << 10), (1, 1), (37 * 4 * 5, 37 * 4 * 30)):
        monkeypatch.setattr(pmatrix, "_BUFFER_BYTES", buffer_bytes)
        monkeypatch.setattr(pmatrix, "_MERGE_BYTES", merge_bytes)
        for n_cols in (37, 10):
            pm = PMatrix(tmp_path / "P.npy", n_cols=n_cols)
            for rows in picks:
                got = pm.read_rows(rows)
                assert got.dtype == np.float32
                np.testing.assert_array_equal(got, x[rows, :n_cols].astype(np.float32))
    np.save(tmp_path / "F.npy", np.asfortranarray(x))  # Fortran order: mapped per read, still correct
    np.testing.assert_array_equal(PMatrix(tmp_path / "F.npy").read_rows(np.array([1, 5])), x[[1, 5]].astype(np.float32))


def test_pmatrix_never_maps_a_c_ordered_file(tmp_path, monkeypatch):
    """Mapped pages count in ru_maxrss; reads of a C-ordered P.npy must not map it (nor load it whole)."""
    import mmap

    x = np.arange(60, dtype=np.float16).reshape(12, 5)
    np.save(tmp_path / "P.npy", x)

    def refuse(*a, **k):
        raise AssertionError("P.npy was mapped or loaded whole")

    monkeypatch.setattr(np, "load", refuse)
    monkeypatch.setattr(np, "memmap", refuse)
    monkeypatch.setattr(mmap, "mmap", refuse)
    pm = PMatrix(tmp_path / "P.npy")
    np.testing.assert_array_equal(pm.read_rows(np.array([0, 3, 11])), x[[0, 3, 11]].astype(np.float32))
    np.testing.assert_array_equal(next(pm.iter_rows(None, 5))[1], x[:5].astype(np.float32))


def test_pmatrix_rejects_a_truncated_file(tmp_path):
    np.save(tmp_path / "P.npy", np.zeros((10, 4), np.float16))
    data = (tmp_path / "P.npy").read_bytes()
    (tmp_path / "P.npy").write_bytes(data[:-8])
    with pytest.raises(ValueError, match="truncated"):
        PMatrix(tmp_path / "P.npy")


# --- GC indexing ------------------------------------------------------------------------------------------


def test_planted_top_level_is_recovered(planted):
    h, x = planted
    tree = gc_tree(x, K=5, c=5, n_init=10)
    check_prefix_code(tree.codes, 5)
    top = np.array([c[0] for c in tree.codes])
    assert adjusted_rand_score(h.top, top) > 0.95
    assert tree.n_fallback == 0


@pytest.mark.parametrize("n", [1, 5, 6, 7, 3, 250])
def test_codes_valid_on_random_inputs(n):
    x = np.random.default_rng(n).normal(-30, 3, size=(n, 40)).astype(np.float32)
    tree = gc_tree(x, K=6, c=6)  # n = 1, c (6), c+1 (7), N < K (3)
    check_prefix_code(tree.codes, 6)
    assert len(tree.codes) == n
    if n <= 6:
        assert tree.depth == 1 and sorted(c[0] for c in tree.codes) == list(range(n))
    else:
        assert tree.depth >= 2


def test_identical_rows_fall_back_and_stay_shallow():
    x = np.tile(np.linspace(-40, -10, 30, dtype=np.float32), (500, 1))
    tree = gc_tree(x, K=5, c=5)
    check_prefix_code(tree.codes, 5)
    assert tree.n_fallback == len(tree.internal_nodes) > 0
    assert tree.depth <= math.ceil(math.log(500 / 5, 5)) + 2  # balanced, not peeled K-1 at a time


def test_duplicate_documents_are_clustered_together(planted):
    h, x = planted
    x = np.concatenate([x[:300], x[:300], x[300:330]])  # each of the first 300 documents twice
    tree = gc_tree(x, K=6, c=6)
    check_prefix_code(tree.codes, 6)
    same_top = np.mean([tree.codes[i][0] == tree.codes[300 + i][0] for i in range(300)])
    assert same_top == 1.0


def test_row_groups_finds_identical_rows():
    x = np.array([[1, 2], [3, 4], [1, 2], [1, 2.0001]], dtype=np.float32)
    first, inverse, counts = row_groups(x)
    assert first.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2] and counts.tolist() == [2, 1, 1]


def test_row_groups_never_merges_distinct_rows_whose_hashes_collide(monkeypatch):
    import gdr.indexing.gc as gc_mod

    # every coefficient 1: the hash is the sum of the bit patterns, so a row and its permutation collide
    monkeypatch.setattr(gc_mod, "_HASH_COEF", np.ones(1 << 16, dtype=np.uint64))
    x = np.array([[-1, -2, -3], [-2, -1, -3], [-1, -2, -3], [-3, -2, -1]], dtype=np.float32)
    first, inverse, counts = row_groups(x, block_rows=2)
    assert first.tolist() == [0, 1, 3] and inverse.tolist() == [0, 1, 0, 2] and counts.tolist() == [2, 1, 1]
    # wider than the table of coefficients: columns j and j + 65,536 no longer share one
    wide = np.full((2, (1 << 16) + 1), -5.0, dtype=np.float32)
    wide[0, [0, -1]], wide[1, [0, -1]] = (-1.0, -2.0), (-2.0, -1.0)
    assert row_groups(wide)[2].tolist() == [1, 1]


def test_root_statistics_match_kernels_streamed(planted):
    _, x = planted
    for method in ("power", "naive"):
        st = root_statistics(PMatrix(x), clip_sigma=5.0, alpha=0.25, proposal=method, chunk_rows=97,
                             progress=False)
        np.testing.assert_allclose(st.clip_upper, clip_bounds(x, 5.0), rtol=1e-6)
        np.testing.assert_allclose(st.log_phi, log_proposal(clip_logp(x, 5.0), 0.25, method), atol=1e-5)
    clipped = PMatrix(x).read_rows(slice(None))
    np.minimum(clipped, st.clip_upper.astype(np.float32), out=clipped)
    np.testing.assert_allclose(clipped, clip_logp(x, 5.0), atol=1e-6)
    assert (clipped < x).sum() > 0  # the planted outliers are clipped


def test_localized_phi_at_root_is_global_phi_and_below_is_local(planted):
    _, x = planted
    tree = gc_tree(x, K=5, c=5)
    xc = clip_logp(x, 5.0)
    root = tree.nodes[0]
    np.testing.assert_allclose(root.state["log_phi"], log_proposal(xc, 0.25), atol=1e-4)
    np.testing.assert_array_equal(root.state["columns"], np.arange(x.shape[1]))  # no resampling at the root
    child = next(n for n in tree.nodes if n.path == (0,))
    rows = np.array([i for i, c in enumerate(tree.codes) if c[0] == 0])
    np.testing.assert_allclose(child.state["log_phi"], log_proposal(xc[rows], 0.25), atol=1e-4)
    # Eq. resampling + W~: re-deriving the child's columns from its seed gives the stored ones
    splitter = GCSplitter(PMatrix(x), root_statistics(PMatrix(x), progress=False), GCOptions(**FAST))
    _, col_rng, _ = splitter._rngs((0,))
    log_r = resampling_log_probs(log_proposal(xc[rows], 0.25), tree.meta["log_phi"], 0.25)
    np.testing.assert_array_equal(child.state["columns"], bootstrap_columns(log_r, x.shape[1], col_rng))


def test_resampling_weights_follow_eq_resampling():
    phi_local, phi = np.log([1.0, 2.0, 4.0, 8.0]), np.log([1.0, 1.0, 2.0, 1.0])
    log_r = resampling_log_probs(phi_local, phi, alpha=0.5)
    r = np.array([1.0, 2.0, 2.0, 8.0]) ** 0.5                    # (phi~ / phi)^alpha by hand
    np.testing.assert_allclose(np.exp(log_r), r / r.sum())
    idx = bootstrap_columns(log_r, 200_000, np.random.default_rng(0))
    np.testing.assert_allclose(np.bincount(idx, minlength=4) / 200_000, r / r.sum(), atol=0.005)
    assert np.all(np.diff(idx) >= 0)


def test_node_weights_are_resampled_p_over_local_phi(planted):
    """W~ = (P~ / phi~)^alpha: the stored centroids are Eq. optim-centroid of exactly these weights."""
    from gdr.cluster import centroid_update

    _, x = planted
    tree = gc_tree(x, K=5, c=5)
    xc = clip_logp(x, 5.0)
    child = next(n for n in tree.nodes if n.path == (1,) and n.n_children)
    rows = np.array([i for i, c in enumerate(tree.codes) if c[0] == 1])
    sub = np.array([c[1] for c in tree.codes if c[0] == 1])
    cols, lphi = child.state["columns"], child.state["log_phi"].astype(np.float64)
    lw = 0.25 * (xc[rows][:, cols] - lphi[cols])
    np.testing.assert_allclose(log_weights(xc[rows][:, cols], lphi[cols], 0.25), lw, atol=1e-4)
    np.testing.assert_allclose(child.state["log_centroids"], centroid_update(lw, sub, child.n_children), atol=2e-3)


def test_same_seed_same_ids_regardless_of_workers(planted):
    _, x = planted
    a = gc_tree(x[:400], seed=3).codes
    b = build_gc_index(PMatrix(x[:400]), n_clusters=6, leaf_size=6, options=GCOptions(**FAST), seed=3, workers=3,
                       progress=False).codes
    assert a == b
    assert gc_tree(x[:400], seed=4).codes != a


def test_switches_and_streamed_root(planted, tmp_path):
    h, x = planted
    path = write_planted_npy(tmp_path / "P.npy", h)  # float16 on disk, read with explicit reads
    pm = PMatrix(path, n_cols=128)                   # J: first 128 columns only
    opts = GCOptions(**{**FAST, "n_init": 10}, memory_mb=2.0, chunk_rows=128, localized=False, bootstrap=False,
                     clip_sigma=None)
    tree = build_gc_index(pm, n_clusters=5, leaf_size=5, options=opts, progress=False)
    check_prefix_code(tree.codes, 5)
    root = tree.nodes[0]
    assert root.info["streamed"] and root.info["fit_rows"] < len(x) and root.info["refine_passes"] >= 1
    assert tree.meta["clip_upper"] is None and root.state["log_centroids"].shape[1] == 128
    # localized off: every node uses the global phi; bootstrap off: columns are the identity
    for n in tree.internal_nodes:
        np.testing.assert_array_equal(n.state["columns"], np.arange(128))
        np.testing.assert_allclose(n.state["log_phi"], tree.meta["log_phi"], atol=1e-5)
    assert adjusted_rand_score(h.top, [c[0] for c in tree.codes]) > 0.8


def test_streamed_pass_matches_kernels(planted):
    """The out-of-core pass: distortions = distortion_matrix, centroid sums = Eq. optim-centroid (centroid_update)."""
    from gdr.cluster import centroid_update, distortion_matrix

    _, x = planted
    pm = PMatrix(x)
    stats = root_statistics(pm, progress=False)
    sp = GCSplitter(pm, stats, GCOptions(chunk_rows=64))
    xc = clip_logp(x, 5.0)
    rows = np.arange(10, 700, 3)
    cols = np.sort(np.random.default_rng(0).integers(0, x.shape[1], x.shape[1]))
    lphi = stats.log_phi[cols]
    lw = log_weights(xc[rows][:, cols], lphi, 0.25)
    labels = np.random.default_rng(1).integers(0, 4, len(rows))
    _, _, acc = sp._pass(rows, cols, lphi, labels=labels)
    log_c = centroid_update(lw, labels, 4)
    np.testing.assert_allclose(acc - np.log(np.exp(acc).sum(1, keepdims=True)), log_c, atol=1e-4)
    got, total, _ = sp._pass(rows, cols, lphi, log_c=log_c)
    d = distortion_matrix(xc[rows][:, cols], lw, log_c)
    assert np.array_equal(got, d.argmin(1))
    assert total == pytest.approx(d.min(1).sum(), rel=1e-6)
    kept, total_at, _ = sp._pass(rows, cols, lphi, log_c=log_c, labels=labels)   # given labels: their distortion
    assert kept is labels
    assert total_at == pytest.approx(d[np.arange(len(rows)), labels].sum(), rel=1e-6)


def test_gc_options_init_and_split_merge():
    assert GCOptions().init == "greedy-k-means++" and GCOptions().split_merge is None
    for init in ("random", "k-means++", "greedy-k-means++"):
        GCOptions(init=init).validate()
    with pytest.raises(ValueError, match="gc.init must be one of random, k-means\\+\\+, greedy-k-means\\+\\+"):
        GCOptions(init="kmeans").validate()
    with pytest.raises(ValueError, match="gc.split_merge"):
        GCOptions(split_merge="on").validate()


def test_default_root_fit_reaches_the_planted_partition():
    """A root where the paper's random init (Algorithm 1) stops in a local optimum with a higher distortion
    than the planted top clusters; the default fit (greedy k-means++, split/merge) reaches the planted one."""
    from gdr.indexing.gc import partition_distortion

    h = planted_hierarchy(1500, 128, n_top=10, n_sub=2, top_signal=2.0, seed=0)
    pm = PMatrix(planted_logp(h))
    out = {}
    for init in ("greedy-k-means++", "random"):
        tree = build_gc_index(pm, n_clusters=10, leaf_size=10, options=GCOptions(**{**FAST, "n_init": 3}, init=init),
                              seed=0, progress=False)
        check_prefix_code(tree.codes, 10)
        top = np.array([c[0] for c in tree.codes])
        fitted, planted_d = partition_distortion(pm, tree, top), partition_distortion(pm, tree, h.top)
        assert tree.nodes[0].info["distortion"] == pytest.approx(fitted, rel=1e-7)   # same quantity, streamed
        assert ("split_merge_moves" in tree.nodes[0].info) == (init == "greedy-k-means++")
        out[init] = (adjusted_rand_score(h.top, top), fitted, planted_d)
    ari_new, fit_new, planted_d = out["greedy-k-means++"]
    ari_old, fit_old, _ = out["random"]
    assert ari_new == 1.0 and fit_new == pytest.approx(planted_d, rel=1e-9)
    assert ari_old < 0.9 and fit_old > planted_d + 1.0


# --- output, CLI, add -------------------------------------------------------------------------------------


def _cli_index(tmp_path, x, K=8, c=4, extra=()):
    from gdr.cli.commands.index import index_main

    run = write_run(tmp_path / "run", x)
    out = tmp_path / "index"
    rc = index_main([f"run={run}", f"out={out}", f"n_clusters={K}", f"leaf_size={c}", "progress=false",
                     "gc.n_init=2", "gc.n_init_inner=1", *extra])
    assert rc == 0
    return run, out


def test_cli_writes_every_artifact(planted, tmp_path):
    _, x = planted
    run, out = _cli_index(tmp_path, x[:300])
    for f in ("docids.tsv", "tree.json", "tree_state.npz", "summary.txt", "summary.json", "summary.png",
              "config.yaml", "manifest.json"):
        assert (out / f).exists(), f
    ids, codes = read_docids(out / "docids.tsv")
    assert ids == [f"d{i}" for i in range(300)]
    check_prefix_code(codes, 8)
    tree = json.loads((out / "tree.json").read_text())
    root = tree["nodes"][0]
    assert root["path"] == "" and root["size"] == 300 and len(root["typical_queries"]) == root["children"]
    assert all(len(q) == 5 and q[0].startswith("query ") for q in root["typical_queries"])
    assert np.array(root["log_centroids"]).shape == (root["children"], x.shape[1])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_docs"] == 300 and summary["depth_max"] == max(len(c) for c in codes)


def test_tree_state_is_written_node_by_node_as_stacked_arrays(planted, tmp_path):
    """save_tree_state streams the per-node arrays: the .npz holds exactly their concatenation, and loads back."""
    from gdr.indexing.state import load_tree_state, save_tree_state, tree_state_from_tree

    _, x = planted
    tree = gc_tree(x[:200], K=5, c=5)
    st = tree_state_from_tree(tree)
    save_tree_state(tmp_path / "s.npz", st)
    order = sorted(st.nodes, key=lambda p: (len(p), p))
    with np.load(tmp_path / "s.npz") as z:
        assert z["centroids"].dtype == np.float32 and z["node_columns"].dtype == np.int32
        np.testing.assert_array_equal(z["centroids"], np.concatenate([st.nodes[p].log_centroids for p in order]))
        np.testing.assert_array_equal(z["node_log_phi"], np.stack([st.nodes[p].log_phi for p in order]))
        np.testing.assert_array_equal(z["node_columns"], np.stack([st.nodes[p].columns for p in order]))
        np.testing.assert_array_equal(np.diff(z["centroid_offsets"]), [st.nodes[p].n_children for p in order])
    back = load_tree_state(tmp_path / "s.npz")
    assert sorted(back.nodes) == sorted(st.nodes) and back.leaves == st.leaves
    for p in order:
        np.testing.assert_array_equal(back.nodes[p].log_centroids, st.nodes[p].log_centroids)
        np.testing.assert_array_equal(back.nodes[p].columns, st.nodes[p].columns)


def test_add_places_a_copy_next_to_its_original(planted, tmp_path):
    from gdr.cli.commands.index import index_main

    _, x = planted
    run, out = _cli_index(tmp_path, x[:300])
    ids, codes = read_docids(out / "docids.tsv")
    code_of = dict(zip(ids, codes))
    pick = [0, 17, 123, 299]
    new = write_run(tmp_path / "new", x[pick], doc_ids=[f"copy{i}" for i in pick])
    assert index_main(["add", f"run={new}", f"index={out}", "progress=false"]) == 0
    ids2, codes2 = read_docids(out / "docids.tsv")
    assert ids2[:300] == ids and codes2[:300] == codes          # existing ids never change
    check_prefix_code(codes2, 8)
    for i in pick:
        c = dict(zip(ids2, codes2))[f"copy{i}"]
        assert c[:-1] == code_of[f"d{i}"][:-1]                  # same leaf, next free position
    tree = json.loads((out / "tree.json").read_text())
    assert tree["n_docs"] == 304 and tree["nodes"][0]["size"] == 304


def test_add_overflowing_a_leaf_keeps_codes_valid(planted, tmp_path):
    from gdr.stages.index_add import add_to_index

    _, x = planted
    run, out = _cli_index(tmp_path, x[:200], K=4, c=4)
    new = write_run(tmp_path / "new", np.repeat(x[:1], 30, axis=0), doc_ids=[f"n{i}" for i in range(30)])
    res = add_to_index(out, new, plot=False)
    assert res.n_redirected > 0
    ids, codes = read_docids(out / "docids.tsv")
    assert len(ids) == 230
    check_prefix_code(codes, 4)
    with pytest.raises(ValueError, match="already in"):
        add_to_index(out, new, plot=False)


def test_add_keeps_a_document_whose_leaf_is_full_under_its_own_branch(planted, tmp_path):
    from gdr.stages.index_add import add_to_index

    _, x = planted
    two = np.repeat(x[[0, 250]], 50, axis=0)                   # 50 copies of each of two documents of other topics
    _, out = _cli_index(tmp_path, two, K=4, c=4)
    ids, codes = read_docids(out / "docids.tsv")
    branch_a, branch_b = codes[0][0], codes[50][0]
    assert branch_a != branch_b and len({c[0] for c in codes}) == 2  # two root children of four: room for two more
    # 20 more of the first: its branch has 14 free positions, and the root room for two more children
    more = write_run(tmp_path / "more", np.repeat(x[:1], 20, axis=0), doc_ids=[f"n{i}" for i in range(20)])
    res = add_to_index(out, more, plot=False)
    ids, codes = read_docids(out / "docids.tsv")
    check_prefix_code(codes, 4)
    assert res.n_new_leaves > 0 and not [c for c in codes[100:] if c[0] == branch_b]  # none into the other topic


def test_an_undo_cut_short_is_done_again_whole_by_the_next_add(planted, tmp_path, monkeypatch):
    import gdr.stages.index_add as index_add

    _, x = planted
    _, out = _cli_index(tmp_path, x[:100], K=4, c=4)
    before = {n: (out / n).read_bytes() for n in index_add._REWRITTEN}
    index_add._back_up(out)
    for n in index_add._REWRITTEN:  # an add cut short midway through its rewrites
        (out / n).write_bytes(b"half-written")
    real, calls = index_add.os.replace, []

    def killed_at_the_second(a, b):
        calls.append(a)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(a, b)

    monkeypatch.setattr(index_add.os, "replace", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        index_add._undo_interrupted_add(out)  # the undo itself cut short: one file back, the copies kept
    monkeypatch.undo()
    index_add._undo_interrupted_add(out)
    assert {n: (out / n).read_bytes() for n in index_add._REWRITTEN} == before
    assert not (out / index_add.BACKUP_DIR).exists()


def test_an_add_takes_only_its_own_keys_and_names_a_p_of_fewer_queries(planted, tmp_path):
    from gdr.cli.commands.index import index_main
    from gdr.stages.index_add import add_to_index

    _, x = planted
    _, out = _cli_index(tmp_path, x[:100], K=4, c=4)
    new = write_run(tmp_path / "new", x[100:105], doc_ids=[f"n{i}" for i in range(5)])
    with pytest.raises(ValueError, match=r"^gdr index add: n_clusters= is a key of building an index"):
        index_main(["add", f"run={new}", f"index={out}", "n_clusters=3"])
    narrow = write_run(tmp_path / "narrow", x[100:105, :50], doc_ids=[f"m{i}" for i in range(5)])
    with pytest.raises(ValueError, match=rf"P has 50 query columns, but the index in {out} was built on "
                                         rf"J={x.shape[1]} queries"):
        add_to_index(out, narrow, plot=False)


def test_a_copy_cut_short_is_made_again_and_leaves_grown_past_c_are_counted(planted, tmp_path, monkeypatch):
    import gdr.stages.index_add as index_add

    _, x = planted
    _, out = _cli_index(tmp_path, x[:100], K=8, c=4)
    new = write_run(tmp_path / "new", np.repeat(x[:1], 12, axis=0), doc_ids=[f"n{i}" for i in range(12)])
    real, calls = index_add.shutil.copy2, []

    def killed_at_the_third(a, b):
        calls.append(a)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(index_add.shutil, "copy2", killed_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        index_add.add_to_index(out, new, plot=False, out=tmp_path / "grown")
    monkeypatch.undo()
    index_add.add_to_index(out, new, plot=False, out=tmp_path / "grown")  # not refused as another folder's files
    assert len(read_docids(tmp_path / "grown" / "docids.tsv")[0]) == 112
    assert not (tmp_path / "grown" / index_add.COPYING).exists()
    summary = json.loads((tmp_path / "grown" / "summary.json").read_text())
    assert summary["leaves_over_c"] > 0 and summary["leaf_size_max"] > 4
    assert f"{summary['leaves_over_c']} leaves hold more than c (grown by gdr index add" in \
        (tmp_path / "grown" / "summary.txt").read_text()


def test_kmeans_docs_with_an_id_given_twice_is_refused(tmp_path):
    from gdr.stages.index import build_index
    from gdr.stages.settings import IndexSettings

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"doc_id": d, "text": f"text {i}"}) + "\n"
                            for i, d in enumerate(["t0", "t1", "t2", "t0"])))
    with pytest.raises(ValueError, match=r"docs.jsonl: record 4: duplicate doc_id 't0' \(first seen at record 1\)"):
        build_index(IndexSettings.from_config({"method": "random", "n_clusters": 4, "leaf_size": 2,
                                               "kmeans": {"docs": str(docs)}}), tmp_path / "out")


def test_add_rejects_other_queries(planted, tmp_path):
    from gdr.stages.index_add import add_to_index

    _, x = planted
    run, out = _cli_index(tmp_path, x[:100])
    new = write_run(tmp_path / "new", x[:2], doc_ids=["a", "b"], qids=[f"other{j}" for j in range(x.shape[1])])
    with pytest.raises(ValueError, match="scored against other queries"):
        add_to_index(out, new, plot=False)


@pytest.mark.parametrize("cut_in", ["write_docids", "_update_tree_json", "refresh_manifest_files", "write_manifest"])
def test_an_add_cut_short_is_undone_by_the_next_which_equals_one_whole_add(planted, tmp_path, monkeypatch, cut_in):
    """A kill between the rewrites of an add (here: an exception at one of its steps) leaves files of two states;
    the next add puts the old ones back and adds again, to the bytes of an add never cut."""
    import gdr.stages.index_add as index_add

    _, x = planted
    _, whole = _cli_index(tmp_path, x[:200], K=4, c=4)
    index_add.add_to_index(whole, write_run(tmp_path / "first", x[[7, 70]], doc_ids=["f0", "f1"]), plot=False)
    index_add.add_to_index(whole, write_run(tmp_path / "second", x[[9]], doc_ids=["s0"]), plot=False)
    cut = Path(shutil.copytree(whole, tmp_path / "cut"))  # both grown twice; the third add is cut in one
    new = write_run(tmp_path / "new", x[[3, 50, 120]], doc_ids=["n0", "n1", "n2"])
    index_add.add_to_index(whole, new, plot=False)
    real = getattr(index_add, cut_in)

    def killed(*args, **kwargs):
        if cut_in != "write_manifest" or "name" in kwargs:  # write_manifest: the add's own record
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(index_add, cut_in, killed)
    with pytest.raises(KeyboardInterrupt):
        index_add.add_to_index(cut, new, plot=False)
    monkeypatch.setattr(index_add, cut_in, real)
    index_add.add_to_index(cut, new, plot=False)
    for name in ("docids.tsv", "tree.json"):
        assert (cut / name).read_bytes() == (whole / name).read_bytes(), name
    with np.load(cut / "tree_state.npz") as a, np.load(whole / "tree_state.npz") as b:  # a zip stamps its time
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert sorted(p.name for p in cut.glob("manifest.add-*.json")) == [f"manifest.add-{i}.json" for i in (1, 2, 3)]
    assert not (cut / index_add.BACKUP_DIR).exists()


def test_an_index_folder_of_other_inputs_or_grown_by_an_add_is_refused(planted, tmp_path):
    from gdr.stages.index import build_index
    from gdr.stages.index_add import add_to_index
    from gdr.stages.settings import IndexSettings

    _, x = planted
    run, out = _cli_index(tmp_path, x[:100], K=4, c=4)
    gc = {"gc": {"n_init": 2, "n_init_inner": 1}}
    build_index(IndexSettings.from_config({"n_clusters": 4, "leaf_size": 4, **gc}), out, run=run)  # as it was
    with pytest.raises(FileExistsError, match=r"holds an index of other inputs or settings \(leaf_size \(4 -> 5\)\)"):
        build_index(IndexSettings.from_config({"n_clusters": 4, "leaf_size": 5, **gc}), out, run=run)
    # a key of a nested section is named with its values, not the section dumped whole
    with pytest.raises(FileExistsError, match=r"settings \(gc.alpha \(0.25 -> 0.5\)\); pass another out="):
        build_index(IndexSettings.from_config({"n_clusters": 4, "leaf_size": 4,
                                               "gc": {**gc["gc"], "alpha": 0.5}}), out, run=run)
    with pytest.raises(FileExistsError, match="holds a gc index, not a random one"):
        build_index(IndexSettings.from_config({"method": "random", "n_clusters": 4, "leaf_size": 4}), out, run=run)
    other = write_run(tmp_path / "other", x[100:150])
    with pytest.raises(FileExistsError, match=r"other inputs or settings \(the documents \(their ids\)(, the P "
                                              r"columns' queries)?\)"):
        build_index(IndexSettings.from_config({"n_clusters": 4, "leaf_size": 4, **gc}), out, run=other)
    with pytest.raises(ValueError, match=rf"^gc.n_queries=999: more than the {x.shape[1]} queries of the P of run="):
        build_index(IndexSettings.from_config({"n_clusters": 4, "leaf_size": 4, "gc": {"n_queries": 999}}), out,
                    run=run)
    add_to_index(out, write_run(tmp_path / "new", x[:2], doc_ids=["a", "b"]), plot=False)
    with pytest.raises(FileExistsError, match="gdr index add has placed documents into this index"):
        build_index(IndexSettings.from_config({"n_clusters": 4, "leaf_size": 4, **gc}), out, run=run)
    assert len(read_docids(out / "docids.tsv")[0]) == 102
    (out / "stage.json").write_text("{}")  # a stage of gdr run: grown there, a rerun would drop the additions
    more = write_run(tmp_path / "more", x[2:4], doc_ids=["c", "d"])
    with pytest.raises(ValueError, match=r"is a stage of `gdr run`.*out=<new folder>"):
        add_to_index(out, more, plot=False)
    add_to_index(out, more, plot=False, out=tmp_path / "grown")  # a copy grows; the stage stays as it was
    grown = tmp_path / "grown"
    assert len(read_docids(grown / "docids.tsv")[0]) == 104 and not (grown / "stage.json").exists()
    assert len(read_docids(out / "docids.tsv")[0]) == 102
    with pytest.raises(FileExistsError, match="holds files that are not a copy of"):
        add_to_index(tmp_path / "grown", more, plot=False, out=out)


# --- baselines --------------------------------------------------------------------------------------------


def tiny_embed(texts):
    """A deterministic stand-in for MiniLM: texts 'topic<t> ...' near one of 4 random directions."""
    base = np.random.default_rng(0).normal(size=(4, 16))
    out = np.empty((len(texts), 16), dtype=np.float32)
    for i, t in enumerate(texts):
        rng = np.random.default_rng(zlib.crc32(t.encode()))
        out[i] = base[int(t.split()[0][5:]) % 4] + 0.1 * rng.normal(size=16)
    return out


@pytest.mark.parametrize("n", [1, 4, 5, 60])
def test_random_and_atomic_codes(n):
    t = random_tree(n, n_clusters=4, leaf_size=4, seed=0, progress=False)
    check_prefix_code(t.codes, 4)
    assert t.codes == random_tree(n, n_clusters=4, leaf_size=4, seed=0, progress=False).codes
    if n > 16:
        assert t.depth == 3  # balanced: 60 -> 4 x 15 -> 4 x ~4
    a = atomic_codes(n)
    assert a.codes == [(i,) for i in range(n)]


def test_hkmi_and_bmi_on_tiny_inputs():
    texts = [f"topic{i % 4} doc {i}" for i in range(80)]
    emb = tiny_embed(texts)
    t = build_kmeans_index(emb, n_clusters=4, leaf_size=4, seed=0, n_init=5, progress=False)
    check_prefix_code(t.codes, 4)
    assert adjusted_rand_score([i % 4 for i in range(80)], [c[0] for c in t.codes]) == 1.0
    doc_ids = [f"d{i}" for i in range(80)]
    dq = {d: [f"topic{i % 4} q{k} of {d}" for k in range(3)] for i, d in enumerate(doc_ids)}
    qemb = query_mean_embeddings(doc_ids, dq, tiny_embed)
    assert qemb.shape == (80, 16)
    np.testing.assert_allclose(np.linalg.norm(qemb, axis=1), 1.0, rtol=1e-5)
    tb = build_kmeans_index(qemb, n_clusters=4, leaf_size=4, seed=0, progress=False, method="bmi")
    check_prefix_code(tb.codes, 4)
    for n in (1, 2, 5):
        check_prefix_code(build_kmeans_index(emb[:n], n_clusters=4, leaf_size=4, progress=False).codes, 4)
    with pytest.raises(ValueError, match="no text to average"):
        query_mean_embeddings(["d0", "zz"], dq, tiny_embed)


def test_cli_random_and_atomic(planted, tmp_path):
    from gdr.cli.commands.index import index_main

    _, x = planted
    run = write_run(tmp_path / "run", x[:50])
    for method in ("random", "atomic"):
        out = tmp_path / method
        assert index_main([f"method={method}", f"run={run}", f"out={out}", "progress=false", "plot=false"]) == 0
        ids, codes = read_docids(out / "docids.tsv")
        assert len(ids) == 50 and len(set(codes)) == 50


TOPIC_WORDS = [w.split() for w in ("match goal league striker coach season", "shares market profit bank investors",
                                   "film actor award director cinema festival", "election minister party vote poll")]


def topic_texts(n: int) -> list[str]:
    """n documents, document i of topic i % 4: four of its topic's words and two words every topic shares."""
    rng = np.random.default_rng(1)
    return [" ".join([*rng.choice(TOPIC_WORDS[i % 4], 4, replace=False), "the", "news", f"w{i}"]) for i in range(n)]


def test_tfidf_svd_embeddings_separate_topics_and_repeat_under_a_seed():
    texts = topic_texts(80)
    emb = tfidf_svd_embeddings(texts, dim=8, seed=3)
    assert emb.shape == (80, 8) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(emb, tfidf_svd_embeddings(texts, dim=8, seed=3))
    t = build_kmeans_index(emb, n_clusters=4, leaf_size=4, seed=0, n_init=5, progress=False)
    check_prefix_code(t.codes, 4)
    assert adjusted_rand_score([i % 4 for i in range(80)], [c[0] for c in t.codes]) == 1.0
    assert tfidf_svd_embeddings(texts[:5], dim=256).shape == (5, 4)  # at most n_docs - 1 components
    assert tfidf_svd_embeddings(["same"], dim=8).shape == (1, 1)     # one document: its tf-idf row


def test_hkmi_on_tfidf_svd_gives_prefix_codes_the_same_under_a_seed(tmp_path):
    """``gdr index method=hkmi kmeans.embedding=tfidf-svd``: valid prefix-code docids, byte-identical when rebuilt
    with the same seed, and the manifest names the embedding and its dimension."""
    from gdr.cli.commands.index import index_main

    texts = topic_texts(60)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"doc_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))

    def build(name: str, seed: int) -> Path:
        out = tmp_path / name
        assert index_main(["method=hkmi", f"kmeans.docs={docs}", "kmeans.embedding=tfidf-svd", "kmeans.svd_dim=6",
                           "n_clusters=4", "leaf_size=4", f"seed={seed}", f"out={out}", "progress=false",
                           "plot=false"]) == 0
        return out

    a, b, c = build("a", 0), build("b", 0), build("c", 1)
    ids, codes = read_docids(a / "docids.tsv")
    check_prefix_code(codes, 4)
    assert len(ids) == 60 and len(set(codes)) == 60
    assert (a / "docids.tsv").read_bytes() == (b / "docids.tsv").read_bytes()
    check_prefix_code(read_docids(c / "docids.tsv")[1], 4)
    man = json.loads((a / "manifest.json").read_text())
    assert man["embed_model"] == "tfidf-svd" and man["embedding_dim"] == 6


def test_bmi_on_tfidf_svd_averages_its_queries_vectors_without_a_neural_model(tmp_path, monkeypatch):
    """``kmeans.embedding=tfidf-svd`` is BMI's too (the BBC protocol keeps both k-means schemes off the retriever's
    own encoder): its per-document vectors are the means of tf-idf + SVD vectors of the documents' queries, and no
    sentence encoder is loaded."""
    from gdr.cli.commands.index import index_main
    from gdr.indexing.kmeans import query_mean_embeddings, tfidf_svd_embeddings
    from gdr.stages import index as index_stage

    def no_model(*a, **k):
        raise AssertionError("tfidf-svd loads no sentence encoder")

    monkeypatch.setattr(index_stage, "default_embed_fn", no_model)
    texts = topic_texts(40)
    queries = {f"d{i}": [" ".join(t.split()[j:j + 4]) for j in (0, 2, 4)] for i, t in enumerate(texts)}
    dq = tmp_path / "doc_queries.jsonl"
    dq.write_text("".join(json.dumps({"doc_id": d, "queries": q}) + "\n" for d, q in queries.items()))
    out = tmp_path / "bmi"
    assert index_main(["method=bmi", f"kmeans.doc_queries={dq}", "kmeans.embedding=tfidf-svd", "kmeans.svd_dim=6",
                       "n_clusters=4", "leaf_size=4", f"out={out}", "progress=false", "plot=false"]) == 0
    ids, codes = read_docids(out / "docids.tsv")
    check_prefix_code(codes, 4)
    assert sorted(ids) == sorted(queries)
    man = json.loads((out / "manifest.json").read_text())
    assert man["embed_model"] == "tfidf-svd" and man["embedding_dim"] == 6
    emb = query_mean_embeddings(list(queries), queries, lambda t: tfidf_svd_embeddings(t, dim=6, seed=0))
    assert emb.shape == (40, 6) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_document_segments_are_bmis_docseg():
    """BMI's ``get_seg``: 10 segments a document, one more per 3,000 words beyond 3,000, each 64 consecutive words
    starting in [0, n - 64); a text of at most 64 words is its own segments, one without words gives none; the same
    seed gives the same segments, another seed others."""
    from gdr.indexing.kmeans import document_segments

    ids = ["long", "short", "empty", "mid"]
    texts = [" ".join(f"w{i}" for i in range(9500)), "a b  c", "", " ".join(f"x{i}" for i in range(100))]
    segs = document_segments(ids, texts, seed=0)
    assert [len(segs[d]) for d in ids] == [12, 10, 0, 10]
    assert segs["short"] == ["a b c"] * 10
    for d, text in zip(ids, texts):
        words = text.split()
        for seg in segs[d]:
            got = seg.split()
            start = words.index(got[0])  # every word of these texts is unique
            assert got == words[start:start + min(64, len(words))] and start < max(1, len(words) - 64)
    assert len({s.split()[0] for s in segs["long"]}) > 6  # drawn over the text, not from one place
    assert segs == document_segments(ids, texts, seed=0)
    assert segs["long"] != document_segments(ids, texts, seed=1)["long"]
    assert [len(s.split()) for s in document_segments(ids, texts, words=8, per_doc=3)["mid"]] == [8, 8, 8]


def test_bmi_document_texts_pool_real_generated_and_segments_in_bmis_order():
    from gdr.indexing.kmeans import bmi_document_texts

    got = bmi_document_texts(["d0", "d1"], {"d0": ["g0"], "d1": ["g1", "g2"]}, real={"d0": ["r0"], "zz": ["r9"]},
                             segments={"d0": ["s0"], "d1": ["s1"]})
    assert got == {"d0": ["r0", "g0", "s0"], "d1": ["g1", "g2", "s1"]}
    assert bmi_document_texts(["d1"], {"d1": ["g1"]}) == {"d1": ["g1"]}
    with pytest.raises(ValueError, match="no generated queries.*'zz'"):
        bmi_document_texts(["d0", "zz"], {"d0": ["g0"]}, segments={"zz": ["s"]})


def test_bmi_with_bmis_own_vector_clusters_by_the_texts_its_generated_queries_lack(tmp_path):
    """``bmi.inputs``: generated queries that say nothing of a document's topic give BMI ids unrelated to the
    topics; with its real training queries and text segments averaged in (BMI's realq_genq_docseg) the first digit
    is the topic. The manifest counts what was averaged, and a folder built from other real queries is refused."""
    from gdr.cli.commands.index import index_main

    n = 48
    texts = topic_texts(n)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"doc_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    dq = tmp_path / "doc_queries.jsonl"  # a word of its own a document: no topic
    dq.write_text("".join(json.dumps({"doc_id": f"d{i}", "queries": [f"item{i} alpha", f"item{i} beta"]}) + "\n"
                          for i in range(n)))
    real = tmp_path / "real.jsonl"  # a training query for half the documents, and one of a document not indexed
    rows = [{"doc_id": f"d{i}", "queries": [" ".join(TOPIC_WORDS[i % 4][:2])]} for i in range(0, n, 2)]
    real.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {"doc_id": "elsewhere", "queries": ["x"]}]))
    common = [f"kmeans.docs={docs}", f"kmeans.doc_queries={dq}", "kmeans.embedding=tfidf-svd", "kmeans.svd_dim=8",
              "n_clusters=4", "leaf_size=4", "progress=false", "plot=false"]

    def first_digit_ari(out: Path) -> float:
        ids, codes = read_docids(out / "docids.tsv")
        check_prefix_code(codes, 4)
        return adjusted_rand_score([int(d[1:]) % 4 for d in ids], [c[0] for c in codes])

    assert index_main(["method=bmi", *common, f"out={tmp_path / 'genq'}"]) == 0
    assert index_main(["method=bmi", *common, "bmi.inputs=realq_genq_docseg", f"bmi.real_queries={real}",
                       f"out={tmp_path / 'bmi'}"]) == 0
    assert first_digit_ari(tmp_path / "genq") < 0.3 and first_digit_ari(tmp_path / "bmi") == 1.0
    man = json.loads((tmp_path / "bmi" / "manifest.json").read_text())
    assert man["bmi_texts"] == {"inputs": "realq_genq_docseg", "real_queries": n // 2,
                                "documents_with_real_queries": n // 2, "segments": 10 * n}
    assert "bmi_texts" in json.loads((tmp_path / "genq" / "manifest.json").read_text())
    real.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))
    with pytest.raises(FileExistsError, match=r"other inputs or settings \(the real queries\)"):
        index_main(["method=bmi", *common, "bmi.inputs=realq_genq_docseg", f"bmi.real_queries={real}",
                    f"out={tmp_path / 'bmi'}"])


def test_an_index_loads_its_corpus_once_whatever_reads_it(tmp_path):
    """BMI with text segments reads the corpus for its doc ids and for its texts: one load (`gdr index data=...`
    hands the stage a loader)."""
    from gdr.data import Corpus
    from gdr.indexing.options import IndexBMI, IndexKMeans
    from gdr.stages.index import build_index
    from gdr.stages.settings import IndexSettings

    texts, loads = topic_texts(20), []

    def corpus():
        loads.append(1)
        return Corpus(name="topics", doc_ids=[f"d{i}" for i in range(20)], texts=texts)

    dq = tmp_path / "doc_queries.jsonl"
    dq.write_text("".join(json.dumps({"doc_id": f"d{i}", "queries": [f"item{i}"]}) + "\n" for i in range(20)))
    settings = IndexSettings(method="bmi", n_clusters=4, leaf_size=4, progress=False, plot=False,
                             kmeans=IndexKMeans(doc_queries=str(dq), embedding="tfidf-svd", svd_dim=4),
                             bmi=IndexBMI(inputs="genq_docseg"))
    build_index(settings, tmp_path / "bmi", corpus=corpus)
    assert len(loads) == 1
    assert len(read_docids(tmp_path / "bmi" / "docids.tsv")[0]) == 20
