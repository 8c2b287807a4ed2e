// Charts of the pages, drawn with the vendored uPlot (static/vendor/). Each chart is kept in
// window.freightCharts under its element's id (or data-trend/data-metric), so a page can update it.
"use strict";
window.freightCharts = {};

const COLORS = {ink: "#1d2327", accent: "#1f5fa8", busy: "#2e7d32", idle: "#90a4ae", waste: "#c62828",
                spot: "#1976d2", onDemand: "#6a1b9a", equivalent: "#b0bec5", input: "#00897b", output: "#ef6c00",
                regression: "#c62828", band: "rgba(31, 95, 168, 0.15)"};

// A line over time: xs in unix seconds, ys in `unit`.
function timeChart(node, xs, ys, label, unit) {
  const options = {
    width: 520, height: 220,
    scales: {x: {time: true}, y: {range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1]}},
    series: [{}, {label: label, stroke: COLORS.accent, width: 2, fill: "rgba(31, 95, 168, 0.08)",
                  value: (u, v) => (v === null ? "–" : unit(v))}],
    axes: [{}, {values: (u, splits) => splits.map(unit), size: 70}],
    legend: {show: true},
  };
  return new uPlot(options, [xs, ys], node);
}

// Bars, one per label, in one color each (uPlot draws a series per bar so each keeps its color).
function barChart(node, labels, values, colors, unit) {
  const xs = labels.map((_, i) => i);
  const series = [{}];
  const data = [xs];
  labels.forEach((label, i) => {
    series.push({label: label, fill: colors[i], stroke: colors[i], width: 0,
                 paths: uPlot.paths.bars({size: [0.7, 80], align: 0}), points: {show: false},
                 value: (u, v) => (v === null ? "–" : unit(v))});
    data.push(xs.map((x) => (x === i ? values[i] || 0 : null)));
  });
  const options = {
    width: 360, height: 220,
    scales: {x: {time: false, range: [-0.6, labels.length - 0.4]}, y: {range: (u, min, max) => [0, max > 0 ? max * 1.15 : 1]}},
    series: series,
    axes: [{splits: () => xs, values: (u, splits) => splits.map((i) => labels[i] || ""), grid: {show: false}},
           {values: (u, splits) => splits.map(unit), size: 70}],
    legend: {show: false},
    cursor: {show: false},
  };
  return new uPlot(options, data, node);
}

// A metric over runs: its score, its interval as a band, and the runs that regressed as red dots.
function trendChart(node, runs, metric) {
  const xs = runs.map((r) => r.t);
  const pick = (key) => runs.map((r) => (r.metrics[metric] ? 100 * r.metrics[metric][key] : null));
  const score = pick("score");
  const red = runs.map((r, i) => (r.metrics[metric] && r.metrics[metric].regression ? score[i] : null));
  const percent = (v) => v.toFixed(1) + "%";
  const options = {
    width: 640, height: 240,
    scales: {x: {time: true}, y: {range: [0, 100]}},
    series: [
      {},
      {label: metric, stroke: COLORS.accent, width: 2, points: {show: true, size: 6}, value: (u, v) => (v === null ? "–" : percent(v))},
      {label: "low", stroke: "rgba(31, 95, 168, 0.35)", width: 1, points: {show: false}, value: (u, v) => (v === null ? "–" : percent(v))},
      {label: "high", stroke: "rgba(31, 95, 168, 0.35)", width: 1, points: {show: false}, value: (u, v) => (v === null ? "–" : percent(v))},
      {label: "regression", stroke: COLORS.regression, fill: COLORS.regression, width: 0, paths: () => null,
       points: {show: true, size: 12, stroke: COLORS.regression, fill: COLORS.regression}, value: (u, v) => (v === null ? "" : "▼ " + percent(v))},
    ],
    bands: [{series: [3, 2], fill: COLORS.band}],
    axes: [{}, {values: (u, splits) => splits.map((v) => v + "%"), size: 50}],
  };
  return new uPlot(options, [xs, score, pick("low"), pick("high"), red], node);
}
