"""A self-contained HTML timeline of a trace: one row per op.

Each op's bar runs from the median over blocks of the block's first start
(ready) of the op to the median of its last compute end; the faded bar behind
it runs from the 10th percentile of the starts to the 90th of the ends. Weight
loads are drawn apart, in blue: a thin bar from the median first load issue to
the median start. Rows are in order of first start; "[k/N]" after a name says
that only k of the N blocks ran the op. Wheel zooms, drag pans, double-click
resets, hover shows the numbers. The page needs no network; its script marks
<html data-gvm-rendered="ROWS"> once it has drawn, or data-gvm-error on a
script error (tests read both).
"""
from __future__ import annotations

import html as _html
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .format import Trace
from .timeline import DONE, LOAD, READY, Timeline, build, members, op_order


@dataclass(frozen=True)
class Row:
    name: str
    count: int  # instructions
    blocks: int  # blocks that ran the op
    start: float  # ns, median over blocks of the block's first ready
    end: float  # ns, median over blocks of the block's last done
    start_p10: float
    end_p90: float
    load: float | None  # ns, median over loading blocks of the first load issue
    run_median: float  # ns, median ready -> done of one instruction
    bytes: int


def rows(tl: Timeline) -> list[Row]:
    groups = members(tl)
    out = []
    for name in op_order(tl):
        idx = groups[name]
        blk = tl.block[idx]
        starts, ends, loads = [], [], []
        for b in np.unique(blk):
            mine = idx[blk == b]
            starts.append(tl.t[mine, READY].min())
            ends.append(tl.t[mine, DONE].max())
            loaded = mine[tl.has_load[mine]]
            if len(loaded):
                loads.append(tl.t[loaded, LOAD].min())
        out.append(
            Row(
                name=name,
                count=len(idx),
                blocks=len(starts),
                start=float(np.median(starts)),
                end=float(np.median(ends)),
                start_p10=float(np.percentile(starts, 10)),
                end_p90=float(np.percentile(ends, 90)),
                load=float(np.median(loads)) if loads else None,
                run_median=float(np.median(tl.t[idx, DONE] - tl.t[idx, READY])),
                bytes=int((tl.trace.weight_bytes[idx] + tl.trace.act_bytes[idx]).sum()),
            )
        )
    return out


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<title>__TITLE__</title>
<style>
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 16px; margin: 0 0 4px; }
#info { color: #555; margin-bottom: 8px; }
#chart { border: 1px solid #ddd; cursor: grab; user-select: none; display: block; }
#chart.dragging { cursor: grabbing; }
.label { font: 12px ui-monospace, monospace; fill: #222; }
.tick { font: 11px system-ui, sans-serif; fill: #666; }
.grid { stroke: #eee; }
.bar { fill: #e07a2f; }
.faded { fill: #e07a2f; opacity: 0.25; }
.load { fill: #2f6fe0; }
.loadmark { stroke: #2f6fe0; stroke-width: 2; }
.rowbg { fill: #f7f7f7; }
#tip { position: fixed; pointer-events: none; background: #fff; border: 1px solid #999; padding: 6px 8px;
       font: 12px ui-monospace, monospace; white-space: pre; display: none; box-shadow: 0 2px 6px rgba(0,0,0,.2); }
#legend span { display: inline-block; width: 12px; height: 10px; margin: 0 4px 0 12px; vertical-align: middle; }
</style></head>
<body>
<h1>__TITLE__</h1>
<div id="info">__INFO__</div>
<div id="legend"><span style="background:#e07a2f"></span>median first start to median last end over blocks
<span style="background:#e07a2f;opacity:.25"></span>10th to 90th percentile
<span style="background:#2f6fe0"></span>weight loads issued (median)
&nbsp; wheel: zoom, drag: pan, double-click: reset</div>
<svg id="chart" xmlns="http://www.w3.org/2000/svg"></svg>
<div id="tip"></div>
<script>
"use strict";
window.addEventListener("error", function (e) {
  document.documentElement.setAttribute("data-gvm-error", String(e.message));
});
(function () {
  var DATA = __DATA__;
  var rows = DATA.rows, NS = "http://www.w3.org/2000/svg";
  var LABEL_W = 260, ROW_H = 18, AXIS_H = 26, PAD_R = 16;
  var svg = document.getElementById("chart"), tip = document.getElementById("tip");
  var width = Math.max(600, document.body.clientWidth - 4);
  var height = AXIS_H + rows.length * ROW_H + 8;
  svg.setAttribute("width", width); svg.setAttribute("height", height);
  var full = [0, Math.max(DATA.span, 1) * 1.02];
  var view = full.slice();
  function x(ns) { return LABEL_W + (ns - view[0]) / (view[1] - view[0]) * (width - LABEL_W - PAD_R); }
  function ns(px) { return view[0] + (px - LABEL_W) / (width - LABEL_W - PAD_R) * (view[1] - view[0]); }
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    (parent || svg).appendChild(e);
    return e;
  }
  function us(v) { return (v / 1000).toFixed(3) + " us"; }
  function label(r) { return r.name + (r.blocks < DATA.blocks ? " [" + r.blocks + "/" + DATA.blocks + "]" : ""); }
  function niceStep(span) {
    var raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
  }
  function render() {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var defs = el("defs", {}), clip = el("clipPath", {id: "plot"}, defs);
    el("rect", {x: LABEL_W, y: 0, width: width - LABEL_W - PAD_R, height: height}, clip);
    var bg = el("g", {});
    rows.forEach(function (r, i) {
      if (i % 2) el("rect", {x: 0, y: AXIS_H + i * ROW_H, width: width, height: ROW_H, "class": "rowbg"}, bg);
    });
    var step = niceStep(view[1] - view[0]);
    for (var t = Math.ceil(view[0] / step) * step; t <= view[1]; t += step) {
      el("line", {x1: x(t), x2: x(t), y1: AXIS_H - 4, y2: height, "class": "grid"});
      el("text", {x: x(t), y: AXIS_H - 8, "text-anchor": "middle", "class": "tick"}).textContent = (t / 1000).toFixed(step < 1000 ? 2 : 1) + " us";
    }
    var plot = el("g", {"clip-path": "url(#plot)"});
    rows.forEach(function (r, i) {
      var y = AXIS_H + i * ROW_H;
      el("text", {x: 4, y: y + ROW_H - 5, "class": "label"}).textContent = label(r);
      el("rect", {x: x(r.start_p10), y: y + 3, width: Math.max(1, x(r.end_p90) - x(r.start_p10)), height: ROW_H - 6, "class": "faded"}, plot);
      el("rect", {x: x(r.start), y: y + 3, width: Math.max(1, x(r.end) - x(r.start)), height: ROW_H - 6, "class": "bar", "data-row": i}, plot);
      if (r.load !== null) {
        if (r.load < r.start) el("rect", {x: x(r.load), y: y + ROW_H - 6, width: Math.max(1, x(r.start) - x(r.load)), height: 3, "class": "load"}, plot);
        el("line", {x1: x(r.load), x2: x(r.load), y1: y + 2, y2: y + ROW_H - 2, "class": "loadmark"}, plot);
      }
    });
  }
  function describe(r) {
    var lines = [r.name,
      "instructions   " + r.count + " on " + r.blocks + "/" + DATA.blocks + " blocks",
      "median start   " + us(r.start), "median end     " + us(r.end),
      "median span    " + us(r.end - r.start),
      "p10 start      " + us(r.start_p10), "p90 end        " + us(r.end_p90),
      "run / instr    " + us(r.run_median) + " (median)"];
    if (r.load !== null) lines.push("loads issued   " + us(r.load) + " (median first)");
    lines.push("bytes          " + (r.bytes / 1e6).toFixed(3) + " MB");
    if (r.bytes > 0 && r.end > r.start) lines.push("bandwidth      " + (r.bytes / (r.end - r.start)).toFixed(1) + " GB/s over the median span");
    return lines.join("\\n");
  }
  svg.addEventListener("wheel", function (e) {
    e.preventDefault();
    var px = e.clientX - svg.getBoundingClientRect().left, at = ns(Math.max(px, LABEL_W));
    var f = Math.exp(e.deltaY * 0.0015);
    var w = Math.min(full[1] - full[0], Math.max(10, (view[1] - view[0]) * f));
    view = [at - (at - view[0]) * w / (view[1] - view[0]), 0];
    view[1] = view[0] + w;
    render();
  }, {passive: false});
  var drag = null;
  svg.addEventListener("mousedown", function (e) { drag = {x: e.clientX, view: view.slice()}; svg.classList.add("dragging"); });
  window.addEventListener("mouseup", function () { drag = null; svg.classList.remove("dragging"); });
  svg.addEventListener("dblclick", function () { view = full.slice(); render(); });
  svg.addEventListener("mousemove", function (e) {
    var box = svg.getBoundingClientRect();
    if (drag) {
      var d = (e.clientX - drag.x) / (width - LABEL_W - PAD_R) * (drag.view[1] - drag.view[0]);
      view = [drag.view[0] - d, drag.view[1] - d];
      render();
    }
    var i = Math.floor((e.clientY - box.top - AXIS_H) / ROW_H);
    if (i >= 0 && i < rows.length) {
      tip.textContent = describe(rows[i]);
      tip.style.display = "block";
      tip.style.left = Math.min(e.clientX + 14, window.innerWidth - 360) + "px";
      tip.style.top = (e.clientY + 14) + "px";
    } else tip.style.display = "none";
  });
  svg.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  window.gvmTimeline = {view: function () { return view.slice(); }, render: render};
  render();
  document.documentElement.setAttribute("data-gvm-rendered", String(rows.length));
})();
</script>
</body></html>
"""


def timeline_html(trace: Trace, title: str | None = None) -> str:
    """The HTML page of a trace's op timeline."""
    tl = build(trace)
    meta = trace.meta
    title = title or f"gpuvm timeline: {meta.get('source', 'unknown')} trace" + (f", {meta['device']}" if "device" in meta else "")
    n_blocks = len(np.unique(tl.block[tl.ran]))
    info = f"{int(tl.ran.sum())} instructions on {n_blocks} blocks, span {tl.span / 1000:.3f} us; times: {tl.clock}"
    data = {"rows": [asdict(r) for r in rows(tl)], "blocks": n_blocks, "span": tl.span}
    payload = json.dumps(data, allow_nan=False).replace("<", "\\u003c")
    fill = {"TITLE": _html.escape(title), "INFO": _html.escape(info), "DATA": payload}
    return re.sub(r"__(TITLE|INFO|DATA)__", lambda m: fill[m.group(1)], _PAGE)


def write_html(trace: Trace, path: str | Path, title: str | None = None) -> None:
    Path(path).write_text(timeline_html(trace, title), encoding="utf-8")
