"""The report's HTML as a person opens it: headless Chromium (Debian's package) renders the table
and the charts; the screenshot is kept next to the test's files.

Chromium is installed by .ci/run when missing, so in CI this test runs rather than skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
from matplotlib import image

from stagewise.eval.pipeline_report import pipeline_report
from tests.eval.test_pipeline_report import CURVES, GATES, ROWS, SIGNALS


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    return found


def _rows_with(mask: np.ndarray) -> np.ndarray:
    """Indices of the screenshot's pixel rows where `mask` holds somewhere."""
    return np.flatnonzero(mask.any(axis=1))


def test_the_html_report_renders_its_table_and_charts_in_chromium(tmp_path):
    _png, html = pipeline_report(ROWS, CURVES, GATES, tmp_path, SIGNALS)
    check_in_chromium(html, tmp_path / "screenshot.png")
    html_text = html.read_text()
    for row in ROWS:
        assert f">{row['stage']}<" in html_text
    for panel in SIGNALS:  # the page says which training panels the chart holds
        assert f"<li>{panel.stage}: {panel.title} (" in html_text


def check_in_chromium(html, shot) -> None:
    """Screenshot `html` with headless Chromium into `shot`; assert it shows text above charts."""
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={shot.parent / 'chromium-profile'}", "--window-size=1280,2400", f"--screenshot={shot}",
           html.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), proc.stderr[-2000:]
    pixels = image.imread(shot)
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1200
    rgb = pixels[..., :3].astype(float)
    ink = np.abs(rgb - rgb[0, 0]).sum(axis=-1) > 0.1  # anything but the page background
    blue = (rgb[..., 2] > rgb[..., 0] + 0.15) & (rgb[..., 2] > rgb[..., 1] + 0.05)  # the charts' bars and curves
    assert ink.sum() > 10_000, "the page rendered blank"
    assert blue.sum() > 5_000, "no chart on the page"
    above_chart = _rows_with(ink)[_rows_with(ink) < _rows_with(blue)[0]]
    assert above_chart.size > 100, "nothing above the charts: the table is missing"
