"""Count the bytes of live tensor storage, peak and current, without a GPU.

A single file that imports only the standard library and torch, so that `cfgfix verify`
can copy it into a user's process. It works the same for real tensors and for
`FakeTensorMode` tensors (whose storages are on the meta device but report their size).

    with LiveBytes() as counter:
        loss = model(batch).loss; loss.backward(); optimizer.step()
    counter.peak, counter.current

How: every aten op's outputs pass `__torch_dispatch__`; each output's storage is counted
once (storage identity) and uncounted when it is freed (a weakref callback on the storage,
whose Python object torch keeps alive exactly as long as the storage). Views and in-place
results share a storage and so add nothing. This is what torch's own
`torch.distributed._tools.mem_tracker.MemTracker` does; measured byte-exact against it at
1.6x step time instead of its 3.8x (verify-notes.md, "Measuring memory on a CPU").

What it cannot see: tensors made outside the dispatcher, chiefly weights that
`from_pretrained` memory-maps from safetensors. `track_existing(modules, optimizers)` adds
those to the count; `model_state_bytes` reports them by kind.

Under `FakeTensorMode`, enter `LiveBytes` *after* (inside) the fake mode: the innermost mode
sees each op first, and the fake mode does not pass its outputs on to modes below it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

__all__ = ["LiveBytes", "model_state_bytes", "storages_of"]


def storages_of(tensor: torch.Tensor) -> list:
    """The untyped storages behind a tensor; a wrapper subclass (DTensor, float8) counts
    the storages of the tensors it wraps. Tensors without a storage (sparse) give none."""
    pending, storages = [tensor], []
    while pending:
        t = pending.pop()
        if is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            pending.extend(getattr(t, name) for name in names if isinstance(getattr(t, name), torch.Tensor))
            continue
        try:
            storages.append(t.untyped_storage())
        except (RuntimeError, NotImplementedError, TypeError):
            pass  # sparse and other storage-less layouts
    return storages


class LiveBytes(TorchDispatchMode):
    """Live tensor storage bytes while the mode is active, and their peak.

    `device` limits the count to one device type ("cpu", "cuda"); None counts all. A fake
    tensor counts under the device it pretends to be on.
    """

    def __init__(self, device: str | None = None) -> None:
        super().__init__()
        self.device = device
        self.current = 0
        self.peak = 0
        # id(storage) -> [weakref to the storage, bytes counted for it]
        self._live: dict[int, list] = {}
        # weakref callbacks may run on the autograd engine's threads or inside a GC pass
        # triggered while we hold the lock: hence re-entrant.
        self._lock = threading.RLock()

    # -- the count -------------------------------------------------------------------

    def reset_peak(self) -> int:
        """Start a new peak from the current count; returns the peak it replaces."""
        with self._lock:
            previous, self.peak = self.peak, self.current
            return previous

    def track(self, tensor: torch.Tensor) -> int:
        """Count a tensor's storage if it is not counted yet; returns the bytes added."""
        if self.device is not None and tensor.device.type != self.device:
            return 0
        added = 0
        for storage in storages_of(tensor):
            added += self._track_storage(storage)
        return added

    def track_existing(self, modules: Iterable = (), optimizers: Iterable = ()) -> int:
        """Count parameters, buffers, grads and optimizer state made before the mode was
        entered or outside the dispatcher (memory-mapped weights). Returns the bytes added."""
        return sum(self.track(t) for _kind, t in _state_tensors(modules, optimizers))

    def _track_storage(self, storage) -> int:
        key = id(storage)
        nbytes = storage.nbytes()
        with self._lock:
            entry = self._live.get(key)
            if entry is not None and entry[0]() is storage:
                # known storage: it may have been resized in place (resize_, set_)
                grown = nbytes - entry[1]
                if grown:
                    entry[1] = nbytes
                    self._add(grown)
                return max(grown, 0)
            ref = weakref.ref(storage, self._release_callback(key))
            self._live[key] = [ref, nbytes]
            self._add(nbytes)
            return nbytes

    def _release_callback(self, key: int):
        def release(ref) -> None:
            with self._lock:
                entry = self._live.get(key)
                # the id may already belong to a newer storage: only drop our own entry
                if entry is not None and entry[0] is ref:
                    del self._live[key]
                    self.current -= entry[1]

        return release

    def _add(self, nbytes: int) -> None:
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    # -- the mode --------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        leaves, _ = tree_flatten(out)
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                self.track(leaf)
        return out


def _state_tensors(modules: Iterable, optimizers: Iterable):
    """(kind, tensor) for every parameter, buffer, gradient and optimizer-state tensor."""
    if isinstance(modules, torch.nn.Module):
        modules = [modules]
    if hasattr(optimizers, "param_groups"):  # one optimizer, or a wrapper (accelerate's)
        optimizers = [optimizers]
    for module in modules:
        for param in module.parameters():
            yield "params", param
            if param.grad is not None:
                yield "grads", param.grad
        for buffer in module.buffers():
            yield "buffers", buffer
    for optimizer in optimizers:
        # an optimizer knows its parameters: enough where the modules are out of reach (a
        # step hook); frozen parameters it does not hold need the modules
        for group in optimizer.param_groups:
            for param in group["params"]:
                yield "params", param
                if param.grad is not None:
                    yield "grads", param.grad
        for state in optimizer.state.values():
            pending = [state]
            while pending:
                value = pending.pop()
                if isinstance(value, torch.Tensor):
                    yield "optimizer", value
                elif isinstance(value, dict):
                    pending.extend(value.values())
                elif isinstance(value, (list, tuple)):
                    pending.extend(value)


def model_state_bytes(modules: Iterable = (), optimizers: Iterable = ()) -> dict:
    """Bytes of parameters, gradients, buffers and optimizer state, each storage counted
    once (tied weights, views) under the first kind it is met as. `modules` and
    `optimizers` may each be one object or several; the optimizers' own parameters count
    too, so an optimizer alone gives everything but frozen weights and buffers.

    Returns dict(params=..., grads=..., optimizer=..., buffers=...); the values add up to
    the total without double counting.
    """
    totals = {"params": 0, "grads": 0, "optimizer": 0, "buffers": 0}
    seen: set[int] = set()
    kept_alive = []  # ids are only unique while the storages live
    for kind, tensor in _state_tensors(modules, optimizers):
        for storage in storages_of(tensor):
            if id(storage) in seen:
                continue
            seen.add(id(storage))
            kept_alive.append(storage)
            totals[kind] += storage.nbytes()
    return totals
