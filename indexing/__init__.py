"""Prefix-code document ids for generative retrieval (paper Section 6.1-6.2).

Modules (import what you need; nothing heavy is imported here):

- :mod:`gdr.indexing.tree`: the recursive driver shared by every indexer (``build_tree`` with a
  ``splitter(rows, path, n_children)``), degenerate-split fallback, random and atomic ids.
- :mod:`gdr.indexing.gc`: hierarchical generative clustering (Algorithm 2): ``build_gc_index``.
- :mod:`gdr.indexing.kmeans`: HKmI and BMI baselines (faiss k-means on embeddings).
- :mod:`gdr.indexing.add`: ``place_documents``, placing new documents into a GC tree (the stage that grows an
  index folder: :mod:`gdr.stages.index_add`).
- :mod:`gdr.indexing.output`, :mod:`gdr.indexing.state`, :mod:`gdr.indexing.summary`: artifacts.
- :mod:`gdr.indexing.docids`: ``docids.tsv``; :mod:`gdr.indexing.trie`: the docid trie (retriever).
- :mod:`gdr.stages.index` (the stage), :mod:`gdr.cli.commands.index`: ``gdr index`` and ``gdr index add``.
"""
