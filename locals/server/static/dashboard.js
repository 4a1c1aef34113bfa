// The dashboard: polls the server once a second and draws its figures, charts (charts.js),
// the conversations per client, a `locals run` team's progress and the last requests.
"use strict";

const $ = (id) => document.getElementById(id);
const bytes = (n) => n >= 1 << 30 ? (n / (1 << 30)).toFixed(2) + " GB" : (n / (1 << 20)).toFixed(0) + " MB";
const secs = (s) => s == null ? "–" : s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(2) + " s";
const dur = (s) => s < 90 ? s.toFixed(0) + " s" : s < 5400 ? (s / 60).toFixed(0) + " min" : (s / 3600).toFixed(1) + " h";
const count = (n) => n >= 1e6 ? (n / 1e6).toFixed(1) + "M" : n >= 1e4 ? (n / 1e3).toFixed(1) + "k" : String(n);
const pct = (r) => r == null ? "–" : (100 * r).toFixed(0) + " %";
const ago = (s) => s < 2 ? "now" : dur(s) + " ago";

// el("td", {class: "num"}, "text", child, ...): a DOM element; text stays text (never parsed as HTML).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null && value !== false) node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const view = { samples: [], lastT: 0, pid: null, windowS: 300, now: Date.now() / 1000, patchOpen: new Map() };

function showStatus(s) {
  $("model").textContent = s.model;
  $("status").textContent = s.status;
  $("status").className = "pill" + (s.status === "ready" ? "" : s.status === "failed" ? " fail" : " bad");
  $("uptime").textContent = dur(s.uptime_s);
  $("memory").textContent = bytes(s.memory_rss_bytes);
  if (!s.engine) return blank();  // loading (maybe a new server): no old figures
  const e = s.engine;
  $("requests-total").textContent = s.requests.total;
  $("running").textContent = e.running + e.prefilling;  // in the batch, as the chart counts them
  $("waiting").textContent = e.waiting;
  $("decode-tps").textContent = e.decode_tokens_per_s.toFixed(1);
  $("prefill-tps").textContent = e.prefill_tokens_per_s.toFixed(0);
  $("ttft").textContent = secs(e.last_ttft_s || null);
  $("cached").textContent = count(e.cached_tokens_total);
  $("cached-share").textContent = e.prompt_tokens_total
    ? `${pct(e.cached_tokens_total / e.prompt_tokens_total)} of ${count(e.prompt_tokens_total)}` : "";
  $("generated").textContent = count(e.generated_tokens_total + ((e.extra || {}).generating_tokens || 0));
  $("kv").textContent = e.kv_budget_bytes ? bytes(e.kv_bytes) + " / " + bytes(e.kv_budget_bytes) : bytes(e.kv_bytes);
  $("kv-meter").style.width = e.kv_budget_bytes ? (100 * e.kv_bytes / e.kv_budget_bytes).toFixed(1) + "%" : "0";
  const rows = s.requests.recent.slice(0, 12).map((r) => el("tr", { class: r.finish === "running" ? "live" : null },
    el("td", {}, r.api), el("td", {}, r.client || "–"), el("td", { class: "num" }, r.prompt_tokens),
    el("td", { class: "num" }, r.cached_tokens), el("td", { class: "num" }, r.completion_tokens),
    el("td", { class: "num" }, r.tool_calls), el("td", { class: "num" }, secs(r.ttft_s)),
    el("td", { class: "num" }, r.duration_s == null ? "…" : secs(r.duration_s)),
    el("td", { class: finishClass(r.finish) }, r.finish,
      ...r.guards.filter((g) => g !== r.finish).map((g) => el("span", { class: "tag" }, g)))));
  $("recent").replaceChildren(...(rows.length ? rows
    : [el("tr", { class: "empty" }, el("td", { colspan: 9 }, "no requests yet"))]));
}

function finishClass(finish) {
  if (finish === "running") return "busy";
  if (["error", "memory", "loop", "tool_loop"].includes(finish)) return "warn";
  return null;
}

function blank() {
  for (const value of document.querySelectorAll(".card .value")) value.textContent = "–";
  $("cached-share").textContent = "";
  $("kv-meter").style.width = "0";
  $("recent").replaceChildren();
}

function addSamples(history) {
  const fresh = history.samples.filter((s) => s.t > view.lastT);
  view.samples.push(...fresh);
  if (fresh.length) view.lastT = fresh[fresh.length - 1].t;
  view.now = history.now;
  const keepFrom = view.now - 620;
  while (view.samples.length && view.samples[0].t < keepFrom) view.samples.shift();
}

// Share of prompt tokens served from the prefix cache over the 30 s before each sample.
function cacheShare(samples) {
  const out = [];
  let j = 0;
  for (const s of samples) {
    while (samples[j].t < s.t - 30) j++;
    const read = s.prompt_tokens_total - samples[j].prompt_tokens_total;
    const cached = s.cached_tokens_total - samples[j].cached_tokens_total;
    out.push([s.t, read > 0 ? (100 * cached) / read : null]);
  }
  return out;
}

function chart(id, series, format, nowText, min, integer) {
  const figure = $(id);
  figure.querySelector(".now").textContent = nowText;
  window.drawChart(figure.querySelector("svg"), series,
    { t0: view.now - view.windowS, t1: view.now, format, min, integer, gap: 3 });
}

function showCharts() {
  const s = view.samples;
  const last = s[s.length - 1] || {};
  const points = (key) => s.map((x) => [x.t, x[key]]);
  const rate = (v) => v >= 1000 ? (v / 1000).toFixed(1) + "k" : v.toFixed(v < 10 && v > 0 || v % 1 ? 1 : 0);
  chart("chart-decode", [{ name: "decode", color: "var(--green)", points: points("decode_tps"), fill: true }],
    rate, last.t ? rate(last.decode_tps) + " tok/s" : "–", 10);
  chart("chart-prefill", [{ name: "prompt", color: "var(--blue)", points: points("prefill_tps"), fill: true }],
    rate, last.t ? rate(last.prefill_tps) + " tok/s" : "–", 10);
  const ttfts = points("ttft_s").filter(([, v]) => v != null);
  const axisSecs = (v) => v === 0 ? "0" : v < 1 ? (v * 1000).toFixed(0) + " ms" : +v.toFixed(1) + " s";
  chart("chart-ttft", [{ name: "ttft", color: "var(--orange)", points: ttfts, dots: true }],
    axisSecs, ttfts.length ? secs(ttfts[ttfts.length - 1][1]) : "–", 0.1);
  chart("chart-requests", [
    { name: "running", color: "var(--green)", points: points("running"), fill: true },
    { name: "queued", color: "var(--orange)", points: points("waiting") }],
  (v) => v.toFixed(0), last.t ? `${last.in_flight} open: ${last.running} running, ${last.waiting} queued` : "–", 2, true);
  // The budget is GBs and the use often MBs: it is named, not drawn, so the lines stay readable.
  chart("chart-memory", [
    { name: "kv", color: "var(--blue)", points: points("kv_bytes"), fill: true },
    { name: "prefix", color: "var(--purple)", points: points("prefix_cache_bytes") }],
  (v) => v ? bytes(v) : "0", last.t ? `${bytes(last.kv_bytes)} · ${bytes(last.prefix_cache_bytes)}` : "–", 1 << 20);
  $("kv-budget").textContent = last.kv_budget_bytes ? `KV budget ${bytes(last.kv_budget_bytes)}` : "";
  const share = cacheShare(s);
  const lastShare = share.length ? share[share.length - 1][1] : null;
  chart("chart-cache", [{ name: "cache", color: "var(--teal)", points: share, fill: true }],
    (v) => v.toFixed(0) + "%", lastShare == null ? "–" : lastShare.toFixed(0) + " %", 100);
}

function showConversations(data) {
  const rows = data.conversations.map((c) => el("tr", { class: c.in_flight ? "live" : null },
    el("td", {}, c.client),
    el("td", { class: "title", title: c.title }, c.title || "(no user message)",
      el("small", {}, c.session ? "session " + c.session : "opening " + c.key.split("prefix:")[1])),
    el("td", { class: "num" }, c.requests + (c.in_flight ? ` (${c.in_flight} now)` : "")),
    el("td", { class: "num" }, count(c.prompt_tokens)),
    el("td", {}, el("span", { class: "bar" }, el("span", { style: `width:${(100 * (c.cache_hit || 0)).toFixed(0)}%` })),
      pct(c.cache_hit)),
    el("td", { class: "num" }, count(c.completion_tokens)), el("td", { class: "num" }, c.tool_calls),
    el("td", {}, ...Object.entries(c.guards).map(([g, n]) => el("span", { class: "tag" }, `${g} ×${n}`))),
    el("td", { class: "num" }, ago(data.now - c.last_seen))));
  $("conversations").replaceChildren(...(rows.length ? rows
    : [el("tr", { class: "empty" }, el("td", { colspan: 9 }, "no requests yet"))]));
}

// Patches short enough are shown open; a reader's own opening or closing survives the next poll.
function patchView(patch, key) {
  const pre = el("pre");
  patch.replace(/\n$/, "").split("\n").forEach((line, i) => {
    const kind = line.startsWith("@@") ? "hunk" : line.startsWith("+") && !line.startsWith("+++") ? "add"
      : line.startsWith("-") && !line.startsWith("---") ? "del" : null;
    pre.append(...(i ? ["\n"] : []), el("span", { class: kind }, line));
  });
  const added = patch.split("\n").filter((l) => l.startsWith("+") && !l.startsWith("+++")).length;
  const removed = patch.split("\n").filter((l) => l.startsWith("-") && !l.startsWith("---")).length;
  const open = view.patchOpen.has(key) ? view.patchOpen.get(key) : added + removed <= 30;
  const details = el("details", { class: "patch", open }, el("summary", {}, `the patch (+${added} −${removed})`), pre);
  details.addEventListener("toggle", () => view.patchOpen.set(key, details.open));
  return details;
}

const PART_CLASS = { applied: "ok", answered: "ok", failed: "fail", timeout: "fail", conflict: "warn", skipped: "dim" };
const AGENT_CLASS = { passed: "ok", answered: "ok", failed: "fail", error: "fail", checking: "busy", stopped: "dim" };

function runView(run, now) {
  const finished = !run.active;
  const outcome = run.state === "done" ? (run.message.startsWith("applied") || run.message === "answered" ? "passed" : "failed")
    : run.active ? run.state : "stopped";
  const head = el("div", { class: "head" }, el("span", { class: "task" }, run.task),
    el("span", { class: "pill" + (outcome === "failed" ? " fail" : outcome === "stopped" ? " bad" : "") }, outcome),
    el("span", { class: "dim" }, `${dur(Math.max(0, (finished ? run.updated : now) - run.started))}`
      + (finished ? `, ended ${ago(now - run.updated)}` : "")));
  const meta = el("div", { class: "meta" }, "project ", el("code", {}, run.directory), "  ·  ",
    run.check ? el("span", {}, "check ", el("code", {}, run.check)) : "question (no check)",
    `  ·  run ${run.run}`, run.message ? `  ·  ${run.message}` : "");
  const parts = run.parts.map((p) => {
    const who = p.winner != null ? ` by agent ${p.winner + 1}` : "";
    const files = p.files.length ? `: ${p.files.join(", ")}` : "";
    return el("div", { class: "part" }, `part ${p.index + 1} · ${p.goal} · `,
      el("b", { class: PART_CLASS[p.status] || "busy" }, p.status + who + files), p.detail ? ` — ${p.detail}` : "",
      p.patch ? patchView(p.patch, `${run.run}/${p.index}`) : null);
  });
  const agents = run.agents.map((a) => el("tr", { class: ["working", "checking"].includes(a.status) && run.active ? "live" : null },
    el("td", {}, a.part + 1), el("td", {}, a.agent + 1), el("td", {}, el("code", {}, a.worktree)),
    el("td", {}, el("span", { class: "steps" }, el("span", { style: `width:${(100 * a.step / Math.max(run.max_steps, 1)).toFixed(0)}%` })),
      `${a.step}/${run.max_steps}`),
    el("td", { class: "title" }, a.action), el("td", { class: AGENT_CLASS[a.status] || null }, a.status),
    el("td", { class: a.check_passed === true ? "ok" : a.check_passed === false ? "fail" : "dim" },
      a.check ? (a.check_passed ? "pass: " : "fail: ") + a.check : "–"),
    el("td", { class: "num" }, count(a.tokens))));
  const table = el("table", { class: "grid-table" },
    el("thead", {}, el("tr", {}, ...["part", "agent", "worktree", "step", "last action", "status", "check", "tokens"]
      .map((h) => el("th", { class: h === "tokens" ? "num" : null }, h)))),
    el("tbody", {}, ...(agents.length ? agents : [el("tr", { class: "empty" }, el("td", { colspan: 8 }, "planning…"))])));
  return el("div", { class: "run" + (run.active ? " live" : "") }, head, meta, ...parts, table);
}

function showTeam(data) {
  const runs = data.runs;
  $("team").hidden = runs.length === 0;
  const live = runs.filter((r) => r.active).length;
  $("team-note").textContent = live ? `${live} run${live > 1 ? "s" : ""} in progress` : "the last runs";
  $("team-runs").replaceChildren(...runs.map((r) => runView(r, data.now)));
}

async function getJSON(path) {
  const res = await fetch(path, { cache: "no-store" });
  return res.json();
}

async function poll() {
  try {
    const status = await getJSON("/v1/locals/status");
    if (status.pid !== view.pid) Object.assign(view, { samples: [], lastT: 0, pid: status.pid });  // a new server
    showStatus(status);
    const [history, conversations, team] = await Promise.all(
      [`/v1/locals/history?since=${view.lastT}`, "/v1/locals/conversations", "/v1/locals/team"].map(getJSON));
    addSamples(history);
    showCharts();
    showConversations(conversations);
    showTeam(team);
  } catch (err) {
    $("status").textContent = "unreachable";
    $("status").className = "pill bad";
    $("uptime").textContent = "–";
    $("memory").textContent = "–";  // the process's memory: not an old value of a server that is gone
    blank();
  }
  setTimeout(poll, 1000);
}

function chooseWindow(seconds) {
  view.windowS = seconds;
  document.querySelectorAll("#window button").forEach((b) => b.classList.toggle("on", Number(b.dataset.s) === seconds));
}

for (const button of document.querySelectorAll("#window button")) {
  button.addEventListener("click", () => { chooseWindow(Number(button.dataset.s)); showCharts(); });
}
// ?window=60 (or 300, 600) opens the page on that chart span; a link can keep the choice.
const asked = Number(new URLSearchParams(location.search).get("window"));
if ([60, 300, 600].includes(asked)) chooseWindow(asked);
window.addEventListener("resize", showCharts);
poll();
