"""Loops compiled to machine code by numba: the planner's inner loops (the allocation program,
the pipeline recurrence) run over small arrays, where numpy's cost per call outweighs the
arithmetic. ``compiled(fn)`` compiles ``fn`` on its first call (numba is imported then, not
when shoal is) and keeps the machine code on disk, so later processes load it. ``fn`` itself
stays plain Python (``.py_func``), for tests and reading."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.cache
    def machine_code() -> Callable[..., Any]:
        from numba import njit

        return njit(cache=True, nogil=True)(fn)

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        return machine_code()(*args)

    call.py_func = fn  # type: ignore[attr-defined]
    return call
