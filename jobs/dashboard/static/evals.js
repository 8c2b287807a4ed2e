// The evals page: one chart per suite, model and metric, from the page's data block.
"use strict";
(function () {
  const trends = JSON.parse(document.getElementById("evals-data").textContent);
  document.querySelectorAll("[data-trend]").forEach((node) => {
    const trend = trends[Number(node.dataset.trend)];
    const metric = node.dataset.metric;
    freightCharts[node.dataset.trend + ":" + metric] = trendChart(node, trend.runs, metric);
  });
})();
