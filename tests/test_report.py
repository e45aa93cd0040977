"""`shoal report`: one self-contained HTML page from the commands' JSON outputs; checked in
headless Chromium (slow) and by parsing the page."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shoal.cli import app

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"
ARTIFACTS = ROOT / "build" / "test-artifacts"
FIGURES = {"estimate": 2, "plan": 2, "replay": 1, "bubbles": 1, "serve plan": 1,
           "serve simulate": 1}


def _shoal(*args: str) -> str:
    """Run the installed CLI in a subprocess, as a user would, and return its stdout."""
    out = subprocess.run([sys.executable, "-m", "shoal", *args], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("report")
    runs = {
        "estimate": ["estimate", str(EX / "het-a100-v100.yaml"), "--plan",
                     str(EX / "het-a100-v100.plan.json"), "--json"],
        "plan": ["plan", str(EX / "opt350m-two-zones.yaml"), "--budget", "10", "--json"],
        "replay": ["replay", str(EX / "opt350m-two-zones.yaml"), "--trace",
                   str(EX / "opt350m-two-zones.events.csv"), "--policy", "all", "--budget", "10",
                   "--json"],
        "bubbles": ["bubbles", str(EX / "atlas-gpt-3dc.yaml"), "--plan",
                    str(EX / "atlas-gpt-3dc.plan.json"), "--rate", "50", "--duration", "20s",
                    "--json"],
        "serve plan": ["serve", "plan", str(EX / "llama2-70b-mixed.serving.yaml"),
                       "--time-limit", "5", "--json", "-o", str(d / "placement.json")],
    }
    out = {}
    for kind, args in runs.items():
        text = _shoal(*args)
        json.loads(text)  # stdout is exactly one JSON document (no solver banners)
        out[kind] = d / f"{kind.replace(' ', '-')}.json"
        out[kind].write_text(text)
    text = _shoal("serve", "simulate", str(EX / "llama2-70b-mixed.serving.yaml"), "--placement",
                  str(d / "placement.json"), "--json")
    out["serve simulate"] = d / "serve-simulate.json"
    out["serve simulate"].write_text(text)
    return out


@pytest.fixture(scope="module")
def report(inputs, tmp_path_factory) -> Path:
    page = tmp_path_factory.mktemp("page") / "report.html"
    r = CliRunner().invoke(app, ["report", *map(str, inputs.values()), "-o", str(page), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [s["kind"] for s in doc["sections"]] == list(inputs)
    return page


def test_report_embeds_every_figure(report):
    html = report.read_text()
    assert "http://" not in html and "https://" not in html  # nothing fetched from a network
    for kind, n in FIGURES.items():
        sec = re.search(rf'<section id="s\d+" data-kind="{kind}">(.*?)</section>', html, re.S)
        assert sec, kind
        imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', sec.group(1))
        assert len(imgs) == n, (kind, len(imgs))
        for data in imgs:
            png = base64.b64decode(data)
            assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        assert sec.group(1).count("<figcaption>") == n


def test_report_bad_inputs_write_nothing(tmp_path, inputs):
    out = tmp_path / "r.html"
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    r = CliRunner().invoke(app, ["report", str(inputs["estimate"]), str(bad), "-o", str(out)])
    assert r.exit_code == 2 and "not a result the report draws" in r.output
    assert "bad.json" in r.output and not out.exists()
    failed = tmp_path / "failed.json"  # a command's --json error
    failed.write_text('{"error": "scenario.yaml: file not found"}')
    r = CliRunner().invoke(app, ["report", str(failed), "-o", str(out)])
    assert r.exit_code == 2 and "the error of a command that failed" in r.output
    assert not out.exists()
    # a hand-edited estimate: a capacity of 0 bytes, or NaN (which JSON does not have)
    doc = json.loads(Path(inputs["estimate"]).read_text())
    doc["workers"][0]["capacity_bytes"] = 0
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps(doc))
    r = CliRunner().invoke(app, ["report", str(zero), "-o", str(out)])
    assert r.exit_code == 2 and "inconsistent estimate result" in r.output and not out.exists()
    nan = tmp_path / "nan.json"
    nan.write_text(Path(inputs["estimate"]).read_text().replace(
        '"iteration_time_s": ', '"iteration_time_s": NaN, "x": ', 1))
    r = CliRunner().invoke(app, ["report", str(nan), "-o", str(out)])
    assert r.exit_code == 2 and "NaN is not a JSON number" in r.output and not out.exists()
    trained = tmp_path / "train.json"  # a `shoal train --json` result
    trained.write_text('{"steps": 3, "losses": [5.5, 5.4, 5.3], "final_loss": 5.3}')
    r = CliRunner().invoke(app, ["report", str(trained), "-o", str(out)])
    assert r.exit_code == 2 and "a `shoal train` result" in r.output and not out.exists()
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("model: GPT-Neo-2.7B\n")
    r = CliRunner().invoke(app, ["report", str(scenario), "-o", str(out)])
    assert r.exit_code == 2 and "not a shoal result" in r.output and not out.exists()
    r = CliRunner().invoke(app, ["report", str(tmp_path / "missing.json"), "-o", str(out)])
    assert r.exit_code == 2 and "not found" in r.output and not out.exists()
    (tmp_path / "no").write_text("")  # a file where the output's folder would be made
    r = CliRunner().invoke(app, ["report", str(inputs["estimate"]), "-o",
                                 str(tmp_path / "no" / "r.html")])
    assert r.exit_code == 2 and "--output" in r.output and "no folder can be made" in r.output


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage"]


def _check_meta_blocks(page: str) -> None:
    """Every section says what its result is: a heading with the scenario's label and a meta
    block with the command line, the shoal version, the input's hash, the model and the pool."""
    sections = re.findall(r'<section id="s\d+" data-kind="([^"]+)">(.*?)</section>', page, re.S)
    assert [k for k, _ in sections] == list(FIGURES)
    for kind, body in sections:
        head = re.search(r"<h2>(.*?)</h2>", body).group(1)
        meta = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", re.search(
            r'<dl class="meta" data-meta(?:="")?>(.*?)</dl>', body, re.S).group(1)))
        assert meta["command"].startswith(f"shoal {kind.split()[0]}"), (kind, meta)
        assert "by shoal " in meta["made"] and re.search(r"sha256 [0-9a-f]{12}", meta["input"])
        assert meta["model"] and meta["pool"], (kind, meta)
        assert head.startswith(f"{kind}: ") and ".json" not in head, head


def test_report_sections_say_what_they_are(report):
    _check_meta_blocks(report.read_text())


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="needs Chromium (Debian package 'chromium')")
def test_report_in_headless_chromium(report, tmp_path):
    """Every figure loads with a non-zero size, no script error and no console error; a
    screenshot of the first screen is kept in build/test-artifacts for inspection."""
    exe = _chromium()
    base = [exe, *CHROME_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    env = dict(os.environ, HOME=str(tmp_path))
    dom = subprocess.run([*base, "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
                          "--dump-dom", report.as_uri()],
                         capture_output=True, text=True, timeout=180, env=env)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stdout[:500]
    attrs = dict(re.findall(r'data-([\w-]+)="([^"]*)"', body.group(1)))
    total = sum(FIGURES.values())
    assert attrs.get("figures") == str(total) and attrs.get("figures-ok") == str(total), attrs
    assert "errors" not in attrs, attrs
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln]
    assert not console, console
    _check_meta_blocks(dom.stdout)  # as the browser built the page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "report-first-screen.png"
    shot.unlink(missing_ok=True)
    r = subprocess.run([*base, "--window-size=1280,1000", "--hide-scrollbars",
                        f"--screenshot={shot}", report.as_uri()],
                       capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


@pytest.mark.parametrize("args", [
    ["estimate", str(EX / "het-a100-v100.yaml"), "--plan", str(EX / "het-a100-v100.plan.json")],
    ["plan", str(EX / "opt350m-two-zones.yaml"), "--budget", "5"],
    ["bubbles", str(EX / "atlas-gpt-3dc.yaml"), "--plan", str(EX / "atlas-gpt-3dc.plan.json"),
     "--rate", "10", "--duration", "5s"],
    ["catalog", "gpus"],
])
def test_every_command_is_quiet_with_quiet(args):
    loud = CliRunner().invoke(app, args)
    assert loud.exit_code == 0 and loud.output.strip()
    r = CliRunner().invoke(app, [*args, "--quiet"])
    assert r.exit_code == 0 and r.output == "", r.output


def test_quiet_still_reports_errors():
    r = CliRunner().invoke(app, ["estimate", str(EX / "het-a100-v100.yaml"), "--plan",
                                 "missing.json", "-q"])
    assert r.exit_code == 2 and "missing.json: file not found" in r.output


def test_the_memory_figure_keeps_the_fullest_workers():
    from shoal.report.figures import fullest

    workers = [{"stage": i // 10, "peak_memory_bytes": 50 + (i % 10), "capacity_bytes": 100}
               for i in range(60)]
    workers[59]["peak_memory_bytes"] = 99  # the fullest comes last
    kept = fullest(workers, 48)
    assert len(kept) == 48 and workers[59] in kept
    assert kept == sorted(kept, key=workers.index)  # in the plan's order
    assert all(w["peak_memory_bytes"] >= 52 for w in kept)  # the 12 dropped: six at 50, six at 51
    assert fullest(workers[:10], 48) == workers[:10]


def test_replay_section_shows_checkpoint_time_and_reads_older_replays(inputs, report, tmp_path):
    """The replay section's totals list the time spent writing checkpoints; a replay written
    before checkpoints stalled training (no such total) still renders, with a dash there."""
    html = report.read_text()
    sec = re.search(r'<section id="s\d+" data-kind="replay">(.*?)</section>', html, re.S)
    assert sec and "checkpoints" in sec.group(1)
    doc = json.loads(Path(inputs["replay"]).read_text())
    for r in doc["replays"]:
        del r["totals"]["checkpoint_time_s"]
    old = tmp_path / "old-replay.json"
    old.write_text(json.dumps(doc))
    out = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["report", str(old), "-o", str(out)])
    assert r.exit_code == 0, r.output
    sec = re.search(r'data-kind="replay">(.*?)</section>', out.read_text(), re.S)
    assert sec and "<td>-</td>" in sec.group(1).replace(" ", "")
