/* Comparison page: draws the figures the server built (json_script "compare-data") with plotly.js:
 * the two runs' signals on one relative time axis, and their per-GPU means. No inline script anywhere:
 * the page's CSP forbids it. */
(function () {
  "use strict";

  var dataEl = document.getElementById("compare-data");
  if (!dataEl) { return; }
  var page = JSON.parse(dataEl.textContent);
  var Plotly = window.Plotly;
  var CONFIG = {
    responsive: true,
    displaylogo: false,
    scrollZoom: false,
    modeBarButtonsToRemove: ["select2d", "lasso2d", "autoScale2d", "toggleSpikelines"]
  };

  function draw(id, fig) {
    var el = document.getElementById(id);
    if (!el || !fig || !Plotly) { return Promise.resolve(); }
    return Plotly.newPlot(el, fig.data, fig.layout, CONFIG);
  }

  var figures = page.figures || {};
  Promise.all([draw("overlay", figures.overlay), draw("per-gpu-plot", figures.per_gpu)]).then(function () {
    document.body.setAttribute("data-charts-ready", "1");
  });
})();
