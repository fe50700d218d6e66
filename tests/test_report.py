"""The report page `--report DIR` writes, opened in a real headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.summary import usd

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: matplotlib's default colours: the throughput and duration plots (blue) and the
#: workers' timeline (green, red for a task with failed units). Only the plots
#: draw them, so finding them in a screenshot says the embedded images rendered.
BLUE, GREEN, RED = (31, 119, 180), (44, 160, 44), (214, 39, 40)


def chromium_binary() -> str:
    """Debian's chromium, installed with apt-get when missing (as root, as CI runs)."""
    path = shutil.which("chromium")
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env,
                       capture_output=True, timeout=1200)  # fmt: skip
        path = shutil.which("chromium")
    if path is None:
        raise RuntimeError(
            "chromium is not installed; the report page test needs it: "
            "apt-get install -y chromium (scripts/test.sh installs it)"
        )
    return path


def render(page: Path, tmp: Path) -> tuple[Path, list[str]]:
    """A screenshot of ``page`` and the console messages it logged."""
    shot = tmp / f"{page.stem}.png"
    proc = subprocess.run(
        [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--no-first-run",
         f"--user-data-dir={tmp / ('profile-' + page.stem)}", "--enable-logging=stderr",
         "--v=0", "--hide-scrollbars", "--window-size=1100,4200", f"--screenshot={shot}",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert shot.exists(), proc.stderr[-3000:]
    # Chromium logs every console message (log, warning, error) as CONSOLE; the page
    # has no script, so any at all is a fault.
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return shot, console


def colour_pixels(shot: Path, rgb: tuple[int, int, int]) -> int:
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    return int((np.abs(img - np.array(rgb)).sum(axis=2) < 40).sum())


def blank(shot: Path) -> bool:
    import numpy as np
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("L"))
    return bool((img < 250).mean() < 0.01)


def test_the_report_page_is_self_contained_and_its_plots_render(tmp_path):
    (tmp_path / "mine.py").write_text(
        "import time\n\ndef slow(x):\n    time.sleep(0.003)\n"
        "    if x in (7, 150):\n        raise ValueError(f'x = {x} is refused')\n"
        "    return {'y': 2 * x}\n"
    )
    job = tmp_path / "grid.toml"
    job.write_text(f'workload = "map"\nfunction = "mine:slow"\n[grid]\nx = {list(range(400))}\n')
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", str(job), "--output", str(tmp_path / "out"),
         "--workers", "2", "--report", str(report), "--instance-type", "c5.4xlarge"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr  # 2 failed units: not a success
    assert "cost: $" in proc.stdout and "c5.4xlarge (instance_type): $0.68/h" in proc.stdout, (
        proc.stdout
    )
    summary = json.loads((report / "grid-summary.json").read_text())
    assert summary["cost_usd"] > 0 and summary["task_timings"]
    assert sum(t["failed"] for t in summary["task_timings"]) == 2
    assert (report / "grid-dask-report.html").exists()
    page = report / "grid-report.html"
    text = page.read_text()

    # Self-contained: every src and href is inline data; no script, no stylesheet link.
    refs = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', text)
    assert refs and all(r.startswith("data:image/png;base64,") for r in refs), refs[:3]
    assert "<script" not in text and "<link" not in text
    for heading in ("Summary", "Cost", "Throughput over time", "Task durations",
                    "Workers' busy timeline", "Failures", "Plan"):  # fmt: skip
        assert f"<h2>{heading}</h2>" in text, heading
    assert "x = 7 is refused" in text and "x = 150 is refused" in text
    assert usd(summary["cost_usd"]) in text
    probes = ", ".join(map(str, summary["plan"]["probe_sizes"]))
    assert f"sizes {probes}" in text

    shot, console = render(page, tmp_path)
    assert console == []
    assert not blank(shot)
    assert colour_pixels(shot, BLUE) > 2000  # throughput and durations
    assert colour_pixels(shot, GREEN) > 500  # the workers' timeline
    assert colour_pixels(shot, RED) > 50  # its tasks with a failed unit

    # The checks can fail: the same page without its images, and with a console error.
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r'src="data:[^"]*"', 'src=""', text))
    bare_shot, _ = render(bare, tmp_path)
    for colour in (BLUE, GREEN, RED):
        assert colour_pixels(bare_shot, colour) < 50
    noisy = tmp_path / "noisy.html"
    noisy.write_text(text.replace("</body>", "<script>console.error('broken')</script></body>"))
    assert any("broken" in line for line in render(noisy, tmp_path)[1])
    empty = tmp_path / "empty.html"
    empty.write_text("<!DOCTYPE html><html><body></body></html>")
    assert blank(render(empty, tmp_path)[0])
