"""Test hook (tests/test_guard.py): with GDR_TEST_SCORE_DELAY=<seconds> on PYTHONPATH's front, every
``GenerativeLM.score`` call of this process sleeps first, so that a spawned scoring worker is still
working when the test kills its parent. Loaded by Python at start-up (``site``), in every process."""
import importlib.abc
import importlib.util
import os
import sys
import time

DELAY = float(os.environ.get("GDR_TEST_SCORE_DELAY") or 0)


class _SlowScore(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "gdr.lm":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            score = module.GenerativeLM.score

            def slow(self, *args, **kwargs):
                time.sleep(DELAY)
                return score(self, *args, **kwargs)

            module.GenerativeLM.score = slow

        spec.loader.exec_module = exec_module
        return spec


if DELAY > 0:
    sys.meta_path.insert(0, _SlowScore())
