"""The quickstart's commands, run exactly as docs/quickstart.md writes them, from a folder that
holds the bundled examples: each exits 0 and leaves the files the page promises."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "quickstart.md"


def blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_install_step_is_the_readme_one():
    """The install line is the README's first command's; the suite runs in that environment
    already, so it is compared, not run again."""
    install = blocks()[0].strip()
    readme = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)[0]
    assert readme.strip().startswith(install + " && shoal ")


def test_quickstart_commands_run_as_written(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    commands = [ln for b in blocks()[1:] for ln in b.strip().splitlines()]
    assert len(commands) >= 7
    for cmd in commands:
        r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
    for name in ("plan.json", "front.png", "timeline.png", "replay.png", "placement.json",
                 "placement.png", "plan-result.json", "estimate.json", "report.html"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert "<img" in (tmp_path / "report.html").read_text()
