"""Tables at 80 columns: no line wider than the terminal and no number split across lines (a
table too wide is shown in parts, each with the column that names its rows)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shoal.cli import app

EX = Path(__file__).resolve().parent.parent / "examples"
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:e[+-]\d+)?")


def _run(args: list[str], columns: int) -> str:
    r = CliRunner(env={"COLUMNS": str(columns)}).invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("narrow") / "plan.json"
    _run(["plan", str(EX / "opt350m-two-zones.yaml"), "--budget", "5", "-o", str(out), "-q"],
         80)
    return out


def _commands(plan_file: Path) -> dict[str, list[str]]:
    return {
        "estimate": ["estimate", str(EX / "opt350m-two-zones.yaml"), "--plan", str(plan_file)],
        "estimate-het": ["estimate", str(EX / "het-a100-v100.yaml"), "--plan",
                         str(EX / "het-a100-v100.plan.json")],
        "plan": ["plan", str(EX / "opt350m-two-zones.yaml"), "--budget", "5"],
        "replay": ["replay", str(EX / "opt350m-two-zones.yaml"), "--trace",
                   str(EX / "opt350m-two-zones.events.csv"), "--budget", "5", "--policy", "all"],
        "catalog gpus": ["catalog", "gpus"],
        "catalog models": ["catalog", "models"],
        "catalog stacks": ["catalog", "stacks"],
    }


@pytest.mark.parametrize("name", ["estimate", "estimate-het", "plan", "replay", "catalog gpus",
                                  "catalog models", "catalog stacks"])
def test_80_columns_fit_and_split_no_number(plan_file, name):
    args = _commands(plan_file)[name]
    narrow, wide = _run(args, 80), _run(args, 250)
    long = [line for line in narrow.splitlines() if len(line.rstrip()) > 80]
    assert not long, long
    # every number of the wide output is whole in the narrow one, and no piece of one appears
    # (search times differ between the two runs: the lines that give them are left out)
    pieces = set(NUMBER.findall(_untimed(narrow))) - set(NUMBER.findall(_untimed(wide)))
    assert not pieces, pieces


def _untimed(text: str) -> str:
    return re.sub(r"(searched|planned) in [^\n]*(\n\S[^\n]*)?", "", text)


def test_a_split_table_repeats_the_column_that_names_its_rows(plan_file):
    out = _run(_commands(plan_file)["estimate"], 80)
    stage_headers = [line for line in out.splitlines() if line.split()[:1] == ["stage"]]
    assert len(stage_headers) >= 3  # the stage table in two parts, then the workers
    assert "GiB" in out and " GB " not in out  # memory in binary units, labelled
