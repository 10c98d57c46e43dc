"""Prefix-code document ids for generative retrieval (paper Section 6.1-6.2).

Modules (import what you need; nothing heavy is imported here):

- :mod:`indexing.tree`: the recursive driver shared by every indexer (``build_tree`` with a
  ``splitter(rows, path, n_children)``), degenerate-split fallback, random and atomic ids.
- :mod:`indexing.gc`: hierarchical generative clustering (Algorithm 2): ``build_gc_index``.
- :mod:`indexing.kmeans`: HKmI and BMI baselines (faiss k-means on embeddings).
- :mod:`indexing.add`: ``add_to_index``, placing new documents into a GC tree.
- :mod:`indexing.output`, :mod:`indexing.state`, :mod:`indexing.summary`: artifacts.
- :mod:`indexing.docids`: ``docids.tsv``; :mod:`indexing.trie`: the docid trie (retriever).
- :mod:`gdr.stages.index` (the stage), :mod:`gdr.cli.commands.index`: ``gdr index`` and ``gdr index add``.
"""
