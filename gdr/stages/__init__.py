"""The pipeline's stages as a library: one module per stage, each a function of plain typed arguments
(a corpus, a model, a settings dataclass of :mod:`gdr.stages.settings`, an out folder) that returns what it
made. ``gdr run`` (:mod:`gdr.pipeline`) and the commands (:mod:`gdr.cli.commands`) call them; so can a script
(:mod:`gdr.api` wraps them with keyword settings).

- :mod:`~gdr.stages.sample`: ``sample_queries``: J queries drawn from the corpus (Algorithm 1, line 1).
- :mod:`~gdr.stages.score`: ``score_corpus`` (sample + score), ``score_queries``: the matrix P (Eq. 1).
- :mod:`~gdr.stages.cluster`: ``cluster_run``: flat GC of a scored corpus, evaluated against its labels.
- :mod:`~gdr.stages.doc_queries`: ``sample_doc_queries``: generated training queries for every document.
- :mod:`~gdr.stages.index`: ``build_index``: prefix-code docids (gc, hkmi, bmi, random, atomic).
- :mod:`~gdr.stages.train`: ``train_retriever``: the seq2seq retriever.
- :mod:`~gdr.stages.evaluate`: ``evaluate_model``: Success@k, R@k, RR@k of a trained retriever.
- :mod:`~gdr.stages.bm25`: ``bm25_baseline``: the BM25 reference.
- :mod:`~gdr.stages.report`: ``write_report``, ``headline``: the comparison of a pipeline run.
- :mod:`~gdr.stages.qg`: ``build_pairs``: the (document, query) pairs a query generator is fine-tuned on.
"""
