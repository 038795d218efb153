"""A serving engine's own FLOP and byte counters (vLLM / SGLang `--enable-mfu-metrics`), read for a job.

Pure: no Django and no HTTP. The registry's `ENGINE_SIGNALS` (jobs.metrics.signals, which also documents
names, types, units and sources) are read with the same PromQL as the DCGM fields
(`jobs.metrics.signal_queries.fetch_job_signals`: `rate()` of each counter over the rate window, then
mean/min/max/count across the job's engine series, told apart by `stat`), so a counter reset (a restarted
server) is handled by rate() and a missing counter is missing with its reason, never 0.

The join is the job's *label selector* (`Job.selector`, e.g. `{"namespace": "llm", "pod": "vllm-7b-0"}`):
the engine's own labels (`model_name`, `engine`) name no job, so its series are found through the target
labels its scrape adds (a ServiceMonitor/PodMonitor adds `namespace` and `pod`). A job registered with an
explicit GPU list has no such label: its engine signals are missing with `NOT_JOINABLE`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jobs.metrics.promql import Selector, regex_any
from jobs.metrics.sampling import DEFAULT_SCRAPE_INTERVAL_S
from jobs.metrics.sampling import rate_window_s as _rate_window
from jobs.metrics.signal_queries import RangeClient, aggregate_query, missing_reason, stats_from_series
from jobs.metrics.signals import COUNT, ENGINE_METRICS, ENGINE_SIGNALS, JobSignals, SignalSeries, grid

#: The engine presence look-up's names (exact, escaped).
ENGINE_NAME_REGEX = regex_any(sorted(ENGINE_METRICS))

NOT_JOINABLE = (
    "not joined: the job lists its GPUs explicitly, and a serving engine's series carry no GPU or host "
    "label, only the pod/namespace labels its scrape adds; register the job with a label selector "
    "(namespace, pod) to read the engine's own FLOPs"
)


def fetch_engine_signals(
    client: RangeClient,
    labels: Mapping[str, Any] | None,
    start: float,
    end: float,
    step: float,
    *,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
    rate_window_s: float | None = None,
) -> tuple[dict[str, SignalSeries], dict[str, str]]:
    """The job's engine signals on the grid of `step` (1 presence query, then 1 range query per present
    counter) and the missing ones with their reason; `labels` is the job's label selector (None or empty:
    nothing to join on, every engine signal missing with NOT_JOINABLE)."""
    if not labels:
        return {}, dict.fromkeys(ENGINE_SIGNALS, NOT_JOINABLE)
    selector = Selector.from_labels(labels)
    window = max(rate_window_s or _rate_window(step, scrape_interval_s), step)
    present = set(client.label_values("__name__", selector.series_selectors(ENGINE_NAME_REGEX), start, end))
    ts = grid(start, end, step)
    series: dict[str, SignalSeries] = {}
    missing: dict[str, str] = {}
    for key, sig in ENGINE_SIGNALS.items():
        names = [m for m in sig.metrics if m in present]
        if not names:
            missing[key] = missing_reason(sig, False)
            continue
        query = aggregate_query(
            sig, selector, window, step_s=step, scrape_interval_s=scrape_interval_s, metrics=names
        )
        stats = stats_from_series(client.range(query, start, end, step), ts)
        if COUNT not in stats or np.isnan(stats[COUNT]).all():
            missing[key] = missing_reason(sig, True)
            continue
        series[key] = SignalSeries(key, sig.unit, ts, stats)
    return series, missing


def add_engine_signals(
    js: JobSignals, series: Mapping[str, SignalSeries], missing: Mapping[str, str]
) -> None:
    """Put engine signals into a job's JobSignals (same grid) beside its GPU signals."""
    for key, s in series.items():
        if s.timestamps.shape != js.timestamps.shape:
            raise ValueError(f"{key}: engine series on another grid than the job's signals")
        js.signals[key] = s
    js.missing.update({k: v for k, v in missing.items() if k not in js.signals})


def attach_engine_signals(
    client: RangeClient,
    js: JobSignals,
    labels: Mapping[str, Any] | None,
    *,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
) -> JobSignals:
    """Read the engine signals of the job selected by `labels` on `js`'s grid into `js` (a per-job poll's
    or a finalize's one call after reading the GPU signals)."""
    end = float(js.timestamps[-1]) if js.timestamps.size else js.end
    series, missing = fetch_engine_signals(
        client, labels, js.start, end, js.step, scrape_interval_s=scrape_interval_s
    )
    add_engine_signals(js, series, missing)
    return js
