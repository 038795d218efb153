"""HTA's temporal and idle time breakdowns of one rank, defined to match HolisticTraceAnalysis 0.5.0
(read from its source: hta/analyzers/breakdown_analysis.py, hta/common/trace_parser.py); `trace_analysis`
puts them in each rank's result.

* Temporal breakdown: span = first GPU op start to last GPU op end, over every GPU-timeline op HTA sees
  (kernels, memcpy, memset and CUDA sync records); idle = span - union of those ops; compute = union of
  COMPUTATION-class kernels; non-compute = span - compute - idle. Percentages of span.
* Idle breakdown: per (device, stream), ops (kernels, memcpy, memset; not sync records) sorted by start;
  the gap before each op is *host wait* if its launching runtime call started after the previous op
  ended, else *kernel wait* if the gap is below `consecutive_kernel_delay` (HTA's default 30 -- in its
  microsecond units, so 30 us here), else *other*. HTA reports per stream; the rank figures here sum the
  streams (HTA's per-stream rows are in `streams`).

Microsecond rounding: HTA rounds float timestamps to whole microseconds (start up, end down; a workaround
for an old PyTorch overlap bug). For traces with sub-microsecond digits we repeat that rounding, float64
arithmetic included, for the two breakdowns above only (`hta_us_rounding=True`, the default), so they equal
HTA's to 1e-4 points on every sample; all other statistics keep the trace's nanoseconds. With
`hta_us_rounding=False` the breakdowns keep nanoseconds too: up to ~1 point (temporal) and ~2.3 points
(idle) away from HTA on the nanosecond-resolution sample, full of sub-microsecond kernels.

Deliberate differences from HTA, negligible on the samples:

* A "Stream Wait Event" sync record is OTHER; HTA's name rule makes it a compute kernel (7 us of the
  AlexNet sample's 13 s span move from compute to non-compute).
* Idle gaps are grouped per (device, stream), not per stream, which only matters for multi-GPU files.
* Without rounding, a negative gap between ops on one stream counts as zero, where HTA subtracts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from jobs.profiling import intervals as iv
from jobs.profiling.events import GpuOps, KernelClass, OpKind, RankTrace, RuntimeCalls
from jobs.profiling.units import NS_PER_US, ms, pct

#: Longest list of per-stream rows a result carries: the rank's figures still cover every stream.
MAX_LISTED = 64


def round_like_hta(rank: RankTrace) -> RankTrace:
    """The rank with every timestamp rounded as HTA's parser does for float timestamps.

    `round_down_time_stamps` in hta/common/trace_parser.py: start = ceil(ts), end = floor(ts + dur), in
    microseconds. Sub-microsecond ops can end up with zero or negative duration; HTA keeps them.
    """

    def rnd(table: Any) -> Any:
        # Redo HTA's arithmetic in float64 microseconds, rounding errors included: at epoch scale
        # ts + dur is only accurate to 0.25 us, which decides floor() for some ops. whole + frac/1000
        # recovers the very double the JSON parser produced for ts.
        whole, frac = np.divmod(table.start_ns, NS_PER_US)
        ts_us = whole.astype(np.float64) + frac / 1000.0
        end_us = ts_us + table.dur_ns / 1000.0
        new_start = np.ceil(ts_us).astype(np.int64) * NS_PER_US
        new_end = np.floor(end_us).astype(np.int64) * NS_PER_US
        return replace(table, start_ns=new_start, dur_ns=new_end - new_start)

    return replace(
        rank,
        gpu=rnd(rank.gpu),
        runtime=rnd(rank.runtime),
        cpu_ops=rnd(rank.cpu_ops),
        annotations=rnd(rank.annotations),
    )


_TEMPORAL_KEYS = (
    "idle_pct",
    "compute_pct",
    "non_compute_pct",
    "idle_ms",
    "compute_ms",
    "non_compute_ms",
    "span_ms",
)


def temporal_breakdown(gpu: GpuOps) -> dict[str, Any]:
    """HTA's temporal breakdown of one rank's GPU time: idle, compute and non-compute.

    Merging keeps empty intervals and the span ends at the last merged interval, exactly as HTA's
    `merge_kernel_intervals`/`_get_idle_time_for_kernels`; with non-negative durations this is simply
    first start to last end.
    """
    keys = _TEMPORAL_KEYS
    if len(gpu) == 0:
        return dict.fromkeys(keys)
    end = gpu.end_ns
    merged = iv.union(gpu.start_ns, end, keep_empty=True)
    span = int(merged[1][-1] - merged[0][0])
    busy = iv.total(merged)
    is_compute = gpu.kclass == KernelClass.COMPUTATION
    compute = iv.total(iv.union(gpu.start_ns[is_compute], end[is_compute], keep_empty=True))
    idle = span - busy
    non_compute = span - compute - idle
    if span <= 0:
        return dict.fromkeys(keys)
    return {
        "idle_pct": pct(idle, span),
        "compute_pct": pct(compute, span),
        "non_compute_pct": pct(non_compute, span),
        "idle_ms": ms(idle),
        "compute_ms": ms(compute),
        "non_compute_ms": ms(non_compute),
        "span_ms": ms(span),
    }


def launch_start_of(gpu: GpuOps, runtime: RuntimeCalls) -> npt.NDArray[np.float64]:
    """Start of the runtime call that launched each GPU op (NaN when the trace lacks it).

    With several CPU calls sharing a correlation id, the last one in trace order wins, as in HTA.
    """
    out = np.full(len(gpu), np.nan)
    if len(runtime) == 0 or len(gpu) == 0:
        return out
    has = runtime.correlation >= 0
    corr = runtime.correlation[has]
    starts = runtime.start_ns[has]
    order = np.argsort(corr, kind="stable")
    corr, starts = corr[order], starts[order]
    pos = np.searchsorted(corr, gpu.correlation, side="right") - 1
    ok = (pos >= 0) & (gpu.correlation >= 0)
    ok[ok] = corr[pos[ok]] == gpu.correlation[ok]
    out[ok] = starts[pos[ok]]
    return out


def idle_breakdown(
    gpu: GpuOps, runtime: RuntimeCalls, consecutive_kernel_delay_ns: int, clamp_negative_gaps: bool = True
) -> dict[str, Any]:
    """Idle time of one rank's GPU split into host wait / kernel wait / other, on the union of its streams.

    The rank-level figures are measured on the union of GPU activity (kernels, copies, memsets) over all
    streams of all devices of the rank: an instant is idle only when no stream is busy, so idle never
    exceeds the span. Each idle gap of that union is *host wait* when the op that ends it was launched
    (its runtime call started) after the gap began, else *kernel wait* when it is shorter than
    `consecutive_kernel_delay_ns`, else *other* -- HTA's per-stream rule applied to the merged timeline.

    HTA's own breakdown is per stream (`get_idle_time_breakdown`); summing its rows over streams counts
    an instant once per idle stream, which exceeds the span whenever streams idle together (issue #24:
    22.4 ms of "idle" in a 13.0 ms span). Those rows are kept in `streams`, and their sum, labelled as
    such, in `per_stream_sum` (equal to HTA's summed percentages). A negative gap between ops on one
    stream (an artefact of microsecond rounding) counts as zero there unless `clamp_negative_gaps` is
    off, which sums it like HTA does.
    """
    ops = gpu.take(gpu.kind != OpKind.SYNC)
    delay_us = consecutive_kernel_delay_ns / NS_PER_US
    empty_sum: dict[str, Any] = {
        "host_wait_pct": None,
        "kernel_wait_pct": None,
        "other_pct": None,
        "host_wait_ms": 0.0,
        "kernel_wait_ms": 0.0,
        "other_ms": 0.0,
        "idle_ms": 0.0,
        "stream_count": 0,
    }
    empty: dict[str, Any] = {
        **{k: v for k, v in empty_sum.items() if k != "stream_count"},
        "basis": _IDLE_BASIS,
        "span_ms": None,
        "idle_pct": None,
        "consecutive_kernel_delay_us": delay_us,
        "per_stream_sum": empty_sum,
        "streams": [],
    }
    if len(ops) == 0:
        return empty
    launch = launch_start_of(ops, runtime)
    union = _union_idle(ops.start_ns, ops.end_ns, launch, consecutive_kernel_delay_ns)
    streams, sums = _per_stream_idle(ops, launch, consecutive_kernel_delay_ns, clamp_negative_gaps)
    u_total = union["host"] + union["kernel"] + union["other"]
    return {
        "basis": _IDLE_BASIS,
        **_idle_parts(union),
        "span_ms": ms(union["span"]),
        "idle_pct": pct(u_total, union["span"]),
        "consecutive_kernel_delay_us": delay_us,
        "per_stream_sum": {
            "note": (
                "HTA's per-stream idle time summed over streams: an instant counts once per idle stream, "
                "so this can exceed the span."
            ),
            "stream_count": len(streams),
            **_idle_parts(sums),
        },
        "streams": streams[:MAX_LISTED],
    }


_IDLE_BASIS = "union of GPU activity over all streams (an instant is idle when no stream is busy)"


def _idle_parts(ns: Mapping[str, float]) -> dict[str, Any]:
    """Host wait, kernel wait and other idle time (ns in `ns`) as shares of their total and in ms."""
    total = ns["host"] + ns["kernel"] + ns["other"]
    return {
        "host_wait_pct": pct(ns["host"], total),
        "kernel_wait_pct": pct(ns["kernel"], total),
        "other_pct": pct(ns["other"], total),
        "host_wait_ms": ms(ns["host"]),
        "kernel_wait_ms": ms(ns["kernel"]),
        "other_ms": ms(ns["other"]),
        "idle_ms": ms(total),
    }


def _union_idle(
    start: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
    launch: npt.NDArray[np.float64],
    consecutive_kernel_delay_ns: int,
) -> dict[str, int]:
    """Idle gaps of the union of [start, end) intervals, split into host/kernel/other (ns), and the span."""
    # Ops that start together after a gap sort by launch time, so the gap is read from the earliest
    # launched of them: it is host wait only when even that one was launched after the gap began.
    order = np.lexsort((launch, start))
    s, e, lau = start[order], end[order], launch[order]
    running_end = np.maximum.accumulate(e)
    prev_end = np.empty_like(running_end)
    prev_end[0] = s[0]
    prev_end[1:] = running_end[:-1]
    gap = np.maximum(s - prev_end, 0)
    is_gap = gap > 0
    host = is_gap & (lau > prev_end)  # NaN launch compares False: not host wait
    kernel = is_gap & ~host & (gap < consecutive_kernel_delay_ns)
    other = is_gap & ~host & ~kernel
    return {
        "host": int(gap[host].sum()),
        "kernel": int(gap[kernel].sum()),
        "other": int(gap[other].sum()),
        "span": int(running_end[-1] - s[0]),
    }


def _per_stream_idle(
    ops: GpuOps, launch: npt.NDArray[np.float64], consecutive_kernel_delay_ns: int, clamp_negative_gaps: bool
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """HTA's per-(device, stream) idle rows, largest first, and their sums per category (ns)."""
    order = np.lexsort((ops.start_ns, ops.stream, ops.device))
    dev, stream = ops.device[order], ops.stream[order]
    start, end, launch = ops.start_ns[order], ops.end_ns[order], launch[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (dev[1:] != dev[:-1]) | (stream[1:] != stream[:-1])
    prev_end = np.empty_like(end)
    prev_end[1:] = end[:-1]
    raw_gap = start - prev_end
    gap = np.where(first, 0, np.maximum(raw_gap, 0) if clamp_negative_gaps else raw_gap)
    host = ~first & (launch > prev_end)  # NaN launch compares False: not host wait
    kernel = ~first & ~host & (raw_gap < consecutive_kernel_delay_ns)
    other = ~first & ~host & ~kernel
    group_start = np.flatnonzero(first)
    streams: list[dict[str, Any]] = []
    totals = {"host": 0, "kernel": 0, "other": 0}
    for gi, lo in enumerate(group_start):
        hi = group_start[gi + 1] if gi + 1 < len(group_start) else len(order)
        h = int(gap[lo:hi][host[lo:hi]].sum())
        k = int(gap[lo:hi][kernel[lo:hi]].sum())
        o = int(gap[lo:hi][other[lo:hi]].sum())
        tot = h + k + o
        totals["host"] += h
        totals["kernel"] += k
        totals["other"] += o
        streams.append(
            {
                "device": int(dev[lo]),
                "stream": int(stream[lo]),
                "ops": int(hi - lo),
                "host_wait_ms": ms(h),
                "kernel_wait_ms": ms(k),
                "other_ms": ms(o),
                "idle_ms": ms(tot),
                "host_wait_pct": pct(h, tot),
                "kernel_wait_pct": pct(k, tot),
                "other_pct": pct(o, tot),
            }
        )
    streams.sort(key=lambda s: -s["idle_ms"])
    return streams, totals
