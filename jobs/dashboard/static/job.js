// A job's page: charts from its data block, then live progress, shard grid and cost without a reload.
"use strict";
(function () {
  const block = document.getElementById("job-data");
  let detail = JSON.parse(block.textContent);
  const ms = Number(document.body.dataset.pollMs) || 1000;
  const NAMES = {c: "committed", r: "running", t: "retried", p: "poison", q: "pending"};
  const usd = (v) => fmt.usd(v);
  const perM = (v) => (v === null || v === undefined ? "–" : "$" + Number(v).toPrecision(3));

  function costParts(c) { return [c.busy, c.idle, c.waste]; }
  function costMarket(c) { return [c.spot, c.on_demand, c.on_demand_equivalent]; }
  function costPerM(c) { return [c.usd_per_million_input, c.usd_per_million_output]; }

  function drawCharts() {
    if (!detail.cost) return;
    const c = detail.cost;
    const line = c.timeline.length ? c.timeline : [[detail.job.submitted_at, 0]];
    freightCharts["cost-time"] = timeChart(document.getElementById("cost-time"), line.map((p) => p[0]), line.map((p) => p[1]), "cost", usd);
    freightCharts["cost-parts"] = barChart(document.getElementById("cost-parts"), ["busy", "idle", "waste"], costParts(c),
      [COLORS.busy, COLORS.idle, COLORS.waste], usd);
    freightCharts["cost-market"] = barChart(document.getElementById("cost-market"), ["spot", "on-demand", "if on-demand"], costMarket(c),
      [COLORS.spot, COLORS.onDemand, COLORS.equivalent], usd);
    freightCharts["cost-per-m"] = barChart(document.getElementById("cost-per-m"), ["input", "output"], costPerM(c),
      [COLORS.input, COLORS.output], perM);
  }

  function setBars(chart, values) {
    const xs = chart.data[0];
    chart.setData([xs, ...values.map((v, i) => xs.map((x) => (x === i ? v || 0 : null)))]);
  }

  function updateCharts(old) {
    const c = detail.cost;
    if (!c || (old && old.total === c.total && old.timeline.length === c.timeline.length)) return;
    const line = c.timeline.length ? c.timeline : [[detail.job.submitted_at, 0]];
    freightCharts["cost-time"].setData([line.map((p) => p[0]), line.map((p) => p[1])]);
    setBars(freightCharts["cost-parts"], costParts(c));
    setBars(freightCharts["cost-market"], costMarket(c));
    setBars(freightCharts["cost-per-m"], costPerM(c));
    document.querySelectorAll("[data-cost]").forEach((td) => { td.textContent = fmt.usd(c[td.dataset.cost]); });
  }

  function updateSummary() {
    const j = detail.job;
    document.getElementById("job-progress").value = j.progress;
    document.getElementById("job-progress-text").textContent =
      fmt.num(j.rows_done) + "/" + fmt.num(j.rows_total) + " rows (" + fmt.pct(j.progress, 0) + ")";
    document.getElementById("job-rate").textContent = fmt.num(j.rows_per_second, 1);
    document.getElementById("job-eta").textContent = fmt.duration(j.eta_seconds);
    document.getElementById("job-cost").textContent = fmt.usd(j.cost_usd);
    document.getElementById("job-errors").textContent = fmt.num(j.errors);
    const state = document.getElementById("job-state");
    state.textContent = j.state;
    state.className = "state st-" + j.state;
  }

  function updateGrid(before) {
    const grid = document.getElementById("grid");
    if (!grid || !detail.grid) return;
    const cells = grid.children;
    for (let i = 0; i < detail.grid.length; i++) {
      if (before[i] !== detail.grid[i] && cells[i]) cells[i].className = "g-" + detail.grid[i];
    }
    document.querySelectorAll("#grid-legend b[data-state]").forEach((b) => {
      b.textContent = fmt.num(detail.counts[b.dataset.state] || 0);
    });
  }

  const grid = document.getElementById("grid");
  if (grid) {
    grid.addEventListener("mouseover", (event) => {
      const cell = event.target;
      if (cell.parentElement !== grid) return;
      const i = Array.prototype.indexOf.call(grid.children, cell);
      const code = detail.grid[i];
      let text = "shard " + i + ": " + NAMES[code];
      const attempts = detail.attempts[String(i)];
      if (attempts) text += ", " + attempts + " attempts";
      const worker = detail.workers[String(i)];
      if (worker) text += ", on " + worker;
      cell.title = text;
      document.getElementById("grid-hover").textContent = text;
    });
  }

  drawCharts();
  if (["succeeded", "failed", "cancelled", "expired"].includes(detail.job.state)) return;
  poll(ms, async () => {
    const before = detail;
    detail = await getJSON(block.dataset.poll);
    if (!before.grid && detail.grid) { window.location.reload(); return false; }  // the batch got its job
    updateSummary();
    updateGrid(before.grid || "");
    updateCharts(before.cost);
    return !["succeeded", "failed", "cancelled", "expired"].includes(detail.job.state);
  });
})();
