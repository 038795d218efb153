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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jobs.metrics.promql import Selector, promql_string, regex_any
from jobs.metrics.sampling import DEFAULT_SCRAPE_INTERVAL_S
from jobs.metrics.sampling import rate_window_s as _rate_window
from jobs.metrics.signal_queries import RangeClient, aggregate_query, missing_reason, stats_from_series
from jobs.metrics.signals import (
    COUNT,
    ENGINE_GROUP,
    JobSignals,
    Readiness,
    Reading,
    Signal,
    SignalSeries,
    grid,
)

#: The engine presence look-up's names (exact, escaped).
# --------------------------------------------------------------------------------------------------
# Serving engines' own FLOP and byte counters ("engine" signals)
#
# vLLM (`--enable-mfu-metrics`) exports the Counters `vllm:estimated_flops_per_gpu_total` ("Estimated number
# of floating point operations per GPU (for Model Flops Utilization calculations)"),
# `vllm:estimated_read_bytes_per_gpu_total` and `vllm:estimated_write_bytes_per_gpu_total` (bytes), each
# labelled `model_name` and `engine` (the engine index); source: vLLM docs, "Model Flops Utilization (MFU)
# Performance Metrics". SGLang exports the same three under `sglang:` with `--enable-mfu-metrics`
# (python/sglang/srt/observability/metrics_collector.py). They are counters since the server started: read
# with rate() (a server restart resets them to 0, which rate() treats as a counter reset), so a series is
# FLOP/s (B/s) per GPU of that engine.
#
# The join (an assumption the deployment must meet, stated on the readiness panel): the engine's own labels
# (`model_name`, `engine`) do not name a job, so its series are joined to a job by the job's *label
# selector*, through the target labels Prometheus adds when it scrapes the server's pod -- a
# ServiceMonitor/PodMonitor or `kubernetes_sd_configs` pod role adds `namespace` and `pod` (plus `service`,
# `container`, `endpoint`). A serving job registered with `{"namespace": "llm", "pod": "vllm-7b-0"}` (the
# selector that also finds its GPUs' dcgm-exporter series, there as `pod`/`exported_pod`) therefore reads
# its engine's counters too. A job registered by an explicit GPU list has no such labels: its engine
# signals are missing with that reason (jobs.metrics.engine_signals).
#
# Several series (replicas, or engines of one server) are averaged: the mean per-GPU FLOP/s of the job's
# engines, which over the GPU's dense peak is the engine's MFU (jobs.evaluation.kpis).

ENGINE_SOURCES = "vLLM / SGLang"
_ENGINE_ENABLE = (
    "start the server with --enable-mfu-metrics (vLLM, SGLang) and scrape its /metrics with a "
    "ServiceMonitor/PodMonitor (or kubernetes_sd pod role) that adds the pod and namespace labels the job's "
    "selector matches"
)


def _engine(key: str, suffix: str, raw_unit: str, unit: str, help_text: str, hides: str) -> Signal:
    names = (f"vllm:{suffix}", f"sglang:{suffix}")
    return Signal(key, names[0], names, raw_unit, unit, 1.0, Reading.COUNTER, False, "counter", help_text,
                  hides, ENGINE_GROUP, enable_hint=_ENGINE_ENABLE)  # fmt: skip


ENGINE_SIGNALS: dict[str, Signal] = {s.key: s for s in (
    _engine("engine_flops", "estimated_flops_per_gpu_total", "FLOP", "FLOP/s",
            "Estimated number of floating point operations per GPU (for Model Flops Utilization "
            "calculations).",
            "the serving engine's own MFU (its FLOPs per GPU over the GPU's dense peak)"),
    _engine("engine_read_bytes", "estimated_read_bytes_per_gpu_total", "B", "B/s",
            "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
            "the engine's memory traffic per GPU (decode is memory-bound)"),
    _engine("engine_write_bytes", "estimated_write_bytes_per_gpu_total", "B", "B/s",
            "Estimated number of bytes written to memory per GPU (for Model Flops Utilization "
            "calculations).",
            "the engine's memory traffic per GPU (decode is memory-bound)"),
)}  # fmt: skip

ENGINE_METRICS: frozenset[str] = frozenset(m for s in ENGINE_SIGNALS.values() for m in s.metrics)
"""Every serving-engine metric name the registry reads (the engine presence look-up's names)."""


def engine_readiness(present: Iterable[str]) -> list[Readiness]:
    """The readiness lines of the engine signals (only meaningful for serving jobs), as `readiness`."""
    seen = set(present)
    return [
        Readiness(
            s.key,
            s.field,
            s.key in seen or any(m in seen for m in s.metrics),
            False,
            s.hides,
            s.enable_line,
            s.metrics,
        )
        for s in ENGINE_SIGNALS.values()
    ]


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


# --------------------------------------------------------------------------------------------------
# The cluster readiness page's line: are the engines' FLOP counters in Prometheus, and joinable?

#: The FLOP counters' names (the readiness line looks for these; the byte counters come with them).
ENGINE_FLOPS_METRICS: tuple[str, ...] = ENGINE_SIGNALS["engine_flops"].metrics
#: The labels a job's selector joins an engine's series by, in the spellings Prometheus may store them.
JOIN_LABELS = {"namespace": ("namespace", "exported_namespace"), "pod": ("pod", "exported_pod")}


def engine_groups_query(lookback_s: float) -> str:
    """One instant query: each engine's FLOP counter series seen in the last `lookback_s`, counted per
    namespace and pod (in both spellings) and labelled `engine` (the *_over_time functions drop the metric
    name, so each engine's count is labelled with label_replace), so the line can say which groups carry
    them."""
    by = ", ".join(s for spellings in JOIN_LABELS.values() for s in spellings)
    window = f"{int(lookback_s)}s"
    parts = []
    for metric in ENGINE_FLOPS_METRICS:
        engine = metric.split(":", 1)[0]
        parts.append(
            f"label_replace(count by ({by}) (last_over_time({metric}[{window}])), "
            f"{promql_string('engine')}, {promql_string(engine)}, {promql_string('')}, {promql_string('')})"
        )
    return " or ".join(parts)


def _label(row: Mapping[str, str], name: str) -> str:
    return next((row[s] for s in JOIN_LABELS[name] if row.get(s)), "")


def source_readiness(
    rows: Sequence[tuple[Mapping[str, str], float]] | None, lookback_s: float, error: str = ""
) -> dict[str, Any]:
    """The serving engines' line among the service's sources (the cluster readiness page): whether any
    engine FLOP counter (`vllm:` / `sglang:estimated_flops_per_gpu_total`, `--enable-mfu-metrics`) has
    series in Prometheus, per engine and namespace how many pods carry it (`groups`), how many series carry
    no namespace/pod label and so join no job (`unjoinable`), and the reason in words with how to enable
    them. `rows`: (labels, series count) of `engine_groups_query`; None when the look-up failed with
    `error`. Nothing to configure in this service: a serving job (kind inference) reads them when present.
    """
    enable = ENGINE_SIGNALS["engine_flops"].enable_line
    line: dict[str, Any] = {
        "source": "serving engines (vLLM / SGLang FLOP counters)",
        "configured": None,
        "configured_text": "read for serving jobs (kind inference)",
        "label": "namespace, pod",
        "series_seen": None,
        "groups": [],
        "unjoinable": 0,
        "reason": "",
    }
    minutes = f"{lookback_s / 60:.0f} min"
    if rows is None:
        line["reason"] = f"not checked: Prometheus did not answer ({error})" if error else "not checked"
        return line
    pods: dict[tuple[str, str], set[str]] = {}
    unjoinable: dict[str, int] = {}
    for labels, count in rows:
        engine = labels.get("engine") or "unknown"
        namespace, pod = _label(labels, "namespace"), _label(labels, "pod")
        if namespace and pod:
            pods.setdefault((engine, namespace), set()).add(pod)
        else:
            unjoinable[engine] = unjoinable.get(engine, 0) + int(count)
    line["series_seen"] = bool(pods or unjoinable)
    line["groups"] = [
        f"{engine} in namespace {namespace}: {len(p)} pod{'s' if len(p) != 1 else ''}"
        for (engine, namespace), p in sorted(pods.items())
    ]
    line["unjoinable"] = sum(unjoinable.values())
    names = " or ".join(ENGINE_FLOPS_METRICS)
    if not line["series_seen"]:
        line["reason"] = (
            f"no {names} series in the last {minutes}: serving jobs' MFU is the forward-FLOPs estimate "
            f"from their tokens. To read the engine's own MFU, {enable}"
        )
        return line
    parts = []
    if pods:
        parts.append(f"seen in the last {minutes} for {'; '.join(line['groups'])}")
    if unjoinable:
        which = ", ".join(f"{n} {engine} series" for engine, n in sorted(unjoinable.items()))
        parts.append(
            f"{which} carry no namespace/pod label and join no job: scrape the servers through a "
            "ServiceMonitor/PodMonitor (or kubernetes_sd pod role), which adds them"
        )
    line["reason"] = "; ".join(parts)
    return line


def with_serving_jobs(line: dict[str, Any], serving: Sequence[str], without: Sequence[str]) -> dict[str, Any]:
    """The engines' line with the serving jobs (kind inference, external ids) polled recently: how many of
    them read no engine FLOP counter (`without`: their MFU is the forward-FLOPs estimate), naming a few."""
    out = dict(line, serving_jobs=len(serving), serving_without=list(without))
    if not serving:
        return out
    if without:
        named = ", ".join(without[:5]) + (f" and {len(without) - 5} more" if len(without) > 5 else "")
        note = f"{len(without)} of {len(serving)} serving jobs polled read no engine FLOPs ({named})"
    else:
        note = f"all {len(serving)} serving jobs polled read their engine's FLOPs"
    out["reason"] = f"{line['reason']}; {note}" if line["reason"] else note
    return out
