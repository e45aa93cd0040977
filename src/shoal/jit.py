"""Loops compiled to machine code by numba: the planner's inner loops (the allocation program,
the pipeline recurrence) run over small arrays, where numpy's cost per call outweighs the
arithmetic. ``compiled(fn)`` compiles ``fn`` on its first call (numba is imported then, not
when shoal is) and keeps the machine code on disk, so later processes load it. ``fn`` itself
stays plain Python (``.py_func``), for tests and reading; a compiled function may call
another by name."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.cache
    def machine_code() -> Callable[..., Any]:
        from numba import njit

        # the compiled functions ``fn`` calls by name are given to it compiled
        g = fn.__globals__
        callees = {name: g[name].machine_code() for name in fn.__code__.co_names
                   if callable(getattr(g.get(name), "machine_code", None))}
        body = fn if not callees else types.FunctionType(
            fn.__code__, {**g, **callees}, fn.__name__, fn.__defaults__, fn.__closure__)
        return njit(cache=True, nogil=True)(body)

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        return machine_code()(*args)

    call.py_func = fn  # type: ignore[attr-defined]
    call.machine_code = machine_code  # type: ignore[attr-defined]
    return call
