"""What differs between the transformers versions gdr supports (5.17, the GPU image's, to the newest).

`make test-compat` runs the LM, sampling, scoring, training and pipeline tests under the oldest versions.
"""
from __future__ import annotations

import inspect
from functools import cache

__all__ = ["cache_kwarg"]


@cache
def _cache_kwarg_of(forward) -> str:
    params = inspect.signature(forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwarg(module) -> str:
    """The keyword ``module.forward`` takes its KV cache under: ``past_key_values`` (transformers <= 5.2x on
    most models) or ``cache`` (the later name).

    Every caller that hands a model a cache (the decode loop, scoring) asks here:
    an unknown keyword is swallowed by the model's ``**kwargs``, so the cache silently stays empty.
    """
    return _cache_kwarg_of(type(module).forward)
