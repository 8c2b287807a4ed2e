// The jobs page: the table follows the store without a reload (one poll of /ui/jobs.json a period).
"use strict";
(function () {
  const table = document.getElementById("jobs");
  const body = table.querySelector("tbody");
  const withTenant = table.querySelectorAll("thead th").length === 10;
  const ms = Number(document.body.dataset.pollMs) || 1000;

  function row(j) {
    const tr = el("tr", {"data-ref": j.ref});
    const name = el("td");
    const link = el("a", {href: "/jobs/" + encodeURIComponent(j.ref)}, j.batch_id || (j.job_id || "").slice(0, 16));
    name.append(link, el("div", {class: "sub"}, j.out || "(store root)"));
    const state = el("td");
    state.append(el("span", {class: "state st-" + j.state}, j.state));
    const progress = el("td");
    const bar = el("progress", {max: "1", value: String(j.progress)});
    progress.append(bar, el("span", {class: "ptext"},
      fmt.num(j.rows_done) + "/" + fmt.num(j.rows_total) + " rows (" + fmt.pct(j.progress, 0) + ")"));
    const model = el("td", {title: j.model}, fmt.shortModel(j.model));
    tr.append(name, state, progress, el("td", {}, fmt.num(j.rows_per_second, 1)), el("td", {}, fmt.duration(j.eta_seconds)),
      el("td", {}, fmt.usd(j.cost_usd)), el("td", j.errors ? {class: "bad"} : {}, fmt.num(j.errors)), model);
    if (withTenant) tr.append(el("td", {}, j.tenant || ""));
    tr.append(el("td", {}, fmt.utc(j.submitted_at)));
    return tr;
  }

  poll(ms, async () => {
    const data = await getJSON(table.dataset.poll);
    body.replaceChildren(...data.jobs.map(row));
    document.getElementById("empty").hidden = data.jobs.length > 0;
    document.getElementById("shown").textContent = data.jobs.length + " of " + data.total + " jobs";
    table.dataset.at = String(data.at);
  });
})();
