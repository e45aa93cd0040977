"""The compiled loops' cold start (``shoal.jit``): the declared signatures are the types the
planners call the loops with, a helper process compiles them into an empty cache so that a
search then compiles nothing, a search forks the helper only when the cache lacks a loop, a
cold ``shoal plan`` leaves no helper or folder behind and plans as a warm one does, the helper
(started or forked) ends with its parent, and the claims make a process wait only for a loop
the helper is compiling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests._clock import patience
from tests._proc import descendants, left_after, running
from tests._proc import shoal as run_shoal

import shoal.training.planners  # noqa: F401  (the loops register)
from shoal import jit

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SRC = str(Path(jit.__file__).resolve().parents[1])


def _python(script: str, env: dict, tmp: Path) -> dict:
    """Run ``script`` in a fresh interpreter; it writes a JSON answer to OUT."""
    out = tmp / "answer.json"
    env = {**os.environ, "PYTHONPATH": SRC, "OUT": str(out), **env}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, cwd=tmp,
                   stdout=subprocess.DEVNULL, timeout=patience(600))
    return json.loads(out.read_text())


# plans with each strategy that compiles loops, counting the numba compiles of shoal's loops
SEARCHES = """
import json, os, sys
from numba.core import event
import shoal.training.planners  # noqa: F401  (the loops register)
from shoal import jit
from shoal.cli import main

compiles = []
class Count(event.Listener):
    def on_start(self, ev):
        f = ev.data["dispatcher"].py_func
        if f.__module__.startswith("shoal"):
            compiles.append(f.__qualname__)
    def on_end(self, ev):
        pass
event.register("numba:compile", Count())
if os.environ.get("WAIT_FOR_HELPER"):
    import numpy as np
    import shoal.training.planners.zorse
    from shoal.training.planners.auto import kernels
    # a first compile starts the helper
    kernels.min_max_cuts(np.zeros((1, 2)), 1, np.zeros((1, 2), np.int64), np.zeros((1, 2)))
    helper = jit._Session.current.helper
    helper.wait()
    compiles.clear()
for example, strategy in [("opt350m-two-zones.yaml", "auto"), ("het-a100-v100.yaml", "sailor"),
                          ("zorse-cluster-c.yaml", "sailor")]:
    sys.argv = ["shoal", "plan", os.path.join(os.environ["EXAMPLES"], example), "--json",
                "--strategy", strategy, "--top", "1", "--output", os.devnull]
    try:
        main()
    except SystemExit as e:
        assert not e.code, e.code
called = {k.name: {"declared": [str(k.argtypes())] if k.signature else [],
                   "used": [str(s) for s in k.machine_code().signatures]}
          for k in jit._KERNELS if k.entry.cache_info().currsize}
json.dump({"called": called, "compiles": compiles,
           "helper": None if jit._Session.current is None else
           jit._Session.current.helper.returncode}, open(os.environ["OUT"], "w"))
"""


def test_the_declared_signatures_are_the_types_the_planners_call_the_loops_with(tmp_path):
    got = _python(SEARCHES, {"EXAMPLES": str(EXAMPLES), "SHOAL_JIT_HELPER": "0"}, tmp_path)
    called = got["called"]
    # the allocation program, the bounds, the pipeline recurrence, Zorse's min-cut, the
    # greedy allocation of Sailor's strategy
    assert {"shoal.training.planners.allocate.dp.search_taus",
            "shoal.training.planners.auto.kernels._least_level",
            "shoal.estimate.pipeline._recurrence", "shoal.training.planners.zorse._phases",
            "shoal.training.planners.allocate.greedy.greedy"} <= set(called)
    for name, sigs in called.items():
        assert sigs["declared"], f"{name} is called from Python with no declared signature"
        assert set(sigs["used"]) <= set(sigs["declared"]), (name, sigs)


def test_the_helper_fills_an_empty_cache_so_a_search_compiles_nothing(tmp_path):
    got = _python(SEARCHES, {"EXAMPLES": str(EXAMPLES), "WAIT_FOR_HELPER": "1",
                             "NUMBA_CACHE_DIR": str(tmp_path / "cache")}, tmp_path)
    assert got["helper"] == 0
    assert got["compiles"] == []


def _processes_with(mark: str) -> list[int]:
    """The running processes whose environment holds ``mark`` (``NAME=value``): a helper
    forked or started by a process given it."""
    out = []
    for d in os.listdir("/proc"):
        try:
            env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark.encode() in env and running(int(d)):
            out.append(int(d))
    return out


PREPARE = """
import json, os
import shoal.training.planners  # noqa: F401  (the loops register)
from shoal import forks, jit
jit.prepare()
s = jit._Session.current
out = {"helper": None} if s is None else {
    "forked": isinstance(s.helper, forks.Forked), "exit": s.helper.wait(float(os.environ["T"]))}
json.dump(out, open(os.environ["OUT"], "w"))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the helper is forked on Linux")
def test_a_search_on_an_empty_cache_forks_the_helper_and_one_on_a_full_cache_does_not(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "T": str(patience(600))}
    # the cache lacks the hot loops: forked at once, it compiles every declared loop
    assert _python(PREPARE, env, tmp_path) == {"forked": True, "exit": 0}
    assert _python(PREPARE, env, tmp_path) == {"helper": None}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_cold_plan_leaves_nothing_behind_and_plans_as_a_warm_one(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    runs = []
    for _ in ("cold", "warm"):
        p = run_shoal("plan", EXAMPLES / "opt350m-two-zones.yaml", "--json", env=env,
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=patience(600))
        assert p.returncode == 0, err.decode()
        assert _processes_with(f"NUMBA_CACHE_DIR={tmp_path / 'cache'}") == []
        runs.append(json.loads(out)["plans"])
    assert os.listdir(tmp_path / "tmp") == []  # the claims' folder is gone
    assert runs[0] == runs[1]


START = {  # a first compile starts a new interpreter; a search on an empty cache forks
    "started": "kernels.min_max_cuts(np.zeros((1, 2)), 1, np.zeros((1, 2), np.int64), np.zeros((1, 2)))\n",
    "forked": "from shoal import forks\njit.prepare()\n"
              "assert isinstance(jit._Session.current.helper, forks.Forked)\n"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("how", sorted(START))
def test_the_helper_ends_when_its_parent_is_killed(tmp_path, how):
    """A process killed while its helper compiles: the helper ends too, and removes the
    folder of claims."""
    script = ("import numpy as np, shoal.training.planners, time\n"
              "from shoal import jit\n"
              "from shoal.training.planners.auto import kernels\n" + START[how] +
              "print(jit._Session.current.helper.pid, jit._Session.current.folder, flush=True)\n"
              "time.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": SRC, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    parent = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE)
    try:
        pid, folder = parent.stdout.readline().split()
        helper = int(pid)
        assert helper in descendants(parent.pid) and running(helper)
        # what the cold plan's test looks for after its run finds a helper while it runs
        assert helper in _processes_with(f"NUMBA_CACHE_DIR={tmp_path / 'cache'}")
        assert Path(folder.decode()).is_dir()
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=patience(60))
        assert left_after([helper], patience(30)) == []
        assert not Path(folder.decode()).exists()  # the claims' folder: the helper removed it
    finally:
        parent.kill()
        parent.stdout.close()


class _Sleeper:
    """A stand-in helper process, alive until ended."""

    def __enter__(self) -> subprocess.Popen:
        self.p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        return self.p

    def __exit__(self, *exc) -> None:
        self.p.kill()
        self.p.wait()


def test_a_loop_the_helper_compiles_is_waited_for_and_one_claimed_here_is_not(tmp_path):
    kernels = [k for k in jit._KERNELS if k.signature][:3]
    with _Sleeper() as helper:
        mine = jit._Session(tmp_path, helper)
        theirs = jit._Session(tmp_path, None)
        assert theirs.claim(kernels[0])  # the helper claims the first
        assert mine.claim(kernels[1]) and not theirs.claim(kernels[1])
        t0 = time.monotonic()
        mine.claim_or_wait(kernels[1])  # claimed here: no wait
        mine.claim_or_wait(kernels[2])  # nobody's: claimed now
        assert not theirs.claim(kernels[2])
        assert time.monotonic() - t0 < patience(5)
        waited = threading.Event()

        def wait() -> None:
            mine.claim_or_wait(kernels[0])
            waited.set()

        threading.Thread(target=wait, daemon=True).start()
        time.sleep(0.2)
        assert not waited.is_set()  # the helper has not finished it
        theirs.mark_done()
        assert waited.wait(patience(30))


def test_a_wait_ends_when_the_helper_ends_without_the_loop(tmp_path):
    kernel = next(k for k in jit._KERNELS if k.signature)
    with _Sleeper() as helper:
        assert jit._Session(tmp_path, None).claim(kernel)
        mine = jit._Session(tmp_path, helper)
        done = threading.Event()
        threading.Thread(target=lambda: (mine.claim_or_wait(kernel), done.set()),
                         daemon=True).start()
        time.sleep(0.2)
        assert not done.is_set()
        helper.kill()
        assert done.wait(patience(30))
