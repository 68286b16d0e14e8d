// litstream dashboard: page behaviour on top of htmx (fragments) and Chart.js (charts). No network but this gateway.
(function () {
  "use strict";
  // Error fragments (a bad query, an unknown rollout) are written to be shown: swap 4xx and 5xx answers too.
  htmx.config.responseHandling = [
    { code: "204", swap: false },
    { code: "[2345]..", swap: true, error: false },
  ];
  const palette = ["#3056d3", "#e09b00", "#1f9d55", "#d64545", "#7c4dff", "#4a90c2"];

  function lineChart(canvas, labels, series, opts) {
    const bar = opts && opts.type === "bar";
    // opts.byRun: "<run> validation" and "<run> train" share the run's colour, the training line dashed
    const runs = [];
    const colour = (name, i) => {
      if (!(opts && opts.byRun)) return palette[i % palette.length];
      const run = name.replace(/ (validation|train)$/, "");
      if (runs.indexOf(run) < 0) runs.push(run);
      return palette[runs.indexOf(run) % palette.length];
    };
    const datasets = Object.entries(series).map(([name, values], i) => ({
      label: name, data: values, borderColor: colour(name, i),
      backgroundColor: colour(name, i) + (bar ? "cc" : "33"), spanGaps: true, tension: 0.2,
      borderDash: opts && opts.byRun && / train$/.test(name) ? [6, 4] : [],
      pointRadius: 3, yAxisID: opts && opts.twoAxes && i > 0 ? "y1" : "y",
    }));
    if (canvas._chart) {
      canvas._chart.data.labels = labels;
      canvas._chart.data.datasets = datasets;
      canvas._chart.update("none");
      return canvas._chart;
    }
    canvas._chart = new Chart(canvas, {
      type: (opts && opts.type) || "line", data: { labels: labels, datasets: datasets },
      options: { animation: false, responsive: true, maintainAspectRatio: true, aspectRatio: 2.4,
                 plugins: { legend: { display: datasets.length > 1 || !!(opts && opts.legend) } },
                 scales: Object.assign({ y: { beginAtZero: !!(opts && opts.zero) } },
                   opts && opts.twoAxes ? { y1: { position: "right", beginAtZero: true, grid: { drawOnChartArea: false } } } : {}) },
    });
    return canvas._chart;
  }

  // The rollouts list: page buttons and "filters changed, back to page 1".
  window.litGoPage = function (n) {
    const input = document.getElementById("page-input");
    if (!input) return;
    input.value = n;
    htmx.ajax("GET", "/ui/f/rollouts", { target: "#rollouts", values: htmx.values(document.getElementById("filters")) });
  };
  // Capture phase: reset the page before htmx's own listener on the form sends the new filter.
  function backToFirstPage(e) {
    const form = e.target.closest && e.target.closest("#filters");
    if (form && e.target.name !== "page") document.getElementById("page-input").value = 1;
  }
  document.addEventListener("change", backToFirstPage, true);
  document.addEventListener("keyup", backToFirstPage, true);

  // Keep open span rows open across a live refresh of the span tree.
  let openSpans = [];
  document.addEventListener("htmx:beforeSwap", function (e) {
    openSpans = Array.from(e.detail.target.querySelectorAll("details[open][id]")).map((d) => d.id);
  });
  document.addEventListener("htmx:afterSwap", function (e) {
    openSpans.forEach((id) => { const d = document.getElementById(id); if (d) d.open = true; });
    drawSqlCharts(e.detail.target);
  });

  // The SQL console: a chart under the query for any numeric result; Ctrl+Enter runs; example links.
  function drawSqlCharts(root) {
    root.querySelectorAll("canvas[data-chart]").forEach(function (c) {
      const spec = JSON.parse(c.dataset.chart);
      const bar = spec.labels.length <= 40;
      // A second numeric column gets its own axis on the right: a count and a mean rarely share a scale.
      lineChart(c, spec.labels, spec.series, { type: bar ? "bar" : "line", zero: true, legend: true,
                                               twoAxes: Object.keys(spec.series).length === 2 });
    });
  }
  document.addEventListener("keydown", function (e) {
    if (e.target.id === "sql-query" && e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      document.getElementById("sql-run").click();
    }
  });
  document.addEventListener("click", function (e) {
    const a = e.target.closest && e.target.closest("a[data-sql]");
    if (!a) return;
    e.preventDefault();
    document.getElementById("sql-query").value = a.dataset.sql;
    document.getElementById("sql-run").click();
  });

  // The training page: poll its JSON and update the numbers and charts in place.
  function emptyNote(canvasId, empty, text) {
    const card = document.getElementById(canvasId).parentElement;
    let note = card.querySelector(".empty-note");
    if (!note) { note = document.createElement("p"); note.className = "empty-note muted"; card.insertBefore(note, card.children[1]); }
    note.textContent = text;
    note.hidden = !empty;
  }
  function fmt(x, digits) { return x === null || x === undefined ? "-" : Number(x).toFixed(digits); }
  async function refreshTraining(root) {
    let body;
    try {
      const r = await fetch(root.dataset.src, { credentials: "same-origin" });
      if (!r.ok) throw new Error(r.status + " " + (await r.text()).slice(0, 200));
      body = await r.json();
    } catch (err) {
      const box = document.getElementById("t-error");
      box.hidden = false; box.textContent = "Could not load training data: " + err.message;
      return;
    }
    const s = body.steps, err = document.getElementById("t-error");
    err.hidden = !body.error; err.textContent = body.error || "";
    document.getElementById("t-version").textContent = s.current_version === null ? "-" : "v" + s.current_version;
    document.getElementById("t-resources").textContent = body.latest_resources || "-";
    document.getElementById("t-steps").textContent = s.steps;
    document.getElementById("t-step-s").textContent = s.last_step_s === null ? "-" : fmt(s.last_step_s, 2) + " s";
    document.getElementById("t-tps").textContent = fmt(s.last_tokens_per_s, 0);
    emptyNote("chart-reward", body.rewards.labels.length === 0, "No reward recorded yet.");
    emptyNote("chart-step-reward", s.labels.length === 0, "No training step yet: the trainer steps once a window of groups is full.");
    lineChart(document.getElementById("chart-reward"), body.rewards.labels, body.rewards.series, { legend: true });
    emptyNote("chart-runs", body.runs.labels.length === 0, "No training run in this history yet (litstream train, Trainer.fit).");
    lineChart(document.getElementById("chart-runs"), body.runs.labels, body.runs.series, { legend: true, byRun: true });
    lineChart(document.getElementById("chart-step-reward"), s.labels, { "mean reward": s.reward });
    lineChart(document.getElementById("chart-step-time"), s.labels, { "step time (s)": s.step_s }, { zero: true });
    lineChart(document.getElementById("chart-tps"), s.labels, { "tokens/s": s.tokens_per_s }, { zero: true });
  }
  document.addEventListener("DOMContentLoaded", function () {
    const root = document.getElementById("training");
    if (!root) return;
    refreshTraining(root);
    setInterval(() => refreshTraining(root), Number(root.dataset.every || 5000));
  });
})();
