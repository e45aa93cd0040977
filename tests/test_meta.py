"""Every command's ``--json`` result says what it is (the ``meta`` block: shoal's version, the
command line, the UTC time, the scenario or serving file with its hash, the model, the job and
the pool), and ``shoal --version`` prints the version."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import typer
from tests._inputs import sailor_config_and_plan
from tests._meta import check_meta
from typer.testing import CliRunner

from shoal.cli import app
from shoal.cli.meta import version

EX = Path(__file__).resolve().parent.parent / "examples"
runner = CliRunner()

# commands whose --json result the tests of their own module check (they start processes:
# torch ranks, serving workers), with the test that does
CHECKED_ELSEWHERE = {
    "train": "tests/test_runtime.py::test_cli_train_through_torchrun_and_resume",
    "profile": "tests/test_runtime.py::test_profile_command_writes_a_profile_the_estimator_reads",
    "serve run": "tests/test_serve_live.py::test_cli_serve_run_json",
    "serve profile": "tests/test_serve_live.py::test_profile_then_the_same_trace_simulated_and_run",
}


def _commands_with_json(group=None, prefix: str = "") -> set[str]:
    """Every command of the app that has a --json option, by its path (``serve plan``)."""
    cmd = group or typer.main.get_command(app)
    out = set()
    for name, sub in getattr(cmd, "commands", {}).items():
        path = f"{prefix}{name}"
        if getattr(sub, "commands", None):
            out |= _commands_with_json(sub, path + " ")
        elif any("--json" in p.opts for p in sub.params if hasattr(p, "opts")):
            out.add(path)
    return out


def _run(args: list[str]) -> dict:
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Inputs the commands below read or write: a placement, a calibration run file, Helix's
    files."""
    from tests.test_serving import _capacity, _helix_inputs
    from tests.test_stacks import _synthetic

    from shoal.catalog.stacks import stacks

    d = tmp_path_factory.mktemp("meta")
    out = {"dir": d, **_helix_inputs(d, _capacity())}
    out["runs"] = d / "runs.json"
    out["runs"].write_text(json.dumps([r.model_dump(exclude_none=True)
                                       for r in _synthetic(stacks()["fsdp"])]))
    doc = _run(["serve", "plan", str(EX / "llama2-70b-mixed.serving.yaml"), "--objective",
                "max-flow", "--time-limit", "5", "-o", str(d / "placement.json"), "--json"])
    check_meta(doc, command="shoal serve plan", scenario=True)
    out["placement"] = d / "placement.json"
    return out


def _recipes(f: dict[str, Path]) -> dict[str, tuple[list[str], dict]]:
    d, serving = f["dir"], str(EX / "llama2-70b-mixed.serving.yaml")
    scn = dict(scenario=True, job=True)
    return {
        "estimate": (["estimate", str(EX / "het-a100-v100.yaml"), "--plan",
                      str(EX / "het-a100-v100.plan.json")], scn),
        "plan": (["plan", str(EX / "opt350m-two-zones.yaml"), "--budget", "5"], scn),
        "replay": (["replay", str(EX / "opt350m-two-zones.yaml"), "--trace",
                    str(EX / "opt350m-two-zones.events.csv"), "--budget", "5"], scn),
        "bubbles": (["bubbles", str(EX / "atlas-gpt-3dc.yaml"), "--plan",
                     str(EX / "atlas-gpt-3dc.plan.json"), "--rate", "10", "--duration", "5s"],
                    scn),
        "calibrate": (["calibrate", str(f["runs"]), "--stack", "fsdp", "-o",
                       str(d / "mine.yaml")], {}),
        "catalog gpus": (["catalog", "gpus"], {}),
        "catalog models": (["catalog", "models"], {}),
        "catalog stacks": (["catalog", "stacks"], {}),
        "import sailor": (["import", "sailor", *_sailor_files(d), "-o", str(d / "sailor")], {}),
        "import helix": (["import", "helix", "--cluster", str(f["cluster"]), "--machines",
                          str(f["machines"]), "--capacity", str(f["capacity"]), "-o",
                          str(d / "helix")], {}),
        "report": (["report", str(_estimate_json(d)), "-o", str(d / "r.html")], {}),
        "serve plan": (["serve", "plan", serving, "--objective", "max-flow", "--time-limit",
                        "5"], dict(scenario=True)),
        "serve flow": (["serve", "flow", serving, "--placement", str(f["placement"])],
                       dict(scenario=True)),
        "serve simulate": (["serve", "simulate", serving, "--placement", str(f["placement"]),
                            "--duration", "30"], dict(scenario=True)),
    }


def _sailor_files(d: Path) -> list[str]:
    cfg, plan = sailor_config_and_plan(d)
    return ["--training-config", str(cfg), "--plan", str(plan)]


def _estimate_json(d: Path) -> Path:
    p = d / "estimate.json"
    if not p.exists():
        p.write_text(runner.invoke(app, ["estimate", str(EX / "het-a100-v100.yaml"), "--plan",
                                         str(EX / "het-a100-v100.plan.json"), "--json"]).stdout)
    return p


def test_every_command_with_json_is_checked(files):
    """A command that gains --json gains a recipe here (or a check in its own tests)."""
    have = set(_recipes(files)) | set(CHECKED_ELSEWHERE)
    assert _commands_with_json() == have, _commands_with_json() ^ have


@pytest.mark.parametrize("name", ["estimate", "plan", "replay", "bubbles", "calibrate",
                                  "catalog gpus", "catalog models", "catalog stacks",
                                  "import sailor", "import helix", "report", "serve plan",
                                  "serve flow", "serve simulate"])
def test_json_results_carry_meta(files, name):
    args, want = _recipes(files)[name]
    check_meta(_run([*args, "--json"]), command=f"shoal {name}", **want)


def test_meta_names_the_scenario_by_its_label_and_hash():
    scn = EX / "het-a100-v100.yaml"
    meta = _run(["estimate", str(scn), "--plan", str(EX / "het-a100-v100.plan.json"),
                 "--json"])["meta"]
    assert meta["scenario"] == {"name": "GPT-Neo-2.7B on 32 A100 + 96 V100", "file": str(scn),
                                "sha256": hashlib.sha256(scn.read_bytes()).hexdigest()}
    assert meta["pool"] == {"gpus": {"A100-40GB": {"us-central1-a": 32},
                                     "V100-16GB": {"us-central1-a": 96}}, "total": 128}
    assert meta["model"]["name"] == "GPT-Neo-2.7B"
    assert meta["model"]["parameters"] == pytest.approx(2.7e9, rel=0.05)
    assert meta["command"] == (f"shoal estimate {scn} --plan {EX / 'het-a100-v100.plan.json'} "
                               "--json")


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"shoal {version()}"
    assert version() != "unknown"  # the test environment installs shoal
