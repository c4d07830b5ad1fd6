// Veri dashboard: small progressive scripts over server-rendered pages. Every page works without
// them; with them a job's page updates live (status, log tail, metrics, samples) by polling the
// job's JSON reads, and charts are drawn by the vendored uPlot.
"use strict";

const POLL = { status: 3000, logs: 1500, metrics: 2500 };
const MAX_LOG_LINES = 20000; // older lines stay in the full-log download
const COLORS = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#9a6700", "#bf3989", "#1b7c83"];

class SignedOut extends Error {}

async function getJSON(url) {
  // A redirect here is the sign-in page: the session ended.
  const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin", redirect: "manual" });
  if (response.type === "opaqueredirect" || response.status === 401 || response.status === 403) throw new SignedOut();
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

function showSignedOut() {
  if (document.querySelector("[data-signed-out]")) return;
  const notice = document.createElement("p");
  notice.className = "flash error";
  notice.dataset.signedOut = "";
  notice.setAttribute("role", "alert");
  notice.innerHTML = 'You were signed out, so this page stopped updating. <a href="">Reload</a> to sign in again.';
  document.querySelector("main").prepend(notice);
}

// Polls `tick` every `ms` until it returns true ("done"); a failed fetch is retried next time.
function poll(tick, ms) {
  let stopped = false;
  const run = async () => {
    let done = false;
    try {
      done = await tick();
    } catch (error) {
      if (error instanceof SignedOut) { showSignedOut(); return; }
      console.warn(error);
    }
    if (done || stopped) return;
    setTimeout(run, document.hidden ? ms * 4 : ms);
  };
  run();
  return () => { stopped = true; };
}

// A legend value: the point under the cursor, or the newest one while the cursor is away (not
// uPlot's "--").
function legendValue(format) {
  return (u, v, index, idx) => {
    if (idx != null) return v == null ? "--" : format(v);
    const column = u.data[index];
    for (let i = column.length - 1; i >= 0; i -= 1) if (column[i] != null) return format(column[i]);
    return "--";
  };
}

function chart(figure, names, width) {
  const number = legendValue((v) => Number(v.toPrecision(4)).toString());
  const opts = {
    width: Math.max(width, 200),
    height: 220,
    scales: { x: { time: false } },
    legend: { live: true },
    series: [{ label: "step", value: legendValue(String) }].concat(
      names.map((name, i) => ({ label: name, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, value: number }))
    ),
    axes: [{ label: "step" }, { size: 60 }],
  };
  return new uPlot(opts, [[]].concat(names.map(() => [])), figure);
}

// A chart that follows its figure's width and can be given new data at any time, even while its
// tab is hidden (it is drawn when the figure has a width).
class LiveChart {
  constructor(figure, names) {
    this.figure = figure;
    this.names = names;
    this.plot = null;
    this.data = null;
    new ResizeObserver(() => this.draw()).observe(figure);
  }
  setNames(names) {
    if (names.join("\u0000") === this.names.join("\u0000")) return;
    this.names = names;
    if (this.plot) { this.plot.destroy(); this.plot = null; }
  }
  setData(data, points) {
    this.data = data;
    this.figure.dataset.points = String(points);
    this.figure.hidden = points === 0;
    this.draw();
  }
  draw() {
    const width = this.figure.clientWidth;
    if (!this.data || width === 0) return;
    if (!this.plot) this.plot = chart(this.figure, this.names, width);
    else if (Math.abs(this.plot.width - width) > 1) this.plot.setSize({ width, height: 220 });
    this.plot.setData(this.data);
  }
}

function setupTabs(root) {
  const tabs = [...root.querySelectorAll("[data-tab]")];
  const show = (name) => {
    if (!tabs.some((t) => t.dataset.tab === name)) name = "overview";
    for (const tab of tabs) tab.setAttribute("aria-selected", String(tab.dataset.tab === name));
    for (const panel of root.querySelectorAll("[data-panel]")) panel.hidden = panel.dataset.panel !== name;
    if (name === "logs") root.querySelector("[data-log]")?.dispatchEvent(new Event("shown"));
  };
  root.addEventListener("click", (event) => {
    const link = event.target.closest("[data-tab], [data-tab-link]");
    if (!link) return;
    event.preventDefault();
    const name = link.dataset.tab || link.dataset.tabLink;
    history.replaceState(null, "", `#${name}`);
    show(name);
  });
  window.addEventListener("hashchange", () => show(location.hash.slice(1)));
  show(location.hash.slice(1));
}

function escapeHTML(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function escapeRegExp(text) {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

function setupLogs(root, onFinished) {
  const box = root.querySelector("[data-log]");
  const search = root.querySelector("[data-log-search]");
  const matches = root.querySelector("[data-log-matches]");
  let after = -1;
  let followed = true; // the reader is at the bottom: new lines scroll into view

  const atBottom = () => box.scrollHeight - box.scrollTop - box.clientHeight < 8;
  box.addEventListener("scroll", () => { followed = atBottom(); });
  box.addEventListener("shown", () => { if (followed) box.scrollTop = box.scrollHeight; });

  let pattern = null; // the query as a case-insensitive regex: one rule to find and to mark
  const paint = (line) => {
    const text = line.dataset.text;
    const marked = line.firstElementChild !== null;
    if (!pattern) {
      if (marked) line.textContent = text;
      line.classList.remove("hidden");
      return;
    }
    pattern.lastIndex = 0;
    const found = pattern.test(text);
    line.classList.toggle("hidden", !found);
    if (!found) {
      if (marked) line.textContent = text;
      return;
    }
    // Split on the query as a captured group: odd parts are the matches.
    const parts = text.split(pattern);
    line.innerHTML = parts.map((part, i) => (i % 2 ? `<mark>${escapeHTML(part)}</mark>` : escapeHTML(part))).join("");
  };
  const countMatches = () => {
    if (!pattern) { matches.textContent = ""; return; }
    const shown = box.querySelectorAll(".line:not(.hidden)").length;
    matches.textContent = `${shown} matching line${shown === 1 ? "" : "s"}`;
  };
  let typing = null;
  search.addEventListener("input", () => {
    // Repainting every line on each keystroke would freeze a long log: wait for a pause.
    clearTimeout(typing);
    typing = setTimeout(() => {
      const query = search.value.trim();
      pattern = query ? new RegExp(`(${escapeRegExp(query)})`, "giu") : null;
      for (const line of box.children) paint(line);
      countMatches();
    }, 250);
  });

  return poll(async () => {
    const body = await getJSON(`${box.closest("[data-job]").dataset.logsUrl}?after=${after}`);
    if (body.lines.length) {
      // Hidden (another tab) the box has no height: remember where the reader was instead.
      const follow = box.clientHeight === 0 ? followed : atBottom();
      const fragment = document.createDocumentFragment();
      for (const { text } of body.lines) {
        const line = document.createElement("span");
        line.className = "line";
        // A progress bar redraws itself with carriage returns: show its last state.
        line.dataset.text = text.slice(text.lastIndexOf("\r", text.length - 2) + 1) + "\n";
        line.textContent = line.dataset.text;
        if (pattern) paint(line);
        fragment.appendChild(line);
      }
      box.appendChild(fragment);
      while (box.children.length > MAX_LOG_LINES) box.firstChild.remove();
      box.dataset.lines = String(Number(box.dataset.lines || 0) + body.lines.length);
      if (pattern) countMatches();
      if (follow) box.scrollTop = box.scrollHeight;
      followed = follow;
    }
    after = body.next_seq;
    if (body.finished) { onFinished(); return true; }
    return false;
  }, POLL.logs);
}

// The metrics every chart reads: steps, when each arrived (seconds), and each key's value at each
// step (null where absent).
class MetricSeries {
  constructor() { this.steps = []; this.times = []; this.values = new Map(); }
  add(points) {
    for (const { step, at, values } of points) {
      const row = this.steps.length;
      this.steps.push(step);
      this.times.push(at);
      for (const [key, value] of Object.entries(values)) {
        if (typeof value !== "number") continue;
        if (!this.values.has(key)) this.values.set(key, new Array(row).fill(null));
        this.values.get(key).push(value);
      }
      for (const column of this.values.values()) if (column.length === row) column.push(null);
    }
  }
  columns(keys) { return [this.steps].concat(keys.map((k) => this.values.get(k))); }
  count(key) { return (this.values.get(key) || []).filter((v) => v !== null).length; }
  rewardFunctions() {
    return [...this.values.keys()].filter((k) => /^rewards\/.+\/mean$/.test(k)).sort();
  }
}

// The Metrics tab: metrics.js's view of this one run.
function setupMetrics(root, series, onUpdate) {
  const element = root.querySelector("[data-metrics-view]");
  const view = new MetricsView(element, [{ id: "", series, notes: JSON.parse(element.dataset.notes) }]);
  view.update();
  let after = -1;
  const url = root.dataset.metricsUrl;
  return poll(async () => {
    const body = await getJSON(`${url}?after_step=${after}`);
    if (body.points.length) {
      series.add(body.points);
      after = body.points[body.points.length - 1].step;
      view.update();
      onUpdate();
    }
    return body.finished && body.points.length === 0;
  }, POLL.metrics);
}

function setupSamples(root, series) {
  const panel = root.querySelector("[data-panel='samples']");
  if (!panel) return { refreshChart() {} };
  const figure = panel.querySelector("[data-reward-functions]");
  const rewardChart = new LiveChart(figure, []);
  const refreshChart = () => {
    const keys = series.rewardFunctions();
    rewardChart.setNames(keys.map((k) => k.slice("rewards/".length, -"/mean".length)));
    rewardChart.setData(series.columns(keys), keys.length ? series.steps.length : 0);
  };
  figure.hidden = true;
  // The table of samples is samples.js's.
  return { refreshChart };
}

function setupStatus(root) {
  const url = root.dataset.statusUrl;
  const count = root.querySelector("[data-checkpoint-count]");
  const listed = Number(count.textContent);
  let pollsSinceEnd = 0;
  return poll(async () => {
    const body = await getJSON(url);
    for (const badge of root.querySelectorAll("[data-status]")) {
      badge.textContent = body.status;
      badge.className = `badge status-${body.status}`;
    }
    showProgress(root.querySelector("[data-progress]"), body.progress);
    count.textContent = String(body.checkpoints);
    root.querySelector("[data-new-checkpoints]").hidden = body.checkpoints === listed;
    if (!body.finished) return false;
    root.dataset.finished = "true";
    root.querySelector("form[action$='/cancel/']")?.remove();
    if (body.cost_usd) root.querySelector("[data-cost]").textContent = `${body.cost_usd} USD`;
    // The charge is written a moment after the end: keep asking a little while for it.
    pollsSinceEnd += 1;
    return body.cost_usd !== null || pollsSinceEnd > 10;
  }, POLL.status);
}

function setupJob(root) {
  setupTabs(root);
  const live = root.querySelector("[data-live]");
  const series = new MetricSeries();
  const samples = setupSamples(root, series);
  setupLogs(root, () => { live.textContent = "finished"; });
  setupMetrics(root, series, () => samples.refreshChart());
  if (root.dataset.finished !== "true") setupStatus(root);
}

function setupUsage(figure) {
  const points = JSON.parse(figure.dataset.series);
  const empty = document.querySelector("[data-usage-empty]");
  if (!points.length) { figure.hidden = true; empty.hidden = false; return; }
  const hour = 3600;
  const hours = points.map((p) => p.hour);
  const [first, last] = [Math.min(...hours), Math.max(...hours)];
  const opts = {
    width: Math.max(figure.clientWidth, 200),
    height: 200,
    // A fixed range: uPlot's own for one snapshot alone stretches the time axis over years;
    // show the day around it instead.
    scales: { x: { time: true, auto: false, range: last - first < hour ? [first - 12 * hour, last + 12 * hour] : [first, last] } },
    // The legend shows the latest snapshot until the cursor points at another.
    series: [
      { label: "hour", value: legendValue((v) => new Date(v * 1000).toLocaleString()) },
      { label: "bytes", stroke: COLORS[0], fill: "rgba(9,105,218,.08)", width: 1.5, value: legendValue(formatBytes) },
    ],
    axes: [{}, { size: 90, values: (u, ticks) => ticks.map(formatBytes) }],
  };
  const plot = new uPlot(opts, [points.map((p) => p.hour), points.map((p) => p.bytes)], figure);
  figure.dataset.points = String(points.length);
  new ResizeObserver(() => plot.setSize({ width: Math.max(figure.clientWidth, 200), height: 200 })).observe(figure);
}

// Binary units, spelled as the CLI and the `binary_size` filter spell them.
function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return i === 0 ? `${n.toFixed(0)} B` : `${n.toFixed(1)} ${units[i]}`;
}

document.addEventListener("DOMContentLoaded", () => {
  for (const select of document.querySelectorAll("[data-autosubmit]")) {
    select.addEventListener("change", () => select.form.submit());
  }
  document.addEventListener("submit", (event) => {
    const message = event.target.dataset.confirm;
    if (message && !window.confirm(message)) event.preventDefault();
  });
  const job = document.querySelector("[data-job]");
  if (job) setupJob(job);
  const usage = document.querySelector("[data-usage-chart]");
  if (usage) setupUsage(usage);
});
