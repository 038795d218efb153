#!/usr/bin/env bash
# Rebuild static/vendor/plotly.min.js (and its licence notices) from the pinned npm packages in
# package-lock.json: plotly.js core + the trace types in entry.js, minified by esbuild into one IIFE that
# sets window.Plotly. Run from anywhere: `make plotly-bundle` or `static/vendor/plotly-bundle/build.sh`.
# Needs node and npm (plotly.js 4 asks for node >= 22; node 20 builds it too, with an engine warning).
# The first line, `//# allFunctionsCalledOnLoad`, is V8's explicit compile hint (Chrome 136+; other engines
# read a comment): compile every function eagerly on the background thread that streams the script in,
# instead of lazily on the main thread at each function's first call. The page calls most of plotly on its
# first draw; the job page's cold load spent 150-250 ms less main-thread CPU (benchmarks/cold_load.py).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$here/package.json" "$here/package-lock.json" "$here/entry.js" "$work/"
cd "$work"
npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
version="$(node -p "require('plotly.js/package.json').version")"
traces="$(grep -o "lib/[a-z0-9]*'" entry.js | grep -v core | sed "s/lib\///; s/'//" | paste -sd, -)"
npx esbuild entry.js --bundle --minify --format=iife --global-name=Plotly --target=es2016 \
  --define:global=window --define:define.amd=false --legal-comments=external --log-level=warning \
  --banner:js="//# allFunctionsCalledOnLoad
/* plotly.js v$version partial bundle: scatter (core), $traces. Copyright 2012-2026 Plotly, Inc. MIT license (LICENSE.plotly.txt). Built by static/vendor/plotly-bundle/build.sh. */" \
  --outfile="$work/plotly.min.js"
mkdir -p "$out"
cp "$work/plotly.min.js" "$out/plotly.min.js"
cp "$work/plotly.min.js.LEGAL.txt" "$out/plotly.min.js.LEGAL.txt"
cp node_modules/plotly.js/LICENSE "$out/LICENSE.plotly.txt"
echo "static/vendor/plotly.min.js: plotly.js $version with scatter, $traces ($(wc -c < "$out/plotly.min.js") bytes)"
