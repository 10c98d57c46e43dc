"""gdr: generative document retrieval with generative-clustering (GC) indexing."""

__version__ = "0.1.0"
