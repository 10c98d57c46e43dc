"""Every config a ``gdr run`` stage saves (``score.config.yaml``, ``config.yaml`` ...), for each experiment and the
variants of :mod:`tests.stage_keys`, written by the stage specs' ``build`` with the kernels stubbed out: a change of how
the settings reach the stages compares the folders written before and after it (``diff -r``), since reruns, ``gdr
evaluate``, ``gdr index add`` and the upgrades read those files.

    PYTHONPATH=$PWD python -m tests.saved_configs <folder>
"""
import sys
from pathlib import Path
from types import SimpleNamespace

from gdr import pipeline
from gdr.config import load_config
from tests import stage_keys as sk


class _LM:
    def describe(self):
        return {"name": "stub"}


def stub(patch=setattr):
    """The kernels of the stages as stand-ins that write nothing but what the stage saves itself."""
    sk.stand_ins(patch)
    patch(pipeline, "score_corpus", lambda *a, **k: Path("P.npy"))
    patch(pipeline, "cluster_run", lambda *a, **k: (None, None))
    patch(pipeline, "cluster_headline", lambda r: {})
    patch(pipeline, "load_run", lambda p: None)
    patch(pipeline, "build_index", lambda *a, **k: {})
    patch(pipeline, "sample_doc_queries", lambda *a, **k: "dq")
    patch(pipeline, "evaluate_model", lambda path, corpus, qs, folder, settings, split: (
        {"systems": {settings.tag: {}}}, None))
    patch(pipeline, "_test_queries", lambda run, q: None)

    def train(corpus, docids, folder, settings, **k):
        k["write_config"](folder)
        return SimpleNamespace(monitor="m", best_score=0.0, global_step=0, n_params={})
    patch(pipeline.train_stage, "train_retriever", train)


def main(out):
    """Write each run's stage configs under ``out/<run>/<stage>/`` (the first four retrievers of each)."""
    stub()
    out = Path(out)
    for name, overrides in sk.runs():
        cfg = load_config("run", overrides)
        run = sk._context(cfg)
        run._lm = _LM()
        base = out / name.replace(" ", "_").replace("/", "_")

        def build(spec, tag=None, base=base):
            if spec is None:
                return None
            folder = base / (tag or spec.name)
            folder.mkdir(parents=True, exist_ok=True)
            spec.build(folder)
            return spec
        run.score = sk._record("score", "S0") if build(pipeline.score_spec(run)) else None
        build(pipeline.cluster_spec(run))
        run.doc_queries = sk._record("doc-queries", "D0") if build(pipeline.doc_queries_spec(run)) else None
        for m in cfg.indexers:
            build(pipeline.index_spec(run, m))
            run.indexes[m] = sk._record(f"index-{m}", f"I{m}")
        for ms in pipeline.retriever_order(run)[:4]:
            spec = build(pipeline.train_spec(run, *ms))
            build(pipeline.eval_spec(run, ms[0], ms[1], sk._record(spec.name, "T"), *ms[2:]))


if __name__ == "__main__":
    main(sys.argv[1])
