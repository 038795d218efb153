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
  var Plotly = null;  // window.Plotly once plotly.js (loaded async) has run: see whenPlotly

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
    var data = fig.data;
    var legends = el === ts && layout.showlegend ? legendRows(fig) : null;
    var scale = colourScaleOf(fig);
    if (scale) {
      // Plotly's colour bar is a second axis whose size moves the margins, which makes plotly lay the
      // heatmap out twice (about a third of its first draw): the same scale is drawn in HTML in a fixed
      // right margin instead.
      data = [Object.assign({}, data[0], { showscale: false })].concat(data.slice(1));
      layout.margin = Object.assign({}, layout.margin, { r: ((layout.margin && layout.margin.r) || 0) + SCALE_WIDTH });
    }
    if (legends) {
      // Plotly's own legends (one per subplot) took about half of the time series' first draw: the same
      // legends are drawn as HTML over the chart instead, and a click still hides/shows a line and its range.
      layout.showlegend = false;
      data = data.map(function (t) {
        return hiddenGroups[t.legendgroup] ? Object.assign({}, t, { visible: false }) : t;
      });
    }
    return Plotly.react(el, data, layout, CONFIG).then(function () {
      if (legends) { drawLegends(el, legends); }
      if (scale) { drawColourScale(el, scale); }
    });
  }

  // ---- the heatmap's colour scale, drawn in HTML at the right of the plot ---------------------------
  var SCALE_WIDTH = 62;  // px added to the right margin for it: bar, tick labels, vertical title

  function colourScaleOf(fig) {
    var t = fig && fig.data && fig.data[0];
    if (!t || t.type !== "heatmap" || t.showscale === false || !t.colorbar) { return null; }
    return { title: (t.colorbar.title && t.colorbar.title.text) || "", zmin: t.zmin, zmax: t.zmax };
  }

  function scaleTicks(zmin, zmax) {
    var span = zmax - zmin, step = span <= 50 ? 10 : 20, ticks = [];
    for (var v = Math.ceil(zmin / step) * step; v <= zmax + 1e-9; v += step) { ticks.push(v); }
    return ticks;
  }

  function drawColourScale(el, scale) {
    var box = el.parentNode;
    var full = el._fullLayout, trace = el._fullData && el._fullData[0];
    var size = full && full._size;
    Array.prototype.forEach.call(box.querySelectorAll(".html-scale"), function (old) { box.removeChild(old); });
    if (!size || !trace || !trace.colorscale || !(scale.zmax > scale.zmin)) { return; }
    if (window.getComputedStyle(box).position === "static") { box.style.position = "relative"; }
    var lo = trace.zmin !== undefined ? trace.zmin : scale.zmin, hi = trace.zmax !== undefined ? trace.zmax : scale.zmax;
    var div = document.createElement("div");
    div.className = "html-scale";
    div.setAttribute("role", "img");
    div.setAttribute("aria-label", "Colour scale of " + scale.title + ": darkest " + lo + ", lightest " + hi);
    var s = div.style;
    s.position = "absolute";
    // Anchored to the plot's right edge, so a resize of the page (plotly redraws responsively) keeps it there.
    s.right = (box.clientWidth - el.offsetLeft - el.offsetWidth + 4) + "px";
    s.top = (el.offsetTop + size.t) + "px";
    s.height = size.h + "px";
    s.width = (SCALE_WIDTH - 8) + "px";
    s.fontFamily = (full.font && full.font.family) || "sans-serif";
    s.fontSize = "11px";
    s.color = (full.font && full.font.color) || "#1b1f24";
    s.pointerEvents = "none";
    var bar = document.createElement("div");
    bar.style.position = "absolute"; bar.style.left = "0"; bar.style.top = "0"; bar.style.bottom = "0"; bar.style.width = "12px";
    bar.style.background = "linear-gradient(to top, " + trace.colorscale.map(function (stop) {
      return stop[1] + " " + (stop[0] * 100).toFixed(1) + "%";
    }).join(", ") + ")";
    div.appendChild(bar);
    scaleTicks(lo, hi).forEach(function (v) {
      var label = document.createElement("span");
      label.textContent = String(v);
      label.style.position = "absolute"; label.style.left = "15px"; label.style.lineHeight = "11px";
      label.style.bottom = ((v - lo) / (hi - lo) * size.h - 5.5) + "px";
      div.appendChild(label);
    });
    var title = document.createElement("span");
    title.textContent = scale.title;
    title.style.position = "absolute"; title.style.right = "0"; title.style.top = "50%";
    title.style.writingMode = "vertical-rl"; title.style.transform = "translateY(-50%)"; title.style.whiteSpace = "nowrap";
    div.appendChild(title);
    box.appendChild(div);
  }

  // ---- HTML legends of the time series: one per subplot, where plotly would put its own --------------
  var hiddenGroups = {};  // legendgroup (signal key) -> true while its line is hidden by a legend click
  var DASHES = { dot: "2,2", dash: "5,3", dashdot: "5,2,1.5,2", longdash: "8,3", longdashdot: "8,2,1.5,2" };

  function legendRows(fig) {
    var rows = [];
    Object.keys(fig.layout).forEach(function (key) {
      var m = /^legend(\d*)$/.exec(key);
      if (m) { rows.push({ id: key, spec: fig.layout[key], items: [] }); }
    });
    var byId = {};
    rows.forEach(function (r) { byId[r.id] = r; });
    fig.data.forEach(function (t) {
      var row = byId[t.legend || "legend"];
      if (row && t.showlegend !== false) {
        row.items.push({ group: t.legendgroup, name: t.name, colour: t.line && t.line.color, dash: t.line && t.line.dash });
      }
    });
    return rows;
  }

  function legendTitle(text) {
    var span = document.createElement("span");
    var m = /^<b>([\s\S]*?)<\/b>([\s\S]*)$/.exec(text || "");
    var b = document.createElement("b");
    b.textContent = m ? m[1] : String(text || "").replace(/<[^>]*>/g, "");
    span.appendChild(b);
    if (m && m[2]) { span.appendChild(document.createTextNode(m[2])); }
    span.style.marginRight = "8px";
    return span;
  }

  function swatch(colour, dash) {
    var ns = "http://www.w3.org/2000/svg";
    var svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", "26"); svg.setAttribute("height", "10"); svg.setAttribute("aria-hidden", "true");
    var line = document.createElementNS(ns, "line");
    line.setAttribute("x1", "1"); line.setAttribute("x2", "25"); line.setAttribute("y1", "5"); line.setAttribute("y2", "5");
    line.setAttribute("stroke", colour || "#444"); line.setAttribute("stroke-width", "2");
    if (DASHES[dash]) { line.setAttribute("stroke-dasharray", DASHES[dash]); }
    svg.appendChild(line);
    svg.style.verticalAlign = "middle";
    svg.style.marginRight = "3px";
    return svg;
  }

  function toggleGroup(group) {
    hiddenGroups[group] = !hiddenGroups[group];
    var idx = [];
    (ts.data || []).forEach(function (t, i) { if (t.legendgroup === group) { idx.push(i); } });
    Array.prototype.forEach.call(ts.parentNode.querySelectorAll(".html-legend button"), function (b) {
      if (b.getAttribute("data-group") === group) {
        b.setAttribute("aria-pressed", hiddenGroups[group] ? "false" : "true");
        b.style.opacity = hiddenGroups[group] ? "0.45" : "1";
      }
    });
    return idx.length ? Plotly.restyle(ts, { visible: hiddenGroups[group] ? false : true }, idx) : Promise.resolve();
  }

  function drawLegends(el, rows) {
    var box = el.parentNode;
    var size = el._fullLayout && el._fullLayout._size;
    if (!box || !size) { return; }
    if (window.getComputedStyle(box).position === "static") { box.style.position = "relative"; }
    Array.prototype.forEach.call(box.querySelectorAll(".html-legend"), function (old) { box.removeChild(old); });
    var font = (el._fullLayout.font && el._fullLayout.font.family) || "sans-serif";
    // Read once: reading them after each legend is appended would lay the page out again per legend.
    var left = el.offsetLeft, top = el.offsetTop;
    rows.forEach(function (row) {
      if (!row.items.length && !(row.spec.title && row.spec.title.text)) { return; }
      var div = document.createElement("div");
      div.className = "html-legend";
      div.setAttribute("role", "group");
      div.setAttribute("aria-label", "Legend: " + String((row.spec.title && row.spec.title.text) || "").replace(/<[^>]*>/g, ""));
      var s = div.style;
      s.position = "absolute";
      s.left = (left + size.l + (row.spec.x || 0) * size.w) + "px";
      s.top = (top + size.t + (1 - (row.spec.y === undefined ? 1 : row.spec.y)) * size.h) + "px";
      s.transform = "translateY(-100%)";
      s.fontFamily = font; s.fontSize = "11px"; s.lineHeight = "16px";
      s.padding = "1px 4px"; s.background = row.spec.bgcolor || "rgba(255,255,255,0.85)";
      s.maxWidth = size.w + "px";
      s.pointerEvents = "none";
      div.appendChild(legendTitle(row.spec.title && row.spec.title.text));
      row.items.forEach(function (item) {
        var b = document.createElement("button");
        b.type = "button";
        b.setAttribute("data-group", item.group);
        b.setAttribute("aria-pressed", hiddenGroups[item.group] ? "false" : "true");
        b.title = "Hide or show this line";
        var bs = b.style;
        bs.font = "inherit"; bs.background = "none"; bs.border = "0"; bs.padding = "0 8px 0 0"; bs.margin = "0";
        bs.cursor = "pointer"; bs.color = "inherit"; bs.pointerEvents = "auto";
        bs.opacity = hiddenGroups[item.group] ? "0.45" : "1";
        b.appendChild(swatch(item.colour, item.dash));
        b.appendChild(document.createTextNode(item.name));
        b.addEventListener("click", function () { toggleGroup(item.group); });
        div.appendChild(b);
      });
      box.appendChild(div);
    });
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
    // A copy: Plotly rewrites the array it is given (as date strings), which would corrupt ours.
    return Plotly.relayout(el, { "xaxis.range": range.slice() });
  }

  function showWholeJob() {
    detailWindow = null;
    ++requestSeq;  // a detail answer still on its way must not redraw (or say "zoomed") after this
    if (detailTimer) { clearTimeout(detailTimer); detailTimer = null; }
    var jobs = [draw(ts, fullFigures.timeseries), draw(heat, fullFigures.heatmap)];
    return Promise.all(jobs).then(function () {
      if (fullRange) {
        syncing = true;
        return Promise.all([setRange(ts, fullRange), setRange(heat, fullRange)]).then(function () {
          syncing = false;
          return redrawBands(fullRange);
        });
      }
    });
  }

  // ---- finding bands, shaded again at every zoom at the zoom's own resolution ----------------------
  var BAND_LIMIT = 240;  // rectangles in all (as jobs.charts.MAX_SHAPES)
  var bands = page.finding_bands || [];

  function mergeWindows(windows, gap, limit) {
    var clean = windows.slice().sort(function (a, b) { return a[0] - b[0]; });
    for (;;) {
      var merged = [];
      clean.forEach(function (w) {
        var last = merged[merged.length - 1];
        if (last && w[0] - last[1] <= gap) { last[1] = Math.max(last[1], w[1]); } else { merged.push([w[0], w[1]]); }
      });
      if (merged.length <= limit || !merged.length) { return merged; }
      gap = Math.max(gap * 2, 1000);
    }
  }

  function bandShapes(range) {
    var span = range[1] - range[0];
    var pixel = span / pointsBudget();
    var per = Math.max(1, Math.floor(BAND_LIMIT / Math.max(1, bands.length)));
    var shapes = [], labels = [];
    bands.forEach(function (band) {
      if (band.whole) { return; }
      var inside = band.windows.filter(function (w) { return w[1] >= range[0] && w[0] <= range[1]; });
      var merged = mergeWindows(inside, pixel, per);
      merged.forEach(function (w) {
        var x0 = w[0], x1 = w[1];
        if (x1 - x0 < pixel) { var mid = (x0 + x1) / 2; x0 = mid - pixel / 2; x1 = mid + pixel / 2; }
        shapes.push({ type: "rect", xref: "x", yref: "paper", x0: x0, x1: x1, y0: 0, y1: 1, fillcolor: band.colour,
          opacity: 0.14, line: { width: 0 }, layer: "below", name: "finding:" + band.code });
      });
      if (merged.length) {
        labels.push({ x: Math.max(merged[0][0], range[0]), xref: "x", y: 1.0, yref: "paper", yanchor: "bottom", yshift: 22,
          xanchor: "left", text: "<b>" + band.number + "</b>", showarrow: false,
          font: { color: band.font, size: 11 }, bgcolor: band.colour, borderpad: 2, name: "finding:" + band.code });
      }
    });
    return { shapes: shapes, labels: labels };
  }

  function isBand(item) { return String(item.name || "").indexOf("finding:") === 0; }

  function redrawBands(range) {
    if (!ts || !ts.layout || !range || !bands.length) { return Promise.resolve(); }
    var drawn = bandShapes(range);
    var shapes = (ts.layout.shapes || []).filter(function (s) { return !isBand(s); }).concat(drawn.shapes);
    var notes = (ts.layout.annotations || []).filter(function (a) { return !isBand(a); }).concat(drawn.labels);
    syncing = true;
    return Plotly.relayout(ts, { shapes: shapes, annotations: notes }).then(function () {
      syncing = false;
      ts.setAttribute("data-bands", String(drawn.shapes.length));
    });
  }

  // ---- the time range in the address: ?from=&to= (UTC), ?last=1h|6h|24h, ?finding=CODE -------------
  var LAST = { "1h": 3600e3, "6h": 6 * 3600e3, "24h": 24 * 3600e3 };
  var nextParams = null;  // what the zoom about to happen should write (a preset or a finding)

  function iso(ms) { return new Date(Math.round(ms / 1000) * 1000).toISOString().replace(".000Z", "Z"); }

  function parseTime(text) {
    if (!text) { return null; }
    if (/^\d+(\.\d+)?$/.test(text)) { return Number(text) * 1000; }  // Unix seconds
    text = text.trim().replace(" ", "T");
    var t = Date.parse(/Z|[+-]\d\d:?\d\d$/.test(text) ? text : text + "Z");  // no zone: UTC
    return isNaN(t) ? null : t;
  }

  function writeUrl(params) {
    if (!window.history || !window.history.replaceState) { return; }
    var url = new URL(window.location.href);
    ["from", "to", "last", "finding"].forEach(function (k) { url.searchParams.delete(k); });
    Object.keys(params || {}).forEach(function (k) { url.searchParams.set(k, params[k]); });
    window.history.replaceState(null, "", url.pathname + url.search + url.hash);
  }

  function clampRange(range) {
    if (!fullRange) { return range; }
    var a = Math.max(range[0], fullRange[0]), b = Math.min(range[1], fullRange[1]);
    return b > a ? [a, b] : null;
  }

  function showRange(range, params) {
    range = clampRange(range);
    if (!range) { say("That range is outside the job."); return Promise.resolve(); }
    nextParams = params;
    syncing = true;
    return Promise.all([setRange(ts, range), setRange(heat, range)]).then(function () {
      syncing = false;
      onZoom(range);
    });
  }

  function fillCustom(range) {
    var from = document.getElementById("range-from"), to = document.getElementById("range-to");
    if (!from || !to) { return; }
    // 24-hour ISO in UTC, as the label says (a datetime-local input showed the browser's "12:08:00 AM").
    from.value = range ? iso(range[0]).slice(0, 19).replace("T", " ") : "";
    to.value = range ? iso(range[1]).slice(0, 19).replace("T", " ") : "";
  }

  function rangeFromUrl() {
    var q = new URL(window.location.href).searchParams;
    if (q.get("finding")) {
      var btn = document.querySelector('button.zoom[data-code="' + CSS.escape(q.get("finding")) + '"]');
      return btn ? { finding: btn } : null;
    }
    if (q.get("last") && LAST[q.get("last")] && fullRange) {
      return { range: [fullRange[1] - LAST[q.get("last")], fullRange[1]], params: { last: q.get("last") } };
    }
    var a = parseTime(q.get("from")), b = parseTime(q.get("to"));
    if (a !== null && b !== null && b > a) { return { range: [a, b], params: { from: iso(a), to: iso(b) } }; }
    return null;
  }

  function applyUrlRange() {
    var wanted = rangeFromUrl();
    if (!wanted) { return Promise.resolve(); }
    if (wanted.finding) { wanted.finding.click(); return Promise.resolve(); }
    return showRange(wanted.range, wanted.params);
  }

  function currentRange() {
    var r = ts && ts._fullLayout && ts._fullLayout.xaxis && ts._fullLayout.xaxis.range;
    return r ? [toMs(r[0]), toMs(r[1])] : (fullRange ? fullRange.slice() : null);
  }

  function initKeyboard() {
    if (!ts) { return; }
    ts.addEventListener("keydown", function (ev) {
      var r = currentRange();
      if (!r || !fullRange) { return; }
      var span = r[1] - r[0], mid = (r[0] + r[1]) / 2, next = null;
      if (ev.key === "+" || ev.key === "=") { next = [mid - span / 4, mid + span / 4]; }
      else if (ev.key === "-" || ev.key === "_") { next = [mid - span, mid + span]; }
      else if (ev.key === "ArrowLeft") { next = [r[0] - span / 4, r[1] - span / 4]; }
      else if (ev.key === "ArrowRight") { next = [r[0] + span / 4, r[1] + span / 4]; }
      else if (ev.key === "0" || ev.key === "Home") {
        ev.preventDefault();
        writeUrl(null);
        showWholeJob().then(function () { say("Showing the whole job."); });
        return;
      } else { return; }
      ev.preventDefault();
      if (next[0] < fullRange[0]) { next = [fullRange[0], fullRange[0] + (next[1] - next[0])]; }
      if (next[1] > fullRange[1]) { next = [fullRange[1] - (next[1] - next[0]), fullRange[1]]; }
      showRange(next, null);
    });
  }

  function initRangeTools() {
    Array.prototype.forEach.call(document.querySelectorAll("#range-tools [data-range]"), function (btn) {
      var kind = btn.getAttribute("data-range");
      if (kind === "whole") { return; }  // the reset button (initFindingButtons)
      btn.addEventListener("click", function () {
        if (!fullRange) { return; }
        showRange([fullRange[1] - LAST[kind], fullRange[1]], { last: kind }).then(function () {
          say("Showing the last " + kind.replace("h", " h") + " of the job.");
        });
      });
    });
    var form = document.getElementById("custom-range");
    if (form) {
      form.addEventListener("submit", function (ev) {
        ev.preventDefault();
        var a = parseTime(document.getElementById("range-from").value);
        var b = parseTime(document.getElementById("range-to").value);
        if (a === null || b === null || b <= a) { say("Give a start and a later end (UTC)."); return; }
        showRange([a, b], { from: iso(a), to: iso(b) });
      });
    }
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
        return redrawBands(range);
      }).then(function () {
        say("Showing full detail for the zoomed window.");
      });
    }).catch(function (err) { say("Could not load detail: " + err.message); });
  }

  function onZoom(range) {
    if (detailTimer) { clearTimeout(detailTimer); }
    if (range === "auto") {
      nextParams = null;
      writeUrl(null);
      fillCustom(null);
      showWholeJob().then(function () { say("Showing the whole job."); });
      return;
    }
    if (!fullRange || !range || range[0] === null) { return; }
    if (!nextParams && range[0] <= fullRange[0] + 1000 && range[1] >= fullRange[1] - 1000) {
      // Double-click (Plotly resets to the initial range) or a zoom out to the whole job.
      writeUrl(null);
      fillCustom(null);
      (detailWindow ? showWholeJob() : redrawBands(fullRange)).then(function () { say("Showing the whole job."); });
      return;
    }
    writeUrl(nextParams || { from: iso(range[0]), to: iso(range[1]) });
    nextParams = null;
    fillCustom(range);
    redrawBands(range);
    var share = (range[1] - range[0]) / (fullRange[1] - fullRange[0]);
    if (share < DETAIL_SHARE) {
      detailTimer = setTimeout(function () { loadDetail(range); }, 350);
    } else if (detailWindow) {
      // Zoomed back out past the detail window: the whole-job data is the right one again.
      var keep = range;
      ++requestSeq;
      Promise.all([draw(ts, fullFigures.timeseries), draw(heat, fullFigures.heatmap)]).then(function () {
        detailWindow = null;
        syncing = true;
        return Promise.all([setRange(ts, keep), setRange(heat, keep)]).then(function () {
          syncing = false;
          return redrawBands(keep);
        });
      });
      say("Zoomed in; the whole job's data is shown at this width.");
    } else {
      say("Zoomed in; the whole job's data is shown at this width.");
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

  function zoomTo(startMs, endMs, params) {
    var pad = Math.max((endMs - startMs) * 0.08, 120000);
    return showRange([startMs - pad, endMs + pad], params);
  }

  function initFindingButtons() {
    var buttons = document.querySelectorAll("button.zoom[data-start]");
    Array.prototype.forEach.call(buttons, function (btn) {
      btn.addEventListener("click", function () {
        Array.prototype.forEach.call(buttons, function (b) { b.setAttribute("aria-pressed", "false"); });
        btn.setAttribute("aria-pressed", "true");
        var start = Number(btn.getAttribute("data-start")), end = Number(btn.getAttribute("data-end"));
        zoomTo(start, end, { finding: btn.getAttribute("data-code") }).then(function () {
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
        writeUrl(null);
        fillCustom(null);
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

  // The stamp of the roofline figure drawn (jobs.views.page_json.figure_stamp): the refresh answers with a
  // new figure only when the job's roofline changed since.
  var rooflineStamp = page.roofline_stamp || "";

  function redrawRoofline(update) {
    if (!update) { return null; }
    rooflineStamp = update.stamp;
    page.roofline = update.figure;
    var el = document.getElementById("roofline");
    if (!el) { return null; }  // the page had no roofline figure when it was rendered: shown on reload
    if (!update.figure) { if (Plotly) { Plotly.purge(el); } return null; }
    return draw(el, update.figure);
  }

  function refresh() {
    var extra = detailWindow ? "start=" + detailWindow[0] / 1000 + "&end=" + detailWindow[1] / 1000 : "";
    extra = (extra ? extra + "&" : "") + "roofline=" + encodeURIComponent(rooflineStamp);
    return fetchJson(figuresUrl(extra)).then(function (body) {
      updateNumbers(body);
      redrawRoofline(body.roofline);
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
      return Promise.all([draw(ts, body.timeseries), draw(heat, body.heatmap)]).then(function () {
        var shown = ts && ts.layout && ts.layout.xaxis && ts.layout.xaxis.range;
        return shown ? redrawBands([toMs(shown[0]), toMs(shown[1])]) : null;
      });
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

  // plotly.js is loaded async (job_detail.html): it may have run before this script or may still be on its
  // way; `fn` runs once it has run, or once it failed to load.
  function whenPlotly(fn) {
    var tag = document.getElementById("plotly-js");
    if (window.Plotly || !tag) { fn(); return; }
    tag.addEventListener("load", fn);
    tag.addEventListener("error", fn);
  }

  // ---- one GPU over time: a line of the chosen heatmap row against the median row ---------------------
  function plainText(label) {
    // Heatmap labels are HTML-escaped for plotly (jobs.charts.escape); the select shows them as text.
    return new DOMParser().parseFromString(String(label), "text/html").documentElement.textContent;
  }

  function median(values) {
    var v = values.filter(function (x) { return x !== null && x !== undefined && !isNaN(x); })
      .sort(function (a, b) { return a - b; });
    if (!v.length) { return null; }
    var m = Math.floor(v.length / 2);
    return v.length % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
  }

  function initGpuLine() {
    var tools = document.getElementById("gpu-line-tools");
    var select = document.getElementById("gpu-line-select");
    var figure = document.getElementById("gpu-line-figure");
    var plot = document.getElementById("gpu-line");
    var t = heat && heat.data && heat.data[0];
    if (!tools || !select || !plot || !t || !t.z || !t.y) { return; }
    t.y.forEach(function (label, i) {
      var option = document.createElement("option");
      option.value = String(i);
      option.textContent = plainText(label);
      select.appendChild(option);
    });
    var medians = null;
    tools.hidden = false;
    select.addEventListener("change", function () {
      if (select.value === "") { figure.hidden = true; return; }
      var row = t.z[Number(select.value)];
      if (!medians) {
        medians = t.x.map(function (_, j) { return median(t.z.map(function (r) { return r[j]; })); });
      }
      figure.hidden = false;
      Plotly.react(plot, [
        { type: "scatter", mode: "lines", x: t.x, y: row, name: select.options[select.selectedIndex].textContent,
          line: { width: 1.5 } },
        { type: "scatter", mode: "lines", x: t.x, y: medians, name: "median of all GPUs",
          line: { width: 1, dash: "dash", color: "#6e7781" } }
      ], {
        height: 220, margin: { l: 50, r: 16, t: 10, b: 40 }, showlegend: true,
        legend: { orientation: "h", y: 1.15 },
        xaxis: { type: "date", range: heat.layout.xaxis.range },
        yaxis: { title: { text: "%" }, rangemode: "tozero" }
      }, CONFIG);
    });
  }

  function start() {
    initFindingButtons();
    watchArtifacts();
    whenPlotly(startCharts);
  }

  function startCharts() {
    Plotly = window.Plotly || null;
    if (!Plotly) { say("The chart library did not load."); return; }
    initRangeTools();
    initKeyboard();
    // The time series first (it is the first chart on the page), the heatmap below it in a later task, so
    // the browser paints the first chart before it spends time on the second.
    draw(ts, page.timeseries).then(function () {
      document.body.setAttribute("data-first-chart", "1");
      return new Promise(function (resolve) {
        window.requestAnimationFrame(function () { setTimeout(resolve, 0); });
      });
    }).then(function () {
      return draw(heat, page.heatmap);
    }).then(function () {
      initGpuLine();
    }).then(function () {
      // The roofline (built by jobs.charts.roofline): no time axis, so not linked to the zoom.
      return draw(document.getElementById("roofline"), page.roofline);
    }).then(function () {
      link(ts, heat);
      link(heat, ts);
      return applyUrlRange();
    }).then(function () {
      if (ts) { ts.setAttribute("data-ready", "1"); }
      document.body.setAttribute("data-charts-ready", "1");
    });
    initArtifacts();
    if (page.running) { refreshTimer = setInterval(refresh, (page.refresh_s || 60) * 1000); }
    // For the browser tests and for debugging from the console.
    window.jobPage = { refresh: refresh, zoomTo: zoomTo, showWholeJob: showWholeJob, showRange: showRange };
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
