// Time-series charts drawn as plain SVG: no library, nothing fetched, so the dashboard works
// offline. drawChart(svg, series, options) redraws one chart from [t, value] points.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const PAD = { right: 8, top: 8, bottom: 20 };  // the left one fits the longest y label

function svgEl(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
  if (text !== undefined) el.textContent = text;
  return el;
}

// A round upper bound for the axis: 1, 2, 2.5 or 5 times a power of ten.
function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(value)));
  for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

// Runs of consecutive points, split where a value is missing or samples stop for a while.
function runs(points, maxGap) {
  const out = [];
  let current = [];
  let lastT = null;
  for (const [t, v] of points) {
    if (v == null || (lastT !== null && t - lastT > maxGap)) {
      if (current.length) out.push(current);
      current = [];
    }
    if (v != null) current.push([t, v]);
    lastT = t;
  }
  if (current.length) out.push(current);
  return out;
}

function minutesLabel(seconds) {
  if (seconds <= 0) return "now";
  return seconds < 60 ? `−${Math.round(seconds)} s` : `−${Math.round(seconds / 60)} min`;
}

// series: [{name, color, points: [[t, v], ...], fill, dots}]
// options: {t0, t1, format(v) -> label, min (the axis goes at least this high), integer, gap (s)}
function drawChart(svg, series, options) {
  const width = Math.max(svg.clientWidth || 320, 160);
  const height = Math.max(svg.clientHeight || 130, 80);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren();
  const { t0, t1 } = options;
  const values = series.flatMap((s) => s.points.filter(([t, v]) => t >= t0 && v != null).map(([, v]) => v));
  let top = niceMax(Math.max(options.min || 0, ...values));
  if (options.integer && top % 2) top += 1;  // counts: the middle label stays a whole number
  const labels = [0, 2, 4].map((i) => options.format((top * i) / 4));
  const left = 12 + 6 * Math.max(...labels.map((l) => l.length));
  const plotW = width - left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const x = (t) => left + ((t - t0) / Math.max(t1 - t0, 1)) * plotW;
  const y = (v) => PAD.top + plotH - (Math.min(v, top) / top) * plotH;

  for (let i = 0; i <= 4; i++) {
    const gy = y((top * i) / 4);
    svg.appendChild(svgEl("line", { x1: left, x2: width - PAD.right, y1: gy, y2: gy, class: i ? "grid" : "axis" }));
    if (i % 2 === 0) {
      svg.appendChild(svgEl("text", { x: left - 6, y: gy + 3.5, class: "ylabel", "text-anchor": "end" }, labels[i / 2]));
    }
  }
  const span = t1 - t0;
  for (const fraction of [0, 0.5, 1]) {
    const anchor = fraction === 0 ? "start" : fraction === 1 ? "end" : "middle";
    svg.appendChild(svgEl("text", { x: left + fraction * plotW, y: height - 5, class: "xlabel", "text-anchor": anchor },
      minutesLabel(span * (1 - fraction))));
  }

  for (const s of series) {
    const visible = s.points.filter(([t]) => t >= t0 - (options.gap || 3));
    if (s.dots) {  // a scatter: one dot a sample (TTFT comes only where requests started)
      for (const [t, v] of visible) {
        if (v == null) continue;
        svg.appendChild(svgEl("circle", { cx: x(Math.max(t, t0)).toFixed(1), cy: y(v).toFixed(1), r: 3, fill: s.color,
          class: "dot", "data-series": s.name }));
      }
      continue;
    }
    for (const run of runs(visible, options.gap || 3)) {
      const coords = run.map(([t, v]) => `${x(Math.max(t, t0)).toFixed(1)},${y(v).toFixed(1)}`);
      if (run.length === 1) {
        const [cx, cy] = coords[0].split(",");
        svg.appendChild(svgEl("circle", { cx, cy, r: 2.5, fill: s.color, class: "dot" }));
        continue;
      }
      if (s.fill) {
        const base = y(0).toFixed(1);
        const first = coords[0].split(",")[0];
        const last = coords[coords.length - 1].split(",")[0];
        svg.appendChild(svgEl("polygon", { points: `${first},${base} ${coords.join(" ")} ${last},${base}`,
          fill: s.color, class: "area" }));
      }
      svg.appendChild(svgEl("polyline", { points: coords.join(" "), stroke: s.color, class: "line",
        "data-series": s.name }));
    }
  }
}

window.drawChart = drawChart;
