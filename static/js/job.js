/* Job page: draws the figures built by the server (json_script "job-data") with plotly.js.
 *
 * - one time axis for the time series and the per-GPU heatmap: zooming either zooms both;
 * - "Show on charts" buttons of the findings zoom both to the finding's window;
 * - a zoom into a small part of the job fetches that part at full detail (the page ships a thinned copy);
 * - a running job's charts and numbers refresh every minute without reloading the page;
 * - queued artifact analyses are polled, and the page reloads once they are done.
 * No inline script anywhere: the page's CSP forbids it.
 */
(function () {
  "use strict";

  var dataEl = document.getElementById("job-data");
  if (!dataEl) { return; }
  var page = JSON.parse(dataEl.textContent);
  var Plotly = window.Plotly;

  // No cloud: no "Share chart" / "Edit in Chart Studio" buttons and no plotly server to send figures to.
  var CONFIG = {
    responsive: true,
    displaylogo: false,
    scrollZoom: false,
    showSendToCloud: false,
    showEditInChartStudio: false,
    showLink: false,
    plotlyServerURL: "",
    modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d", "toggleSpikelines", "sendDataToCloud"]
  };
  var DETAIL_SHARE = 0.4;    // fetch full detail when the zoom shows less than this share of the job
  var ts = document.getElementById("timeseries");
  var heat = document.getElementById("heatmap");
  var status = document.getElementById("zoom-status");
  var fullFigures = { timeseries: page.timeseries, heatmap: page.heatmap };
  var fullRange = page.timeseries && page.timeseries.layout.xaxis.range
    ? page.timeseries.layout.xaxis.range.slice() : null;
  var syncing = false;
  var detailWindow = null;   // [startMs, endMs] whose detail data is drawn, or null for the whole job
  var detailTimer = null;
  var requestSeq = 0;

  function say(text) { if (status) { status.textContent = text; } }

  function draw(el, fig) {
    if (!el || !fig || !Plotly) { return Promise.resolve(); }
    var layout = Object.assign({}, fig.layout, { uirevision: "job", datarevision: Date.now() });
    return Plotly.react(el, fig.data, layout, CONFIG);
  }

  function toMs(v) {
    if (typeof v === "number") { return v; }
    // Plotly reports date ranges as "YYYY-MM-DD HH:MM:SS.sss" strings in UTC.
    var t = Date.parse(String(v).replace(" ", "T") + (String(v).indexOf("Z") < 0 ? "Z" : ""));
    return isNaN(t) ? null : t;
  }

  function rangeOf(ev) {
    if (ev["xaxis.autorange"]) { return "auto"; }
    if (ev["xaxis.range[0]"] !== undefined) { return [toMs(ev["xaxis.range[0]"]), toMs(ev["xaxis.range[1]"])]; }
    if (ev["xaxis.range"]) { return [toMs(ev["xaxis.range"][0]), toMs(ev["xaxis.range"][1])]; }
    return null;
  }

  function setRange(el, range) {
    if (!el || !el.layout) { return Promise.resolve(); }
    return Plotly.relayout(el, { "xaxis.range": range });
  }

  function showWholeJob() {
    detailWindow = null;
    var jobs = [draw(ts, fullFigures.timeseries), draw(heat, fullFigures.heatmap)];
    return Promise.all(jobs).then(function () {
      if (fullRange) {
        syncing = true;
        return Promise.all([setRange(ts, fullRange), setRange(heat, fullRange)]).then(function () { syncing = false; });
      }
    });
  }

  function pointsBudget() {
    var w = ts ? ts.clientWidth : 1000;
    return Math.max(300, Math.min(2000, Math.round(w || 1000)));
  }

  function figuresUrl(extra) {
    var url = page.refresh_url + "?points=" + pointsBudget();
    return extra ? url + "&" + extra : url;
  }

  function fetchJson(url) {
    return fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      });
  }

  function loadDetail(range) {
    var seq = ++requestSeq;
    var start = range[0] / 1000, end = range[1] / 1000;
    say("Loading detail for the zoomed window…");
    fetchJson(figuresUrl("start=" + start + "&end=" + end)).then(function (body) {
      if (seq !== requestSeq) { return; }
      detailWindow = range;
      return Promise.all([draw(ts, body.timeseries), draw(heat, body.heatmap)]).then(function () {
        say("Showing full detail for the zoomed window.");
      });
    }).catch(function (err) { say("Could not load detail: " + err.message); });
  }

  function onZoom(range) {
    if (detailTimer) { clearTimeout(detailTimer); }
    if (range === "auto") { showWholeJob(); say(""); return; }
    if (!fullRange || !range || range[0] === null) { return; }
    var share = (range[1] - range[0]) / (fullRange[1] - fullRange[0]);
    if (share < DETAIL_SHARE) {
      detailTimer = setTimeout(function () { loadDetail(range); }, 350);
    } else if (detailWindow) {
      // Zoomed back out past the detail window: the whole-job data is the right one again.
      var keep = range;
      Promise.all([draw(ts, fullFigures.timeseries), draw(heat, fullFigures.heatmap)]).then(function () {
        detailWindow = null;
        syncing = true;
        return Promise.all([setRange(ts, keep), setRange(heat, keep)]).then(function () { syncing = false; });
      });
    }
  }

  function link(source, target) {
    if (!source) { return; }
    source.on("plotly_relayout", function (ev) {
      if (syncing) { return; }
      var range = rangeOf(ev);
      if (range === null) { return; }
      syncing = true;
      var done = range === "auto" ? Promise.resolve() : setRange(target, range);
      Promise.resolve(done).then(function () { syncing = false; onZoom(range); });
    });
  }

  function zoomTo(startMs, endMs) {
    var pad = Math.max((endMs - startMs) * 0.08, 120000);
    var a = startMs - pad, b = endMs + pad;
    if (fullRange) { a = Math.max(a, fullRange[0]); b = Math.min(b, fullRange[1]); }
    var range = [a, b];
    syncing = true;
    return Promise.all([setRange(ts, range), setRange(heat, range)]).then(function () {
      syncing = false;
      onZoom(range);
    });
  }

  function initFindingButtons() {
    var buttons = document.querySelectorAll("button.zoom[data-start]");
    Array.prototype.forEach.call(buttons, function (btn) {
      btn.addEventListener("click", function () {
        Array.prototype.forEach.call(buttons, function (b) { b.setAttribute("aria-pressed", "false"); });
        btn.setAttribute("aria-pressed", "true");
        var start = Number(btn.getAttribute("data-start")), end = Number(btn.getAttribute("data-end"));
        zoomTo(start, end).then(function () {
          var item = btn.closest("li");
          var title = item ? item.querySelector("h3") : null;
          say("Charts zoomed to " + (title ? title.textContent.replace(/\s+/g, " ").trim() : "the finding") + ".");
          var charts = document.getElementById("charts");
          if (charts && charts.scrollIntoView) { charts.scrollIntoView({ behavior: "smooth", block: "start" }); }
        });
      });
    });
    var reset = document.getElementById("reset-zoom");
    if (reset) {
      reset.addEventListener("click", function () {
        Array.prototype.forEach.call(buttons, function (b) { b.setAttribute("aria-pressed", "false"); });
        showWholeJob().then(function () { say("Showing the whole job."); });
      });
    }
  }

  function plotArtifacts(root) {
    var figs = page.artifacts || {};
    Array.prototype.forEach.call(root.querySelectorAll("[data-figure]"), function (el) {
      if (el.getAttribute("data-plotted")) { return; }
      var fig = figs[el.getAttribute("data-figure")];
      if (!fig || el.offsetParent === null) { return; }  // hidden in a closed <details>: drawn on open
      el.setAttribute("data-plotted", "1");
      draw(el, fig);
    });
  }

  function initArtifacts() {
    plotArtifacts(document);
    Array.prototype.forEach.call(document.querySelectorAll("details[data-artifact]"), function (d) {
      d.addEventListener("toggle", function () { if (d.open) { plotArtifacts(d); } });
    });
  }

  function updateNumbers(body) {
    var kpis = body.kpis || {};
    Object.keys(kpis).forEach(function (key) {
      Array.prototype.forEach.call(document.querySelectorAll('[data-kpi="' + key + '"]'), function (el) {
        el.textContent = kpis[key];
      });
    });
    var ratios = body.ratios || {};
    Object.keys(ratios).forEach(function (key) {
      var bar = document.querySelector('[data-bar="' + key + '"]');
      if (bar && typeof ratios[key] === "number") { bar.setAttribute("width", String(Math.round(ratios[key] * 100))); }
    });
    var verdict = document.querySelector('[data-field="verdict"]');
    if (verdict && body.verdict) { verdict.textContent = body.verdict; }
    var until = document.querySelector('[data-field="data_until"]');
    if (until && body.data_until) { until.textContent = body.data_until.slice(0, 16).replace("T", " "); }
  }

  function refresh() {
    var extra = detailWindow ? "start=" + detailWindow[0] / 1000 + "&end=" + detailWindow[1] / 1000 : "";
    return fetchJson(figuresUrl(extra)).then(function (body) {
      updateNumbers(body);
      if (!detailWindow) {
        fullFigures = { timeseries: body.timeseries, heatmap: body.heatmap };
        if (body.timeseries && body.timeseries.layout.xaxis.range) {
          fullRange = body.timeseries.layout.xaxis.range.slice();
        }
      }
      if (!body.running && refreshTimer) {
        clearInterval(refreshTimer);
        say("The job has ended; reload the page for its final numbers and findings.");
      }
      return Promise.all([draw(ts, body.timeseries), draw(heat, body.heatmap)]);
    }).catch(function () { /* keep the last data; the next tick retries */ });
  }

  var refreshTimer = null;
  var artifactTimer = null;

  function watchArtifacts() {
    var pending = page.pending_artifacts || [];
    if (!pending.length) { return; }
    var tries = 0;
    artifactTimer = setInterval(function () {
      if (++tries > 120) { clearInterval(artifactTimer); return; }
      fetchJson(page.refresh_url + "?only=status").then(function (body) {
        var done = (body.artifacts || []).some(function (a) {
          return pending.indexOf(a.id) >= 0 && (a.status === "done" || a.status === "failed");
        });
        if (done) { clearInterval(artifactTimer); window.location.reload(); }
      }).catch(function () {});
    }, 5000);
  }

  function start() {
    initFindingButtons();
    watchArtifacts();
    if (!Plotly) { say("The chart library did not load."); return; }
    Promise.all([draw(ts, page.timeseries), draw(heat, page.heatmap)]).then(function () {
      link(ts, heat);
      link(heat, ts);
      if (ts) { ts.setAttribute("data-ready", "1"); }
      document.body.setAttribute("data-charts-ready", "1");
    });
    initArtifacts();
    if (page.running) { refreshTimer = setInterval(refresh, (page.refresh_s || 60) * 1000); }
    // For the browser tests and for debugging from the console.
    window.jobPage = { refresh: refresh, zoomTo: zoomTo, showWholeJob: showWholeJob };
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
