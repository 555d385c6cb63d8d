"""Compile cached Numba functions one process at a time.

Numba's on-disk cache (``cache=True``) updates its index file with an unlocked
read-modify-write.  Two processes that compile the same function at the same time, as
pytest-xdist workers do on a cold cache, can leave an index entry that names the other
process's machine code for a different signature; a later process then loads it and computes
garbage.  :func:`ensure_compiled` (a call that does no work, for the Q/DQ kernels) and
:func:`locked_call` (the real call, for the MatMulNBits kernels) take an inter-process file
lock, one per function, around the first call of a cached function with each combination of
argument types, so that its compiling, saving and loading are serialised; later calls do not
lock.  The functions it calls must not be cached themselves (they are compiled into the
caller's cache entry), or they would be shared without a lock.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading

import numpy as np

__all__ = ["compile_lock", "ensure_compiled", "locked_call"]

_seen: set = set()
_thread_lock = threading.RLock()


@contextlib.contextmanager
def compile_lock(name: str = "qaccel"):
    """Hold the inter-process lock ``name`` (one per cached function)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f"qaccel-numba-{os.getuid()}-{name}.lock")
    with _thread_lock, open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _type_key(value):
    if isinstance(value, np.ndarray):
        f = value.flags
        # what Numba's array type holds: dtype, rank, layout, read-only, aligned
        return value.dtype, value.ndim, f.c_contiguous, f.f_contiguous, f.writeable, f.aligned
    if isinstance(value, tuple):
        return tuple(map(_type_key, value))
    return type(value)


def ensure_compiled(dispatcher, *args) -> None:
    """Call ``dispatcher(*args)`` under its :func:`compile_lock` if these argument types are new.

    Use arguments that make the call do no work (the kernels take an empty item range).
    """
    key = (dispatcher, *map(_type_key, args))
    if key in _seen:
        return
    func = dispatcher.py_func
    with compile_lock(f"{func.__module__}.{func.__qualname__}"):
        dispatcher(*args)
    _seen.add(key)


def locked_call(dispatcher, *args):
    """Return ``dispatcher(*args)``, called under its :func:`compile_lock` if these argument
    types are new: compiling, or loading from the cache, is then serialised with other
    processes (the call itself runs under the lock too, this once)."""
    key = (dispatcher, *map(_type_key, args))
    if key in _seen:
        return dispatcher(*args)
    func = dispatcher.py_func
    with compile_lock(f"{func.__module__}.{func.__qualname__}"):
        result = dispatcher(*args)
    _seen.add(key)
    return result
