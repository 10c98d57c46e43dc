"""The host-sync counter the tests use: :mod:`gdr.bench.syncs` (``gdr bench training`` counts with it too)."""
from gdr.bench.syncs import SyncCounter, SyncEvent

__all__ = ["SyncCounter", "SyncEvent"]
