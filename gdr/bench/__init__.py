"""Benchmarks: ``python -m gdr.bench.<name>`` or ``gdr bench <name>``; each prints one JSON object last."""
from __future__ import annotations

import importlib
import sys

BENCHES = ("scoring", "clustering", "indexing", "decoding", "training", "sampling", "integrity", "gpu", "overlap")


def bench_main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHES:
        print(f"usage: gdr bench {{{'|'.join(BENCHES)}}} [options]  (--help for each)", file=sys.stderr)
        return 2
    return int(importlib.import_module(f"gdr.bench.{argv[0]}").main(argv[1:]) or 0)
