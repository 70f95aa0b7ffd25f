// The dashboard page: asks the server for the log's new rows every second and redraws the charts (uPlot).
// What it plotted is on <body> too (data-train-rows, data-eval-rows, data-samples-step, and each chart's
// data-points), so a test in a browser can check it.
"use strict";

const POLL_MS = 1000;
// this page's name in its requests: a training process that ends waits (briefly) for the pages that are open
// to read the log's last rows
const PAGE = Math.random().toString(36).slice(2);
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"];
const LOSSES = [["train loss (step)", "train", "loss"], ["train loss (eval)", "eval", "train_loss"],
                ["val loss", "eval", "val_loss"]];
// each chart: its x key and its series [label, row kind, key, scale]; optional ones appear once they have data
const CHARTS = [
  {id: "loss-step", title: "loss vs step", x: "step", series: LOSSES},
  {id: "loss-tokens", title: "loss vs tokens", x: "tokens", series: LOSSES},
  {id: "lr", title: "learning rate", x: "step", series: [["lr", "train", "lr"]]},
  {id: "grad-norm", title: "gradient norm", x: "step", series: [["norm", "train", "grad_norm"]]},
  {id: "tokens-per-s", title: "tokens/s", x: "step", series: [["tokens/s", "train", "tokens_per_s"]]},
  {id: "mfu", title: "MFU (%)", x: "step", series: [["MFU %", "train", "mfu", 100]], optional: true},
  {id: "hellaswag", title: "HellaSwag", x: "step", optional: true,
   series: [["acc_norm", "eval", "hellaswag"], ["acc", "eval", "hellaswag_acc"]]},
];

const IDLE_S = 120;  // a log without an end row that has not changed for this long: say so, not "live"
const rows = {train: [], eval: []};
const plots = {};  // chart id -> uPlot
let offset = 0;
let samples = null;
let idle = null;  // seconds since the log last changed, as the server sees it
let ended = null;  // the log's "end" row: the run finished (or was stopped), nothing more will come

function compact(v) {
  const a = Math.abs(v);
  if (a >= 1e9) return +(v / 1e9).toPrecision(3) + "B";
  if (a >= 1e6) return +(v / 1e6).toPrecision(3) + "M";
  if (a >= 1e4) return +(v / 1e3).toPrecision(3) + "k";
  if (a > 0 && a < 1e-3) return v.toExponential(1);
  return +v.toPrecision(4) + "";
}

// uPlot wants one x array and, per series, a value or null at each x
function chartData(chart) {
  const byX = new Map();
  chart.series.forEach(([, kind, key, scale], i) => {
    for (const row of rows[kind]) {
      if (row[key] == null || row[chart.x] == null) continue;
      if (!byX.has(row[chart.x])) byX.set(row[chart.x], chart.series.map(() => null));
      byX.get(row[chart.x])[i] = row[key] * (scale || 1);
    }
  });
  const xs = [...byX.keys()].sort((a, b) => a - b);
  return [xs, ...chart.series.map((_, i) => xs.map(x => byX.get(x)[i]))];
}

// the card's inner width: charts fit a phone-sized window (the card sets the grid's minimum)
function chartWidth(card) {
  return Math.max(160, card.clientWidth - 20);
}

function makePlot(chart, data) {
  const card = document.createElement("div");
  card.className = "card";
  card.id = chart.id;
  card.innerHTML = `<h2>${chart.title}</h2>`;
  document.getElementById("charts").appendChild(card);
  const width = chartWidth(card);
  const opts = {
    width, height: 260,
    scales: {x: {time: false}},
    axes: [{label: chart.x, values: (u, vals) => vals.map(compact)}, {values: (u, vals) => vals.map(compact), size: 60}],
    series: [{label: chart.x, value: (u, v) => v == null ? "-" : compact(v)},
             ...chart.series.map(([label, kind], i) => ({
               label, stroke: COLORS[i % COLORS.length], width: kind === "train" ? 1 : 2, spanGaps: true,
               points: {show: kind === "eval"}, value: (u, v) => v == null ? "-" : compact(v)}))],
  };
  plots[chart.id] = new uPlot(opts, data, card);
}

function countPoints(data) {
  return data.slice(1).reduce((n, s) => n + s.filter(v => v != null).length, 0);
}

function redraw() {
  document.getElementById("waiting").hidden = rows.train.length + rows.eval.length > 0;
  for (const chart of CHARTS) {
    const data = chartData(chart);
    const points = countPoints(data);
    if (!plots[chart.id]) {
      if (!points && (chart.optional || !rows.train.length)) continue;
      makePlot(chart, data);
    } else {
      plots[chart.id].setData(data);
    }
    document.getElementById(chart.id).dataset.points = points;
  }
  const last = rows.train[rows.train.length - 1] || {};
  const lastEval = rows.eval[rows.eval.length - 1];
  const parts = [];
  if (last.step != null) parts.push(`step ${last.step}`, `${compact(last.tokens)} tokens`, `loss ${last.loss?.toFixed(4)}`);
  if (lastEval?.val_loss != null) parts.push(`val loss ${lastEval.val_loss.toFixed(4)} (step ${lastEval.step})`);
  if (last.tokens_per_s != null) parts.push(`${compact(last.tokens_per_s)} tokens/s`);
  document.getElementById("summary").textContent = parts.join(" · ");
  if (samples) {
    document.getElementById("samples-card").hidden = false;
    document.getElementById("samples-step").textContent = samples.step;
    const box = document.getElementById("samples");
    box.replaceChildren(...samples.samples.map(text => {
      const pre = document.createElement("pre");
      pre.textContent = text;
      return pre;
    }));
  }
  const body = document.body.dataset;
  body.trainRows = rows.train.length;
  body.evalRows = rows.eval.length;
  body.samplesStep = samples ? samples.step : "";
}

// the furthest step the log has reached: the end row's, else the last train or eval row's. Not the last train
// row alone: train rows come every log_interval steps, and the last step is an evaluation (or the end) only
function latestStep() {
  const steps = [rows.train.at(-1)?.step, rows.eval.at(-1)?.step, ended?.step].filter(s => s != null);
  return steps.length ? Math.max(...steps) : null;
}

async function poll() {
  const status = document.getElementById("status");
  try {
    let changed = false;
    for (;;) {  // a long log comes in several answers
      const answer = await (await fetch(`log?offset=${offset}&page=${PAGE}`, {cache: "no-store"})).json();
      if (answer.reset) {  // a resumed run cut its log back: start over
        rows.train = []; rows.eval = []; samples = null; ended = null; changed = true;
      }
      for (const row of answer.rows) {
        if (row.kind === "sample") samples = row;
        else if (row.kind === "end") ended = row;
        else if (rows[row.kind]) { rows[row.kind].push(row); ended = null; }
      }
      idle = answer.idle_s;
      changed = changed || answer.rows.length > 0;
      document.getElementById("run").textContent = answer.run;
      offset = answer.offset;
      if (!answer.more) break;
    }
    if (changed) redraw();
    document.title = `${document.getElementById("run").textContent}: step ${latestStep() ?? "-"}`;
    if (ended) {
      status.textContent = ended.stopped ? `stopped at step ${ended.step} (init_from=resume goes on)`
                                         : `finished: ${ended.step} steps, ${compact(ended.tokens)} tokens`;
      status.className = "ended";
    } else if (idle != null && idle > IDLE_S) {
      status.textContent = `no new log rows for ${Math.round(idle / 60)} min (run stopped or crashed?)`;
      status.className = "stale";
    } else {
      status.textContent = `live, updated ${new Date().toLocaleTimeString()}`;
      status.className = "";
    }
    document.body.dataset.status = status.className || "live";
  } catch (e) {
    if (status.className !== "stale" && !ended) {  // a finished run's server may be gone: it still says so
      status.textContent = `no answer from the server since ${new Date().toLocaleTimeString()} (run over?)`;
      status.className = "stale";
    }
  }
  setTimeout(poll, POLL_MS);
}

window.addEventListener("resize", () => {
  for (const [id, plot] of Object.entries(plots)) {
    plot.setSize({width: chartWidth(document.getElementById(id)), height: 260});
  }
});
window.dashboard = {rows, plots, ended: () => ended};
poll();
