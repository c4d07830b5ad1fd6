// Veri dashboard: the metrics view, as a Weights & Biases user expects it. Every metric the runs
// report, chosen in a picker (ticks and a search); one chart per metric, laid out in a grid with
// no hole; EMA smoothing; drag to zoom (all charts together), double-click or "Reset zoom"; the
// x axis by step, time since the start or wall-clock time; each legend showing the latest value
// until the pointer is over the chart. One run on a job's page (app.js feeds its points); several
// on the compare page, one series per run in each chart (polled here). Drawn by the vendored
// uPlot, as the rest of the dashboard.
"use strict";

// Shown first, in this order, when the reader has not picked (the rest are one tick away).
const PREFERRED_METRICS = [
  "loss", "reward", "kl", "eval_loss", "learning_rate", "tokens_per_second",
  "rewards/accuracies", "rewards/margins", "mean_token_accuracy", "grad_norm",
];
const CHART_HEIGHT = 220;
const STEP_TICKS = [1, 2, 5].flatMap((n) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6].map((p) => n * p)).sort((a, b) => a - b);
const STORED = "veri.metrics"; // the reader's picks, smoothing and x axis, kept in this browser
const X_AXES = {
  step: { label: "step", time: false },
  relative: { label: "time since start", time: false },
  wall: { label: "time", time: true },
};

// Exponential moving average as W&B and TensorBoard smooth: debiased (the first points are not
// pulled towards zero), a missing value stays missing.
function smooth(values, weight) {
  if (!weight) return values;
  let last = 0;
  let count = 0;
  return values.map((value) => {
    if (value === null || !Number.isFinite(value)) return null;
    last = last * weight + (1 - weight) * value;
    count += 1;
    return last / (1 - weight ** count);
  });
}

function formatValue(value) {
  if (value === null || value === undefined) return "–";
  const size = Math.abs(value);
  if (size !== 0 && (size < 1e-3 || size >= 1e6)) return value.toExponential(2);
  return String(Number(value.toPrecision(4)));
}

function formatSeconds(seconds) {
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

function latest(column) {
  for (let i = column.length - 1; i >= 0; i -= 1) if (column[i] !== null && column[i] !== undefined) return column[i];
  return null;
}

function readStored() {
  try {
    return JSON.parse(localStorage.getItem(STORED)) || {};
  } catch {
    return {};
  }
}

class MetricsView {
  // runs: [{id, series (app.js's MetricSeries), notes: {metric: why it is not reported}}]
  constructor(element, runs) {
    this.element = element;
    this.runs = runs;
    this.multi = runs.length > 1;
    this.grid = element.querySelector("[data-charts]");
    this.charts = new Map(); // metric -> {figure, area, note, plot, shape, resized}
    const stored = readStored();
    this.picked = Array.isArray(stored.picked) ? stored.picked : null; // null: the defaults
    this.smoothing = Number(stored.smoothing) || 0;
    this.axis = X_AXES[stored.axis] ? stored.axis : "step";
    this.zoom = null; // [min, max] of x, shared by every chart
    this.syncKey = `veri-metrics-${Math.random()}`;
    this.listed = "";
    this.bindControls();
  }

  store() {
    try {
      localStorage.setItem(STORED, JSON.stringify({ picked: this.picked, smoothing: this.smoothing, axis: this.axis }));
    } catch {
      // storage refused (private mode, full): the choice lasts for this page only
    }
  }

  bindControls() {
    const slider = this.element.querySelector("[data-smoothing]");
    const shown = this.element.querySelector("[data-smoothing-value]");
    slider.value = String(this.smoothing);
    shown.textContent = this.smoothing.toFixed(2);
    slider.addEventListener("input", () => {
      this.smoothing = Number(slider.value);
      shown.textContent = this.smoothing.toFixed(2);
      this.store();
      this.update();
    });
    const axis = this.element.querySelector("[data-x-axis]");
    axis.value = this.axis;
    axis.addEventListener("change", () => {
      this.axis = axis.value;
      this.forgetZoom(); // the charts are drawn anew on the other axis
      this.store();
      this.update();
    });
    this.resetButton = this.element.querySelector("[data-reset-zoom]");
    this.resetButton.addEventListener("click", () => this.resetZoom());
    const search = this.element.querySelector("[data-metric-search]");
    search.addEventListener("input", () => this.filterPicker(search.value));
    this.element.querySelector("[data-metric-list]").addEventListener("change", (event) => {
      const box = event.target.closest("input[type=checkbox]");
      if (!box) return;
      const picked = new Set(this.chosen());
      if (box.checked) picked.add(box.value);
      else picked.delete(box.value);
      this.setPicked([...picked]);
    });
    for (const button of this.element.querySelectorAll("[data-pick]")) {
      button.addEventListener("click", () => {
        const which = button.dataset.pick;
        if (which === "default") this.setPicked(null);
        else this.setPicked(which === "all" ? this.keys() : []);
      });
    }
  }

  setPicked(picked) {
    this.picked = picked;
    this.store();
    this.update();
  }

  notesFor(key) {
    return this.runs.filter((run) => run.notes[key]).map((run) => ({ run: run.id, note: run.notes[key] }));
  }

  // Every metric a run reports or leaves out for a stated reason, the preferred ones first.
  keys() {
    const keys = new Set();
    for (const run of this.runs) {
      for (const key of run.series.values.keys()) keys.add(key);
      for (const key of Object.keys(run.notes)) keys.add(key);
    }
    const rank = (key) => {
      const i = PREFERRED_METRICS.indexOf(key);
      return i === -1 ? PREFERRED_METRICS.length : i;
    };
    return [...keys].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  }

  chosen() {
    const keys = this.keys();
    if (this.picked === null) {
      const preferred = keys.filter((key) => PREFERRED_METRICS.includes(key));
      return preferred.length ? preferred : keys.slice(0, 4);
    }
    return keys.filter((key) => this.picked.includes(key));
  }

  renderPicker(keys, chosen) {
    const list = this.element.querySelector("[data-metric-list]");
    const signature = `${keys.join("\u0000")}\u0001${chosen.join("\u0000")}`;
    if (signature !== this.listed) {
      this.listed = signature;
      list.replaceChildren(...keys.map((key) => {
        const item = document.createElement("li");
        const label = document.createElement("label");
        const box = document.createElement("input");
        box.type = "checkbox";
        box.value = key;
        box.checked = chosen.includes(key);
        label.append(box, ` ${key}`);
        if (this.notesFor(key).length === this.runs.length) {
          const why = document.createElement("span");
          why.className = "sub";
          why.textContent = " (not reported)";
          label.append(why);
        }
        item.dataset.metric = key;
        item.append(label);
        return item;
      }));
      this.filterPicker(this.element.querySelector("[data-metric-search]").value);
    }
    this.element.querySelector("[data-picked-count]").textContent = `${chosen.length} of ${keys.length}`;
  }

  filterPicker(query) {
    const wanted = query.trim().toLowerCase();
    for (const item of this.element.querySelectorAll("[data-metric-list] li")) {
      item.hidden = wanted !== "" && !item.dataset.metric.toLowerCase().includes(wanted);
    }
  }

  update() {
    const keys = this.keys();
    const chosen = this.chosen();
    this.renderPicker(keys, chosen);
    const reported = this.runs.some((run) => run.series.steps.length > 0);
    this.element.querySelector("[data-metrics-empty]").hidden = reported;
    for (const [key, chart] of this.charts) {
      if (chosen.includes(key)) continue;
      chart.plot?.destroy();
      chart.resized.disconnect();
      chart.figure.remove();
      this.charts.delete(key);
    }
    for (const key of chosen) if (!this.charts.has(key)) this.charts.set(key, this.newChart(key));
    // The figures in the chosen order, all placed before any is measured to be drawn.
    const figures = chosen.map((key) => this.charts.get(key).figure);
    if (figures.some((figure, i) => this.grid.children[i] !== figure)) this.grid.replaceChildren(...figures);
    for (const key of chosen) this.draw(key);
  }

  newChart(key) {
    const figure = document.createElement("figure");
    figure.dataset.chart = key;
    const caption = document.createElement("figcaption");
    caption.textContent = key;
    const note = document.createElement("p");
    note.className = "note";
    note.dataset.note = "";
    note.hidden = true;
    const area = document.createElement("div");
    area.className = "plot";
    figure.append(caption, note, area);
    const chart = { figure, area, note, plot: null, shape: "", resized: new ResizeObserver(() => this.draw(key)) };
    chart.resized.observe(figure);
    return chart;
  }

  xs(run) {
    if (this.axis === "step") return run.series.steps;
    const start = run.series.times[0] ?? 0;
    return this.axis === "wall" ? run.series.times : run.series.times.map((t) => t - start);
  }

  // uPlot's columns for one metric: the x values, then one series per run (a single run's
  // unsmoothed values come first, faint, when smoothing is on).
  columns(key) {
    const tables = this.runs.map((run) => {
      const raw = run.series.values.get(key) || new Array(run.series.steps.length).fill(null);
      return [this.xs(run), smooth(raw, this.smoothing), raw];
    });
    if (!this.multi) {
      const [x, smoothed, raw] = tables[0];
      return this.smoothing ? [x, raw, smoothed] : [x, raw];
    }
    return uPlot.join(tables.map(([x, smoothed]) => [x, smoothed]));
  }

  draw(key) {
    const chart = this.charts.get(key);
    if (!chart) return;
    const points = this.runs.reduce((n, run) => n + run.series.count(key), 0);
    chart.figure.dataset.points = String(points);
    const notes = this.notesFor(key);
    chart.note.hidden = notes.length === 0;
    // One reason said once when every run gives it; else each run's, named.
    const same = notes.length === this.runs.length && notes.every(({ note }) => note === notes[0].note);
    chart.note.textContent = same ? notes[0].note : notes.map(({ run, note }) => `${run}: ${note}`).join(" ");
    if (points === 0) {
      // Nothing to draw: the reason, or that the values are still to come.
      chart.plot?.destroy();
      chart.plot = null;
      chart.shape = "";
      if (!notes.length) {
        chart.note.hidden = false;
        chart.note.textContent = "No values yet.";
      }
      return;
    }
    const width = chart.area.clientWidth;
    if (width === 0) return; // a hidden tab: drawn when shown
    const data = this.columns(key);
    const shape = `${this.axis}|${data.length}`;
    if (chart.plot && chart.shape !== shape) {
      chart.plot.destroy();
      chart.plot = null;
    }
    if (!chart.plot) {
      chart.plot = new uPlot(this.options(key, width, data.length - 1), data, chart.area);
      chart.shape = shape;
      chart.plot.over.addEventListener("dblclick", () => this.resetZoom());
      if (this.zoom) chart.plot.setScale("x", { min: this.zoom[0], max: this.zoom[1] });
      return;
    }
    if (Math.abs(chart.plot.width - width) > 1) chart.plot.setSize({ width, height: CHART_HEIGHT });
    chart.plot.setData(data, this.zoom === null);
    if (this.zoom) chart.plot.setScale("x", { min: this.zoom[0], max: this.zoom[1] });
  }

  options(key, width, count) {
    const axis = X_AXES[this.axis];
    const value = (u, v, index, idx) => formatValue(idx == null ? latest(u.data[index]) : v);
    let series;
    if (this.multi) {
      series = this.runs.map((run, i) => ({ label: run.id, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, value }));
    } else if (count === 2) {
      series = [
        { label: "raw", stroke: "rgba(9,105,218,.25)", width: 1, spanGaps: true, value },
        { label: key, stroke: COLORS[0], width: 1.5, spanGaps: true, value },
      ];
    } else {
      series = [{ label: key, stroke: COLORS[0], width: 1.5, spanGaps: true, value }];
    }
    const xValue = (u, v, index, idx) => {
      if (idx == null) return "latest";
      if (this.axis === "wall") return new Date(v * 1000).toLocaleTimeString();
      return this.axis === "relative" ? formatSeconds(v) : String(v);
    };
    return {
      width: Math.max(width, 200),
      height: CHART_HEIGHT,
      scales: { x: { time: axis.time } },
      legend: { live: true },
      cursor: {
        sync: { key: this.syncKey },
        drag: { x: true, y: false, setScale: false },
      },
      series: [{ label: axis.label, value: xValue }].concat(series),
      axes: [
        this.xAxis(axis),
        { size: 60, values: (u, ticks) => ticks.map(formatValue) },
      ],
      hooks: {
        // The shown x range on the figure: what a reader (or a test) sees zoomed.
        setScale: [(u, scale) => {
          if (scale !== "x") return;
          const figure = u.root.closest("figure");
          figure.dataset.xMin = String(Number(u.scales.x.min.toPrecision(6)));
          figure.dataset.xMax = String(Number(u.scales.x.max.toPrecision(6)));
        }],
        setSelect: [(u) => {
          if (u.select.width > 2) {
            this.zoomTo(u.posToVal(u.select.left, "x"), u.posToVal(u.select.left + u.select.width, "x"));
          }
          u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
        }],
      },
    };
  }

  xAxis(axis) {
    if (this.axis === "relative") return { label: axis.label, values: (u, ticks) => ticks.map(formatSeconds) };
    if (this.axis === "step") return { label: axis.label, incrs: STEP_TICKS }; // no step 2.5
    return { label: axis.label };
  }

  zoomTo(min, max) {
    this.zoom = [min, max];
    this.element.dataset.zoomed = "true";
    this.resetButton.disabled = false;
    for (const chart of this.charts.values()) chart.plot?.setScale("x", { min, max });
  }

  forgetZoom() {
    this.zoom = null;
    delete this.element.dataset.zoomed;
    this.resetButton.disabled = true;
  }

  resetZoom() {
    this.forgetZoom();
    for (const chart of this.charts.values()) chart.plot?.setData(chart.plot.data, true);
  }
}

// The compare page: each run's points polled from its metrics.json, drawn together; the config
// table can show only the settings that differ.
function setupCompare(root) {
  const runs = JSON.parse(root.dataset.runs).map((run) => ({ ...run, series: new MetricSeries() }));
  const view = new MetricsView(root.querySelector("[data-metrics-view]"), runs);
  view.update();
  for (const run of runs) {
    let after = -1;
    poll(async () => {
      const body = await getJSON(`${run.metrics_url}?after_step=${after}`);
      if (body.points.length) {
        run.series.add(body.points);
        after = body.points[body.points.length - 1].step;
        view.update();
      }
      return body.finished && body.points.length === 0;
    }, POLL.metrics);
  }
  const only = root.querySelector("[data-only-differences]");
  const table = root.querySelector("[data-config-diff]");
  only.addEventListener("change", () => table.classList.toggle("only-differences", only.checked));
}

document.addEventListener("DOMContentLoaded", () => {
  const compare = document.querySelector("[data-compare]");
  if (compare) setupCompare(compare);
});
