"""The reports opened in a real browser (Debian's headless ``chromium``, driven by selenium
through ``chromedriver``): a replay's ``report.html`` and a ``simulate --compare``'s
``compare.html`` draw with no console error, no legend, title or button box overlaps another,
every axis title carries a unit, decisions sit on the charts labelled with kind and target,
zooming one time chart zooms the others, and the comparison says who won. A screenshot of each
page is saved (under the test's tmp_path) for a person to look at.

``scripts/test.sh`` installs ``chromium`` and ``chromium-driver``; without them these tests fail
saying so (as the Prometheus tests do), rather than passing unseen.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from replay_builders import chat_events, one_node_cluster, policy, write_recording
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

from controller.cli.simulate_command import simulate
from controller.offline.accounting.report import TIMEOUT_MS, write_outputs
from controller.offline.replay.replayer import replay

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "scenario-small.yaml"
BALANCED = ROOT / "policies" / "library" / "balanced.yaml"
#: A unit in an axis title: "(ms)", "(%)", "(UTC)", "(GPU-h)", "(per 10 s)"...
UNIT = re.compile(r"\(.+\)")

# Every text box of each plot that must not overlap another: the legend, the axis-scale
# buttons, the axis titles, the in-plot title, the annotations (decision labels and panel
# names) and the tick labels, as [kind, text, left, top, right, bottom] in page pixels.
_BOXES = """
const out = [];
for (const plot of document.querySelectorAll(".js-plotly-plot")) {
  const boxes = [];
  const add = (kind, el) => {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.height > 0)
      boxes.push([kind, el.textContent, r.left, r.top, r.right, r.bottom]);
  };
  plot.querySelectorAll(".legend .bg").forEach(el => add("legend", el));
  plot.querySelectorAll(".updatemenu-container").forEach(el => add("buttons", el));
  plot.querySelectorAll(".xtitle, .ytitle").forEach(el => add("axis", el));
  plot.querySelectorAll(".gtitle").forEach(el => add("title", el));
  plot.querySelectorAll(".annotation-text-g").forEach(el => add("annotation", el));
  plot.querySelectorAll(".xtick text").forEach(el => add("xtick", el));
  plot.querySelectorAll(".ytick text").forEach(el => add("ytick", el));
  out.push([plot.id, boxes]);
}
return out;
"""


#: Pixels two boxes may share: a glyph box is taller than its ink (plotly sets the "0" of a y
#: axis against the first x tick label's box, which no one reads as overlapping).
SLACK = 3


def _overlaps(a: list[Any], b: list[Any]) -> bool:
    left, right = max(a[2], b[2]), min(a[4], b[4])
    top, bottom = max(a[3], b[3]), min(a[5], b[5])
    return bool(right - left > SLACK and bottom - top > SLACK)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail(
            "chromium or chromedriver is not installed: "
            "apt-get install -y --no-install-recommends chromium chromium-driver"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tmp_path_factory.mktemp("chromium-profile")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    try:
        yield chrome
    finally:
        chrome.quit()


def _open(chrome: webdriver.Chrome, page: Path, shot: Path) -> list[Any]:
    """Load ``page``, wait until every figure is drawn, fail on a console message of level
    SEVERE (errors and uncaught exceptions), save a full-height screenshot, and return each
    plot's text boxes."""
    chrome.get_log("browser")  # drop what an earlier page left
    chrome.get(page.as_uri())
    WebDriverWait(chrome, 60).until(
        lambda d: d.execute_script("return document.body.dataset.plotted === '1'")
    )
    errors = [e for e in chrome.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], f"console errors on {page.name}: {errors}"
    height = int(chrome.execute_script("return document.documentElement.scrollHeight"))
    chrome.set_window_size(1400, min(height + 100, 16000))
    chrome.save_screenshot(str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG")
    chrome.set_window_size(1400, 1000)
    boxes: list[Any] = chrome.execute_script(_BOXES)
    return boxes


def _check_layout(plots: list[Any]) -> None:
    """No two text boxes of a plot overlap (boxes of one kind may touch each other: decision
    labels are many and placed by time, tick labels are plotly's to space); every axis title
    has a unit."""
    assert plots
    for plot_id, boxes in plots:
        for i, a in enumerate(boxes):
            if a[0] == "axis":
                assert UNIT.search(a[1]), f"{plot_id}: axis title {a[1]!r} has no unit"
            for b in boxes[i + 1 :]:
                if a[0] == b[0] != "axis":
                    continue
                assert not _overlaps(a, b), f"{plot_id}: {a[0]} {a[1]!r} overlaps {b[0]} {b[1]!r}"


def _x_ranges(chrome: webdriver.Chrome) -> dict[str, list[Any]]:
    ranges: dict[str, list[Any]] = chrome.execute_script(
        "const r = {};"
        "for (const p of document.querySelectorAll('.js-plotly-plot'))"
        "  if (p.layout.xaxis.type === 'date') r[p.id] = p.layout.xaxis.range;"
        "return r;"
    )
    return ranges


def test_replay_report_in_a_real_browser(browser: webdriver.Chrome, tmp_path: Path) -> None:
    """A replay whose latency reaches the 30 s timeout: no console error, nothing overlaps,
    units everywhere; the scale decision is a marker labelled with its kind and target on the
    latency and the GPU charts; the timeout cap is in the legend; zooming the latency chart
    zooms every time chart to the same range."""
    events = chat_events(300, burst=(100, 130), high_ms=TIMEOUT_MS)
    path = write_recording(tmp_path / "r.jsonl", events)
    result = replay(path, policy=policy(), cluster=one_node_cluster, out_dir=tmp_path / "out")
    _, report = write_outputs(result, tmp_path / "out")
    plots = _open(browser, report, tmp_path / "report.png")
    _check_layout(plots)
    texts = {plot_id: [b[1] for b in boxes] for plot_id, boxes in plots}
    assert "scale serving/chat" in texts["latency-0"]
    assert "scale serving/chat" in texts["gpus-by-use-whole"]
    legend = browser.execute_script(
        "return document.querySelector('#latency-0 .legend').textContent"
    )
    assert "timeout cap 30 s" in legend

    before = _x_ranges(browser)
    assert len(before) >= 4
    assert len({tuple(r) for r in before.values()}) == 1
    browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const gd = document.getElementById('latency-0');"
        "const [a, b] = gd.layout.xaxis.range.map(v => new Date(v).getTime());"
        "const q = (b - a) / 4;"
        "Plotly.relayout(gd, {'xaxis.range[0]': a + q, 'xaxis.range[1]': b - q})"
        "  .then(() => setTimeout(done, 0));"
    )
    after = _x_ranges(browser)
    assert after["latency-0"] != before["latency-0"]
    assert len({tuple(r) for r in after.values()}) == 1, after  # every chart followed


def test_compare_page_in_a_real_browser(browser: webdriver.Chrome, tmp_path: Path) -> None:
    """simulate --compare's page: no console error, nothing overlaps, units everywhere, a
    verdict line naming a run, and a last table row giving each ranked column's best value
    with its direction."""
    out = tmp_path / "out"
    args = [str(SCENARIO), "--policy", str(BALANCED), "--duration", "30m"]
    args += ["--burst", "10m:5m:6", "--seed", "1", "--out", str(out), "--compare"]
    result = CliRunner().invoke(simulate, args)
    assert result.exit_code == 0, result.output
    plots = _open(browser, out / "compare.html", tmp_path / "compare.png")
    _check_layout(plots)
    verdict = browser.execute_script("return document.querySelector('.verdict').textContent")
    assert verdict.startswith("Verdict among the fair runs (oracle and strawman aside): best in")
    assert re.search(r"#\d+ \w", verdict)
    last = browser.execute_script(
        "const rows = document.querySelectorAll('table tbody tr');"
        "return rows[rows.length - 1].textContent"
    )
    assert last.startswith("best")
    assert "↑ higher is better" in last
    assert "↓ lower is better" in last


def test_the_console_check_catches_an_error(browser: webdriver.Chrome, tmp_path: Path) -> None:
    """The check the two tests above rely on: a page that logs a console error, or throws,
    fails it."""
    for script in ('console.error("drawn wrong")', 'throw new Error("drawn wrong")'):
        page = tmp_path / "broken.html"
        page.write_text(
            "<!DOCTYPE html><html><body><script>document.body.dataset.plotted = '1';"
            f"{script};</script></body></html>"
        )
        with pytest.raises(AssertionError, match="drawn wrong"):
            _open(browser, page, tmp_path / "broken.png")
