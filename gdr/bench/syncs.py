"""Count the host syncs a piece of code would make on a GPU, on any device (tests and ``gdr bench training`` run it
on the CPU).

A *host sync* is a point where the Python thread waits for the GPU's queue to drain: after it, the GPU
idles until Python has queued the next kernels, so a launch-bound model loses its CPU/GPU overlap. On CUDA
that happens when

1. **the host reads a device value** (device-to-host, D2H): ``.item()``, ``bool()``, ``int()``, ``float()``
   and ``if tensor:`` (all ``aten._local_scalar_dense``), ``.tolist()``, ``.numpy()``, ``.cpu()``, a copy
   into a CPU tensor;
2. **an op's output size depends on device values**, so the host reads a count before allocating it:
   ``nonzero`` (and ``argwhere``, one-argument ``where``), ``masked_select``, boolean indexing (``x[mask]``
   and ``x[mask] = v``: ``index``/``index_put_`` with a bool index), ``unique`` / ``unique_consecutive``,
   ``repeat_interleave`` with a tensor of repeats and no ``output_size``, ``bincount``, ``equal``, and
   ``isin`` where CUDA sorts (``unique`` inside: a test set of >= 10 * n ** 0.145 elements);
3. **host data is copied to the device synchronously** (host-to-device, H2D): ``torch.tensor(data,
   device=cuda)``, ``x.new_tensor(data)`` on a device tensor, ``host.to(cuda)`` without ``non_blocking``,
   ``device_tensor.copy_(host)``, or a host tensor used as an index of a device tensor. PyTorch's CUDA copy
   from host memory without ``non_blocking`` is ``cudaMemcpyAsync`` followed by ``cudaStreamSynchronize``
   (``at::cuda::memcpy_and_sync``): the host waits for everything queued before it. A copy with
   ``non_blocking=True`` from pinned memory does not wait; on the CPU we cannot pin, so production code pins
   on CUDA only and a ``non_blocking`` copy counts as no sync here.

On a CUDA device the counter sees cases 1 and 3 as cross-device ``_to_copy``/``copy_`` ops. On the CPU every
tensor is a CPU tensor, so it tells host data from device data by where it came from ("provenance"):

- *host* tensors are those made in the counted region from host data or without a device:
  ``torch.tensor``/``as_tensor``/``asarray``/``from_numpy`` and the factories (``zeros``, ``full``,
  ``arange``, ...) called without ``device=``, ``.cpu()`` results, and every op's output whose tensor
  inputs are all host tensors (so ``ids[r, :n] = torch.tensor(s)`` on a host buffer stays host);
- every other tensor is a *device* tensor: model weights, tensors made before the region (mark host ones
  with :meth:`SyncCounter.host`), factories given a ``device=`` (code passes ``device=self.device``), the
  outputs of ops on device tensors, and ``host.to(device)`` results.

An op of case 2, or a scalar read, counts only when a device tensor is involved; ``.tolist()``/``.numpy()``/
``.cpu()`` count only on device tensors. Limits, all on the side of counting too much, never too little,
except the last two: a host tensor's ``.to("cpu")`` counts as an upload (the CPU cannot tell it from
``.to(device)``); ``torch.tensor(data, device="cpu")`` counts as an upload (write host tensors without
``device=``); a device tensor's ``.to("cpu")`` is not seen on the CPU (write ``.cpu()``); syncs hidden inside
other CUDA kernels are counted only for the ops listed above.

Usage::

    with SyncCounter() as syncs:
        model_step()
    assert syncs.count == 0, syncs
"""
from __future__ import annotations

import os
import traceback
import weakref
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["SyncCounter", "SyncEvent"]

aten = torch.ops.aten

# Ops (overload packets: under inference mode composite ops reach the mode undecomposed) that read a device
# value on the host (case 1) or whose output size the host must read from the device (case 2).
_READS = {aten._local_scalar_dense, aten.is_nonzero, aten.item, aten.nonzero, aten.argwhere, aten.masked_select,
          aten._unique, aten._unique2, aten.unique_dim, aten.unique_consecutive, aten.bincount, aten.equal,
          aten.allclose}
_BOOL_INDEX = {aten.index, aten.index_put_, aten.index_put, aten._index_put_impl_}
_COPIES = {aten.copy_.default, aten._to_copy.default}
# Python-level factories: without `device=` they make host tensors; from data with `device=`, an upload.
_FROM_DATA = ("tensor", "as_tensor", "asarray")
_FACTORIES = ("zeros", "ones", "full", "empty", "arange", "linspace", "eye", "rand", "randn", "randint", "randperm",
              "empty_strided", "scalar_tensor")
_HERE = os.path.abspath(__file__)
_TORCH_DIR = os.path.dirname(torch.__file__)


@dataclass
class SyncEvent:
    kind: str  # "D2H" (the host reads the device) or "H2D" (a synchronous upload)
    what: str  # the op or method
    where: str  # the innermost caller outside torch and this file

    def __str__(self) -> str:
        return f"{self.kind} {self.what} at {self.where}"


def _caller() -> str:
    for f in reversed(traceback.extract_stack()[:-2]):
        path = os.path.abspath(f.filename)
        if path != _HERE and not path.startswith(_TORCH_DIR):
            return f"{os.path.relpath(path)}:{f.lineno} ({f.name})"
    return "?"


class SyncCounter(TorchDispatchMode):
    """Counts host syncs (see the module docstring) made inside ``with SyncCounter(device):``.

    device : the device the code under test runs on (default: the CPU, where provenance tells host
        tensors from device tensors; on CUDA the tensors' own devices do).
    ``count`` is the number of syncs, ``events`` says which and from where; ``uploads`` counts every host-to-device
    copy, a ``non_blocking`` one (no sync) too.
    """

    supports_higher_order_operators = True  # flex attention runs through the mode too

    def __init__(self, device: str | torch.device | None = None):
        super().__init__()
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.simulated = self.device.type == "cpu"
        self.events: list[SyncEvent] = []
        self._host: dict[int, weakref.ref] = {}
        self._saved: list[tuple[object, str, object]] = []
        self._paused = False  # inside a function run outside the counter
        self.uploads = 0  # host-to-device copies, synchronous or not

    # ------------------------------------------------------------------ bookkeeping
    @property
    def count(self) -> int:
        return len(self.events)

    def __str__(self) -> str:
        return f"{self.count} host sync(s)" + "".join(f"\n  {e}" for e in self.events)

    def _event(self, kind: str, what: str) -> None:
        if self._paused:
            return
        self.events.append(SyncEvent(kind, what, _caller()))

    def _upload(self) -> None:
        if not self._paused:
            self.uploads += 1

    def host(self, *tensors: torch.Tensor) -> None:
        """Mark tensors made outside the counted region as host data."""
        for t in tensors:
            self._tag(t)

    def _tag(self, t) -> None:
        if isinstance(t, torch.Tensor):
            key = id(t)
            self._host[key] = weakref.ref(t, lambda _, k=key: self._host.pop(k, None))

    def _untag(self, t) -> None:
        self._host.pop(id(t), None)

    def is_host(self, t: torch.Tensor) -> bool:
        if not self.simulated:
            return t.device.type == "cpu"
        r = self._host.get(id(t))
        return r is not None and r() is t

    # ------------------------------------------------------------------ aten ops
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: C901 - a branch per kind of op
        kwargs = kwargs or {}
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        host = [self.is_host(t) for t in ins]
        name = str(func).removeprefix("aten.")
        if func is aten._to_copy.default and not self.simulated:  # on a GPU: real cross-device copies
            src, target = args[0], kwargs.get("device")
            if target is not None and (src.device.type == "cpu") != (target.type == "cpu"):
                if target.type == "cpu":
                    self._event("D2H", name + " (to the CPU)")
                else:
                    self._upload()
                    if not kwargs.get("non_blocking", False):
                        self._event("H2D", name + " (from the CPU)")
        elif func is aten.copy_.default:
            dst, src = args[0], args[1]
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            if not dst.numel():
                pass
            elif self.is_host(dst) and not self.is_host(src):
                self._event("D2H", name + " (into a host tensor)")
            elif not self.is_host(dst) and self.is_host(src):
                self._upload()
                if not non_blocking:
                    self._event("H2D", name + " (from a host tensor)")
        elif not all(host):  # a device tensor is involved
            packet = getattr(func, "overloadpacket", None)
            if packet in _READS or func is aten.where.default:  # one-argument where: nonzero
                self._event("D2H", name)
            elif packet in _BOOL_INDEX and any(t is not None and t.dtype in (torch.bool, torch.uint8)
                                                for t in args[1]):
                self._event("D2H", name + " (boolean index)")
            elif packet is aten.repeat_interleave and isinstance(args[-1] if func is aten.repeat_interleave.Tensor
                                                                 else args[1], torch.Tensor) \
                    and kwargs.get("output_size") is None:
                self._event("D2H", name + " (no output_size)")
            elif func is aten.isin.Tensor_Tensor and args[1].numel() >= 10 * max(args[0].numel(), 1) ** 0.145:
                self._event("D2H", name + " (CUDA sorts: unique)")
            if any(h and t.dim() > 0 for t, h in zip(ins, host)) and any(not h and t.dim() > 0
                                                                        for t, h in zip(ins, host)):
                self._event("H2D", name + " (a host tensor used with device tensors)")
        out = func(*args, **kwargs)
        # Host in, host out. A 0-dim input that is not known as host may be a Python scalar torch wrapped.
        if self.simulated and any(host) and all(h or t.dim() == 0 for t, h in zip(ins, host)):
            for t in tree_leaves(out):
                self._tag(t)
        return out

    # ------------------------------------------------------------------ Python-level boundaries
    def __enter__(self):
        if self.simulated:
            self._patch_python()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for owner, name, orig in reversed(self._saved):
                setattr(owner, name, orig)
            self._saved.clear()

    def _patch(self, owner, name: str, make) -> None:
        orig = getattr(owner, name)
        self._saved.append((owner, name, orig))
        setattr(owner, name, make(orig))

    def _patch_python(self) -> None:  # noqa: C901 - one wrapper per Python-level boundary
        counter = self

        def reads(name):
            def make(orig):
                def method(t, *a, **k):
                    if not counter.is_host(t) and t.numel():  # copying nothing waits for nothing
                        counter._event("D2H", f"Tensor.{name}")
                    out = orig(t, *a, **k)
                    if name == "cpu":
                        out = out[...] if out is t else out  # a new object for the host copy
                        counter._tag(out)
                    return out
                return method
            return make

        for name in ("cpu", "numpy", "tolist"):
            self._patch(torch.Tensor, name, reads(name))

        def to(orig):
            def method(t, *a, **k):
                out = orig(t, *a, **k)
                device, _, non_blocking, _ = torch._C._nn._parse_to(*a, **k)
                if device is not None and counter.is_host(t):
                    if t.numel():
                        counter._upload()
                    if not non_blocking and t.numel():
                        counter._event("H2D", "Tensor.to")
                    out = out[...] if out is t else out  # the device copy is another tensor than the host one
                    counter._untag(out)
                return out
            return method

        self._patch(torch.Tensor, "to", to)

        def new_tensor(orig):
            def method(t, data, *a, **k):
                out = orig(t, data, *a, **k)
                if counter.is_host(t) and k.get("device") is None:
                    counter._tag(out)
                elif out.numel():
                    counter._event("H2D", "Tensor.new_tensor")
                return out
            return method

        self._patch(torch.Tensor, "new_tensor", new_tensor)

        def factory(fname):
            def make(orig):
                def fn(*a, **k):
                    out = orig(*a, **k)
                    device = k.get("device")
                    if fname == "as_tensor" and device is None and len(a) > 2:
                        device = a[2]
                    data = a[0] if a else k.get("data")
                    if fname in _FROM_DATA + ("from_numpy",) and isinstance(data, torch.Tensor):
                        if not counter.is_host(data):  # a device tensor in: stays a device tensor
                            return out
                    if device is None:
                        counter._tag(out)
                    elif fname in _FROM_DATA and out.numel():
                        counter._event("H2D", f"torch.{fname}(..., device=)")
                    return out
                return fn
            return make

        for fname in _FROM_DATA + _FACTORIES + ("from_numpy",):
            self._patch(torch, fname, factory(fname))

        def outside_the_mode(orig):  # eager flex attention compiles its HOP, which refuses to run under a mode
            def fn(*a, **k):
                from torch.utils._python_dispatch import _disable_current_modes

                paused, counter._paused = counter._paused, True
                try:
                    with _disable_current_modes():
                        return orig(*a, **k)
                finally:
                    counter._paused = paused
            return fn

        import torch.nn.attention.flex_attention as flex

        self._patch(flex, "flex_attention", outside_the_mode)


def _self_check() -> None:  # pragma: no cover - a quick manual check: python -m gdr.bench.syncs
    x = torch.ones(3)
    with SyncCounter() as c:
        bool(x.all())
        torch.tensor(np.arange(3)).to("cpu")
    print(c)


if __name__ == "__main__":  # pragma: no cover
    _self_check()
