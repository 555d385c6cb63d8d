"""Mutants of RTL units made in-process, without touching the files on disk.

:func:`mutant` takes a unit class, one of its methods (``elaborate``) and a text replacement,
compiles the edited method's source in a copy of its module's namespace and returns a subclass
that uses it. The replaced text must occur exactly once in the method, so a mutant whose target
moved fails loudly (the error names the class, the method and the text) instead of testing the
unmutated unit.
"""

from __future__ import annotations

import inspect
import sys
import textwrap

__all__ = ["mutant"]


def mutant(cls: type, old: str, new: str, *, method: str = "elaborate",
           name: str | None = None) -> type:
    """Return a subclass of ``cls`` whose ``method`` is ``cls``'s (as resolved through its
    bases) with the source text ``old`` replaced by ``new``.

    The edited function is compiled in a copy of the globals of the module defining it (so
    the unit's module is left as it is). It must not use zero-argument ``super()``.

    Raises
    ------
    :exc:`TypeError`
        If ``cls`` is not a class, or ``method`` is not a plain function of it.
    :exc:`ValueError`
        If ``old`` does not occur exactly once in the method's source, or ``old == new``.
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class, not {cls!r}")
    func = getattr(cls, method, None)
    if not inspect.isfunction(func):
        raise TypeError(f"{cls.__name__}.{method} must be a function, not {func!r}")
    if old == new:
        raise ValueError(f"new must differ from old ({old!r})")
    source = textwrap.dedent(inspect.getsource(func))
    count = source.count(old)
    if count != 1:
        raise ValueError(f"{old!r} occurs {count} times in {func.__qualname__} (of "
                         f"{func.__module__}), not once: update the mutant")
    if "super()" in source:
        raise ValueError(f"{func.__qualname__} uses super(): it cannot be recompiled alone")
    namespace = dict(sys.modules[func.__module__].__dict__)
    label = name or f"{cls.__name__}Mutant"
    code = compile(source.replace(old, new), f"<mutant {label} of {func.__qualname__}>", "exec")
    exec(code, namespace)
    return type(label, (cls,), {method: namespace[func.__name__],
                                "__module__": cls.__module__})
