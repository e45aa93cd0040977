"""Loops compiled to machine code by numba: the planner's inner loops (the allocation program,
the pipeline recurrence) run over small arrays, where numpy's cost per call outweighs the
arithmetic. ``compiled(signature)`` compiles a function on its first call (numba is imported
then, not when shoal is) and keeps the machine code on disk, so later processes load it. The
function itself stays plain Python (``.py_func``), for tests and reading; a compiled function
may call another by name.

A loop allocates no array: its caller passes numpy's, as output or scratch. numba compiles its
own array allocation (and an array expression such as ``a / x``) apart for each type and
shape, in each process, at a first run: 0.02-0.08 s each (benchmarks/NOTES.md).

The signature declares the argument types the function is called with from Python, in numba's
notation with abbreviations: ``i8``, ``f8``, ``b1`` (int64, float64, bool), ``f8[:, ::1]`` a
C-ordered 2-d array, ``f8[::1, :]`` a Fortran-ordered one, ``ro(...)`` a read-only array. A
call with other types still works (numba compiles for them); the declaration is what lets a
second process compile the function ahead of its first call.

**Cold start.** With an empty cache (the first run after an install) every loop is compiled
once, for seconds. A helper process then compiles declared loops into the same cache while
this process compiles what it needs in its own order: the hot ones (those the default search
needs after its first) first, the largest first. A loop the helper is compiling when this
process first calls it (or a loop calling it) is waited for and then loaded from the cache.
Each loop is compiled by whichever process claims it first (a file created exclusively in a
directory the two share). A search starts the helper (``prepare``) when the cache lacks a
hot loop: forked from this process, with numba and the loops' modules loaded and numba set up,
so it compiles from the start of the search; otherwise (another thread running, not Linux) a
new interpreter, or the helper starts at a process's first compile. It is ended when this
process ends, and ends itself when its parent is gone. ``SHOAL_JIT_HELPER=0`` turns it off.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shoal import forks

_KERNELS: list[Kernel] = []  # in the order their modules defined them
_BY_CODE: dict[Any, Kernel] = {}  # a kernel's code object -> the kernel
_HELPER_ENV = "SHOAL_JIT_HELPER"  # "0": no helper; "helper:FOLDER": this process is one
_lock = threading.Lock()
_prepared = False  # prepare() has looked in the cache
_HOT_DONE = "hot.done"  # in the claims' folder: the helper has compiled the hot functions
_HOT_ONLY = "hot.only"  # in the claims' folder: the helper compiles the hot functions only


class Kernel:
    """One compiled function: its Python source, declared signatures and machine code."""

    def __init__(self, fn: Callable[..., Any], signature: str | None, hot: bool) -> None:
        self.py_func = fn
        self.signature = signature
        self.hot = hot
        self.name = f"{fn.__module__}.{fn.__qualname__}"
        self.machine_code = functools.cache(self._machine_code)
        # the dispatcher for calls from Python, after this process's first one has waited
        # for the helper where it had claimed the function
        self.entry = functools.cache(self._entry)

    def _machine_code(self) -> Callable[..., Any]:
        from numba import njit

        _listen()
        # the compiled functions ``fn`` calls by name are given to it compiled
        fn = self.py_func
        callees = {name: k.machine_code() for name, k in self.callees().items()}
        body = fn if not callees else types.FunctionType(
            fn.__code__, {**fn.__globals__, **callees}, fn.__name__, fn.__defaults__,
            fn.__closure__)
        # no rewrite passes (the loops have no array expressions or raises to rewrite) and no
        # C callback wrapper (nothing takes them as function pointers): 7% less compiling
        return njit(cache=True, nogil=True, no_rewrites=True, no_cfunc_wrapper=True)(body)

    def callees(self) -> dict[str, Kernel]:
        """The compiled functions this one calls, by the names it calls them."""
        g = self.py_func.__globals__
        return {name: g[name].kernel for name in self.py_func.__code__.co_names
                if isinstance(getattr(g.get(name), "kernel", None), Kernel)}

    def size(self) -> int:
        """Bytecode bytes of this function and those it calls (a proxy for compile time)."""
        return len(self.py_func.__code__.co_code) + sum(k.size() for k in self.callees().values())

    def _entry(self) -> Callable[..., Any]:
        disp = self.machine_code()
        session = _Session.current
        if session is not None and not disp.signatures:
            # the functions it calls first: one the helper is compiling is waited for, so
            # compiling this one loads it instead of compiling it again
            for kernel in self._closure():
                session.claim_or_wait(kernel)
        return disp

    def _closure(self) -> list[Kernel]:
        """This function after those it calls, transitively (each once)."""
        out: list[Kernel] = []
        for k in self.callees().values():
            out += [x for x in k._closure() if x not in out]
        return [*out, self]

    def argtypes(self) -> tuple[Any, ...]:
        """The declared argument types, as numba types (the function must declare them)."""
        from numba import types as nt

        names = {"i8": nt.int64, "f8": nt.float64, "b1": nt.boolean,
                 "ro": lambda a: a.copy(readonly=True)}
        return tuple(eval(f"({self.signature},)", {"__builtins__": {}}, names))


def compiled(signature: str | None = None, *,
             hot: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``fn`` compiled on its first call. ``signature``: the argument types it is
    called with from Python (see the module's notes); None for a function only other compiled
    functions call. ``hot``: the default plan search calls it, after its first compiled call
    (a helper compiles these first)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        kernel = Kernel(fn, signature, hot)
        _KERNELS.append(kernel)
        _BY_CODE[fn.__code__] = kernel
        entry = kernel.entry

        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            return entry()(*args)

        call.py_func = fn  # type: ignore[attr-defined]
        call.machine_code = kernel.machine_code  # type: ignore[attr-defined]
        call.kernel = kernel  # type: ignore[attr-defined]
        return call

    return wrap


class _Session:
    """The claims this process shares with the helper compiling alongside it."""

    current: _Session | None = None

    def __init__(self, folder: Path, helper: subprocess.Popen[bytes] | None) -> None:
        self.folder = folder
        self.helper = helper
        self.mine: list[Kernel] = []  # claimed by this process, not yet marked done
        self.claimed: set[str] = set()  # every kernel this process claimed

    def claim(self, kernel: Kernel) -> bool:
        if kernel.name in self.claimed:
            return True
        try:
            os.close(os.open(self.folder / f"{kernel.name}.claim",
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        except OSError:  # the folder is gone: the other process has ended
            return False
        self.mine.append(kernel)
        self.claimed.add(kernel.name)
        return True

    def claim_or_wait(self, kernel: Kernel) -> None:
        """Before this process's first call of ``kernel``: claim it (this process compiles
        it), or wait while the helper compiles it (the call then loads it)."""
        if self.claim(kernel):
            return
        done = self.folder / f"{kernel.name}.done"
        while not done.exists() and self.helper is not None and self.helper.poll() is None:
            time.sleep(0.002)

    def mark_done(self) -> None:
        for kernel in self.mine:
            (self.folder / f"{kernel.name}.done").touch()
        self.mine.clear()

    def close(self) -> None:
        if self.helper is not None and self.helper.poll() is None:
            self.helper.terminate()
            try:
                self.helper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.helper.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


_listening = False


def _listen() -> None:
    """Hear numba's compiles (once per process): a process's first compile of a kernel starts
    the helper; every compile of a kernel claims it."""
    global _listening
    if _listening:
        return
    from numba.core import event

    class Listener(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            kernel = _BY_CODE.get(getattr(ev.data["dispatcher"].py_func, "__code__", None))
            if kernel is not None:
                _compiling(kernel)

        def on_end(self, ev: event.Event) -> None:
            pass

    with _lock:
        if not _listening:
            event.register("numba:compile", Listener())
            _listening = True


def _compiling(kernel: Kernel) -> None:
    with _lock:
        if _Session.current is None:
            _start_helper()
        session = _Session.current
    if session is not None:
        session.claim(kernel)


def prepare() -> None:
    """Start the helper now if a hot declared function is not in the cache (the first run
    after an install), rather than at this process's first compile: forked after numba is set
    up, it compiles from now on. Reads the cache's index files only (a millisecond)."""
    global _prepared
    if _prepared:
        return
    hot = [k for k in _KERNELS if k.hot and k.signature]  # of the modules imported so far
    if not hot or not _helper_allowed():
        return
    _prepared = True
    if any(_cached(k) is False for k in hot):
        _set_up_numba()
        with _lock:
            if _Session.current is None:
                _start_helper(fork=True)


def only_hot() -> None:
    """The helper, if one runs, compiles the hot declared functions only (a copy of this
    process computing alongside it needs the other core more than the other functions do)."""
    session = _Session.current
    if session is not None and session.helper is not None:
        with contextlib.suppress(OSError):
            (session.folder / _HOT_ONLY).touch()


def settle() -> None:
    """In a copy of this process forked to compute alongside it (``forks.Forked``): wait while
    the helper compiles the hot declared functions (a first run after an install), rather than
    compile them a second time; then compile what is missing in this copy, with no helper and
    no claims (the helper and this process's parent keep theirs)."""
    os.environ[_HELPER_ENV] = "0"
    session, _Session.current = _Session.current, None
    if session is None or session.helper is None:
        return
    while (session.folder.exists() and not (session.folder / _HOT_DONE).exists()
           and forks.alive(session.helper.pid)):
        time.sleep(0.005)


def _set_up_numba() -> None:
    """What numba sets up at a process's first compile, done before the helper is forked so
    that it starts compiling at once (this process would do it at its first compile)."""
    try:
        from numba.core.registry import cpu_target

        cpu_target.typing_context.refresh()
        cpu_target.target_context.refresh()
    except Exception:  # noqa: BLE001 - numba's internals changed: each process sets up its own
        pass


def _cached(kernel: Kernel) -> bool | None:
    """Whether numba's cache holds machine code for ``kernel``'s current source; None when
    numba's cache does not tell (its layout is numba's own, not a public interface)."""
    try:
        return bool(kernel.machine_code()._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - any change in numba's internals: no answer
        return None


def _helper_allowed() -> bool:
    """Not turned off, not the helper itself, and on the main thread (the helper ends with
    the thread that started it)."""
    setting = os.environ.get(_HELPER_ENV, "")
    return (setting != "0" and not setting.startswith("helper:")
            and threading.current_thread() is threading.main_thread())


def _start_helper(fork: bool = False) -> None:
    """Start the helper, where allowed (``_helper_allowed``): a new interpreter, or with
    ``fork`` (on Linux, with no other thread running) a copy of this process, which has numba
    and the functions' modules loaded already. (macOS's system libraries are not safe to use
    in a forked copy, and Windows has no fork.)"""
    if not _helper_allowed():
        return
    modules = list(dict.fromkeys(k.py_func.__module__ for k in _KERNELS if k.signature))
    if not modules:
        return
    folder = Path(tempfile.mkdtemp(prefix="shoal-jit-"))
    helper: subprocess.Popen[bytes] | forks.Forked
    try:
        if fork and forks.can_fork():
            helper = forks.Forked.start(functools.partial(_forked_help, os.getpid(), folder,
                                                          modules), name=b"shoal-jit")
        else:
            helper = subprocess.Popen(
                [sys.executable, "-c", "import sys; from shoal import jit; "
                 "jit._help(int(sys.argv[1]), sys.argv[2:])", str(os.getpid()), *modules],
                # shoal importable as in this process (a source tree on sys.path, say)
                env={**os.environ, _HELPER_ENV: f"helper:{folder}",
                     "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        return
    _Session.current = _Session(folder, helper)
    atexit.register(_Session.current.close)


def _end_with_parent(folder: Path) -> None:
    """On SIGTERM, remove ``folder`` and end; on Linux, be sent SIGTERM when the parent
    process ends (killed, its own clean-up does not run)."""
    import signal

    def end(signum: int, frame: object) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, end)
    forks.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _forked_help(parent: int, folder: Path, modules: list[str]) -> None:
    """The helper, in a copy of the parent (``forks.Forked``): nothing of its locks, then
    ``_help``."""
    global _lock
    _lock = threading.Lock()  # held by the thread that forked
    os.environ[_HELPER_ENV] = f"helper:{folder}"
    _help(parent, modules)


def _help(parent: int, modules: list[str]) -> None:
    """The helper: compile every declared kernel of ``modules`` that no process has claimed,
    hot ones first and of those the largest first, until done or the parent is gone."""
    folder = Path(os.environ[_HELPER_ENV].removeprefix("helper:"))
    _end_with_parent(folder)
    try:
        _compile_all(parent, folder, modules)
    finally:  # the claims are done with: the parent waits only while this process runs
        shutil.rmtree(folder, ignore_errors=True)


def _compile_all(parent: int, folder: Path, modules: list[str]) -> None:
    session = _Session(folder, None)
    _Session.current = session
    for m in modules:
        importlib.import_module(m)
    # what the default search needs, the largest first: the process compiling what it needs
    # in turn meets it later
    for kernel in sorted(_KERNELS, key=lambda k: (k.hot, k.size()), reverse=True):
        if os.getppid() != parent or not folder.exists():
            return
        if not kernel.hot:
            (folder / _HOT_DONE).touch()  # ``settle``'s mark
            if (folder / _HOT_ONLY).exists():
                return
        if not kernel.signature or not session.claim(kernel):
            continue
        kernel.machine_code().compile(kernel.argtypes())
        session.mark_done()  # with the kernels it calls, claimed as they were compiled
