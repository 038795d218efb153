// The plotly.js partial bundle served as static/vendor/plotly.min.js: the core (scatter, shapes,
// annotations, date axes, the modebar) and only the other trace types jobs/charts/ builds.
// Adding a trace type to jobs/charts/ means adding it here and running `make plotly-bundle`
// (tests/test_static_bundle.py fails until then).
'use strict';

var Plotly = require('plotly.js/lib/core');

Plotly.register([
    require('plotly.js/lib/bar'),
    require('plotly.js/lib/heatmap'),
    require('plotly.js/lib/icicle'),
]);

module.exports = Plotly;
