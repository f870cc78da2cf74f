"""The HTML timeline in headless Chromium: it renders every row, its script
runs without a console error, wheel zooms, drag pans, hover shows the numbers.

Needs a chromium binary (tools/ci_install_chromium.sh installs Debian's)."""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from gpuvm.trace.html import rows, timeline_html
from gpuvm.trace.timeline import build

from trace_synth import make_trace

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")) if p), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH; tools/ci_install_chromium.sh installs it")

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--window-size=1200,700",
]

# Put first in <head>: collects console.error calls and uncaught errors.
WATCH = """<script>
window.__errors = [];
var __ce = console.error;
console.error = function () { window.__errors.push(Array.prototype.join.call(arguments, " ")); __ce.apply(console, arguments); };
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
</script>"""

# Put last in <body>: zoom, pan and hover through real DOM events, then
# write what happened into <pre id="probe">.
PROBE = """<script>
(function () {
  var out = {errors: window.__errors};
  try {
    var svg = document.getElementById("chart"), box = svg.getBoundingClientRect();
    var v0 = window.gvmTimeline.view();
    svg.dispatchEvent(new WheelEvent("wheel", {deltaY: -400, clientX: box.left + 700, clientY: box.top + 40, bubbles: true, cancelable: true}));
    var v1 = window.gvmTimeline.view();
    svg.dispatchEvent(new MouseEvent("mousedown", {clientX: box.left + 700, clientY: box.top + 40, bubbles: true}));
    svg.dispatchEvent(new MouseEvent("mousemove", {clientX: box.left + 600, clientY: box.top + 40, bubbles: true}));
    window.dispatchEvent(new MouseEvent("mouseup", {clientX: box.left + 600, clientY: box.top + 40, bubbles: true}));
    var v2 = window.gvmTimeline.view();
    svg.dispatchEvent(new MouseEvent("mousemove", {clientX: box.left + 500, clientY: box.top + 26 + 18 * 1 + 9, bubbles: true}));
    var tip = document.getElementById("tip");
    var bars = Array.prototype.map.call(document.querySelectorAll("rect.bar"), function (r) {
      var b = r.getBoundingClientRect();
      return {row: Number(r.getAttribute("data-row")), x: b.left - box.left, w: b.width, fill: getComputedStyle(r).fill};
    });
    svg.dispatchEvent(new MouseEvent("dblclick", {bubbles: true}));
    out.views = [v0, v1, v2, window.gvmTimeline.view()];
    out.tip = {display: tip.style.display, text: tip.textContent};
    out.bars = bars;
    out.width = box.width;
  } catch (e) { out.errors.push("probe: " + e.message); }
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def chromium(tmp: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.iterdir()))}"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
        capture_output=True,
        text=True,
        timeout=90,
    )


def instrumented(page: str) -> str:
    page = page.replace("<head>", "<head>" + WATCH, 1)
    i = page.rindex("</body>")
    return page[:i] + PROBE + page[i:]


def render(tmp: Path, page: str) -> tuple[str, dict, list[str]]:
    """Run the instrumented page; returns its DOM, the probe's findings and
    the console lines that report an error."""
    path = tmp / "page.html"
    path.write_text(instrumented(page))
    r = chromium(tmp, path, "--dump-dom")
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r'<pre id="probe">(.*?)</pre>', r.stdout, re.S)
    assert m, "the probe did not run: " + r.stdout[-500:]
    probe = json.loads(m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&"))
    console = [l for l in r.stderr.splitlines() if "CONSOLE" in l and re.search(r"Uncaught|Error|Refused", l)]
    return r.stdout, probe, console


def assert_clean(dom: str, probe: dict, console: list[str]) -> int:
    """No script error anywhere; returns the number of rows the page says it drew."""
    err = re.search(r'<html[^>]* data-gvm-error="([^"]*)"', dom)
    assert err is None, err.group(1)
    assert probe["errors"] == [], probe["errors"]
    assert console == [], console
    m = re.search(r'<html[^>]* data-gvm-rendered="(\d+)"', dom)
    assert m, "the page's script did not finish"
    return int(m.group(1))


@pytest.fixture(scope="module")
def trace():
    t, _ = make_trace(41, n=70, blocks=6, groups=2, source="gpu", clock_hz=1.98e9)
    return t


def test_timeline_renders_and_responds(trace, tmp_path):
    want = rows(build(trace))
    dom, probe, console = render(tmp_path, timeline_html(trace))
    assert assert_clean(dom, probe, console) == len(want)

    bars = probe["bars"]
    assert sorted(b["row"] for b in bars) == list(range(len(want)))
    assert all(b["w"] >= 1 and b["fill"] == "rgb(224, 122, 47)" for b in bars)
    # bars left to right as their median starts
    xs = [b["x"] for b in sorted(bars, key=lambda b: b["row"])]
    starts = [r.start for r in want]
    assert [i for i, _ in sorted(enumerate(xs), key=lambda p: p[1])] == [i for i, _ in sorted(enumerate(starts), key=lambda p: p[1])]
    # labels carry [k/N] for ops that ran on only some blocks
    partial = [r for r in want if r.blocks < 6]
    assert partial
    for r in partial:
        assert f"{r.name} [{r.blocks}/6]" in dom

    v0, v1, v2, v3 = probe["views"]
    assert v1[1] - v1[0] < 0.8 * (v0[1] - v0[0]), "wheel did not zoom in"
    assert v2[1] - v2[0] == pytest.approx(v1[1] - v1[0]) and v2[0] > v1[0], "drag did not pan"
    assert v3 == v0, "double-click did not reset"
    assert probe["tip"]["display"] == "block"
    assert probe["tip"]["text"].startswith(want[1].name + "\n")
    assert f"on {want[1].blocks}/6 blocks" in probe["tip"]["text"]


def test_a_script_error_is_caught(trace, tmp_path):
    # the checks above must fail on a page whose script breaks
    page = timeline_html(trace).replace("  render();\n  document.documentElement", "  render(undefinedThing.x);\n  document.documentElement", 1)
    dom, probe, console = render(tmp_path, page)
    with pytest.raises(AssertionError):
        assert_clean(dom, probe, console)
    assert re.search(r'<html[^>]* data-gvm-error="[^"]*undefinedThing', dom) and console


def test_screenshot(trace, tmp_path):
    path = tmp_path / "timeline.html"
    path.write_text(timeline_html(trace))
    shot = tmp_path / "timeline.png"
    r = chromium(tmp_path, path, f"--screenshot={shot}")
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", png[16:24])
    assert (w, h) == (1200, 700)
    assert len(png) > 10_000  # bars, labels and axis, not a blank page
