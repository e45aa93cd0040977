"""A small builder for mixed-integer programs solved by HiGHS (``highspy``): columns and rows
are added by name-free index, the model is passed in one call, and a solve can stop early on a
target objective or a window without improvement."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import time
from dataclasses import dataclass, field

import highspy
import numpy as np

INF = highspy.kHighsInf


@contextlib.contextmanager
def _no_stdout():
    """C-level stdout goes to /dev/null: HiGHS prints its banner from the constructor, before any
    option can turn output off, and it must not reach a command's --json output."""
    sys.stdout.flush()
    libc = ctypes.CDLL(None)
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def new_highs() -> highspy.Highs:
    """A silent HiGHS instance."""
    with _no_stdout():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


@dataclass
class Model:
    maximize: bool = True
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[float, float, list[int], list[float]]] = field(default_factory=list)
    quad: list[float] = field(default_factory=list)

    def var(self, lo: float = 0.0, hi: float = INF, cost: float = 0.0,
            integer: bool = False, quad: float = 0.0) -> int:
        """A column; ``quad``: a cost ``quad x²`` besides ``cost x`` (convex: a minimising
        model of continuous columns only, which HiGHS solves as a quadratic program)."""
        self.lo.append(lo)
        self.hi.append(hi)
        self.cost.append(cost)
        self.integer.append(integer)
        self.quad.append(quad)
        return len(self.lo) - 1

    def row(self, idx: list[int], val: list[float], lo: float = -INF, hi: float = INF) -> None:
        self.rows.append((lo, hi, list(idx), [float(v) for v in val]))

    @property
    def n_vars(self) -> int:
        return len(self.lo)

    def satisfied(self, x: np.ndarray, tol: float = 1e-9) -> bool:
        """Whether ``x`` keeps every column's bounds and every row, each within ``tol``
        (integer columns are not checked for integrality)."""
        if len(x) != self.n_vars:
            return False
        if (x < np.asarray(self.lo) - tol).any() or (x > np.asarray(self.hi) + tol).any():
            return False
        for lo, hi, idx, val in self.rows:
            v = float(np.dot(x[idx], val)) if idx else 0.0
            if v < lo - tol or v > hi + tol:
                return False
        return True

    def solve(self, *, time_limit_s: float, start: np.ndarray | None = None,
              target: float | None = None, stall_s: float | None = None,
              exact: bool = False, options: dict | None = None,
              relaxed: bool = False) -> Solution:
        """Solve; stop at ``time_limit_s``, when the best solution reaches ``target``, or when
        it has not improved for ``stall_s`` seconds. ``start``: a feasible point to begin from;
        ``exact``: to the optimum (no relative gap left), not HiGHS's default gap; ``options``:
        further HiGHS options; ``relaxed``: the LP relaxation (every column continuous), solved
        by the simplex (unless ``options`` choose another solver), so its solution is a
        vertex."""
        integer = any(self.integer) and not relaxed
        lp = self._lp(integer)
        h = new_highs()
        h.setOptionValue("threads", 1)
        h.setOptionValue("random_seed", 0)
        h.setOptionValue("time_limit", float(max(time_limit_s, 0.01)))
        if exact:
            h.setOptionValue("mip_rel_gap", 0.0)
        if relaxed:
            h.setOptionValue("solver", "simplex")
        for name, value in (options or {}).items():
            h.setOptionValue(name, value)
        h.passModel(lp)
        if any(self.quad):
            self._pass_hessian(h, integer)
        if start is not None:
            sol = highspy.HighsSolution()
            sol.col_value = list(np.asarray(start, dtype=float))
            sol.value_valid = True
            h.setSolution(sol)
        t0 = time.perf_counter()
        if target is not None or stall_s is not None:
            self._stop_early(h, t0, target, stall_s)
        h.run()
        status = h.getModelStatus()
        info = h.getInfo()
        has = info.primal_solution_status == 2  # feasible
        x = np.array(h.getSolution().col_value) if has else None
        bound = info.mip_dual_bound if integer else info.objective_function_value
        return Solution(status=h.modelStatusToString(status), x=x,
                        objective=info.objective_function_value if has else None,
                        bound=float(bound), time_s=time.perf_counter() - t0,
                        infeasible=status == highspy.HighsModelStatus.kInfeasible)

    def _lp(self, integer: bool) -> highspy.HighsLp:
        """The model as HiGHS takes it: columns, row bounds and the row-wise matrix
        (``integer``: with the columns' integrality)."""
        lp = highspy.HighsLp()
        lp.num_col_ = self.n_vars
        lp.num_row_ = len(self.rows)
        lp.sense_ = highspy.ObjSense.kMaximize if self.maximize else highspy.ObjSense.kMinimize
        lp.col_cost_ = np.asarray(self.cost, dtype=float)
        lp.col_lower_ = np.asarray(self.lo, dtype=float)
        lp.col_upper_ = np.asarray(self.hi, dtype=float)
        lp.row_lower_ = np.array([r[0] for r in self.rows], dtype=float)
        lp.row_upper_ = np.array([r[1] for r in self.rows], dtype=float)
        starts, index, value = [0], [], []
        for r in self.rows:
            index += r[2]
            value += r[3]
            starts.append(len(index))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(value, dtype=float)
        if integer:
            lp.integrality_ = [highspy.HighsVarType.kInteger if i else
                               highspy.HighsVarType.kContinuous for i in self.integer]
        return lp

    def _pass_hessian(self, h: highspy.Highs, integer: bool) -> None:
        """The quadratic costs: HiGHS minimises c x + x' Q x / 2, so Q = 2 diag(quad)."""
        if self.maximize or integer or min(self.quad) < 0:
            raise ValueError("quadratic costs need a minimising model of continuous "
                             "columns with quad >= 0")
        hes = highspy.HighsHessian()
        hes.dim_ = self.n_vars
        hes.format_ = highspy.HessianFormat.kTriangular
        hes.start_ = np.arange(self.n_vars + 1, dtype=np.int32)
        hes.index_ = np.arange(self.n_vars, dtype=np.int32)
        hes.value_ = 2.0 * np.asarray(self.quad, dtype=float)
        h.passHessian(hes)

    def _stop_early(self, h: highspy.Highs, t0: float, target: float | None,
                    stall_s: float | None) -> None:
        """Interrupt the solve once the best solution reaches ``target``, or once it has not
        improved for ``stall_s`` seconds (from ``t0``, or its last improvement)."""
        state = {"best": -np.inf if self.maximize else np.inf, "at": t0}
        sign = 1.0 if self.maximize else -1.0

        def interrupt(_type, _msg, data_out, data_in, _user):
            best = data_out.mip_primal_bound
            if np.isfinite(best) and sign * (best - state["best"]) > 1e-9:
                state["best"], state["at"] = best, time.perf_counter()
            stop = target is not None and np.isfinite(best) and sign * (best - target) >= 0
            if stall_s is not None and np.isfinite(state["best"]):
                stop |= time.perf_counter() - state["at"] > stall_s
            if stop:
                data_in.user_interrupt = True

        h.setCallback(interrupt, None)
        h.startCallback(highspy.cb.HighsCallbackType.kCallbackMipInterrupt)


@dataclass(frozen=True)
class Solution:
    status: str
    x: np.ndarray | None
    objective: float | None
    bound: float
    time_s: float
    infeasible: bool
