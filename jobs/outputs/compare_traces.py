"""Trace diff of two runs (A = "before", B = "after"): which parsed trace of each run to compare, and the
differences of their analyses (time shares, idle, step times, kernel names, host attribution), always
B − A as in HTA's TraceDiff (test − control). Pure: no Django, no ORM, no settings; the numbers come from
each trace's stored analysis (jobs.profiling.trace_analysis), nothing is measured again here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TRACE_KINDS = ("kineto", "nsys_sqlite")


@dataclass(frozen=True)
class TraceFact:
    """A parsed trace artifact used in the diagnosis: id, kind, file name, rank, parse time, analysis."""

    id: int
    kind: str
    name: str
    rank: int | None
    parsed_at: str
    analysis: Mapping[str, Any] = field(default_factory=dict)


def pick_traces(
    a: Sequence[TraceFact], b: Sequence[TraceFact]
) -> tuple[TraceFact | None, TraceFact | None, str]:
    """The latest trace of each run of one kind both runs have (Kineto before nsys), or a reason why none.
    Each list is expected newest first."""
    for kind in TRACE_KINDS:
        ta = next((t for t in a if t.kind == kind), None)
        tb = next((t for t in b if t.kind == kind), None)
        if ta and tb:
            return ta, tb, ""
    have_a = sorted({t.kind for t in a}) or ["none"]
    have_b = sorted({t.kind for t in b}) or ["none"]
    return (
        None,
        None,
        (
            "no trace of the same kind in both runs (A: "
            + ", ".join(have_a)
            + "; B: "
            + ", ".join(have_b)
            + "): upload a Kineto trace or an nsys SQLite export of each"
        ),
    )


def pick_ranks(
    a: Mapping[str, Any], b: Mapping[str, Any]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The same rank of both analyses when both have it, else each one's first rank with GPU kernels."""
    ra = [r for r in a.get("ranks") or [] if isinstance(r, dict)]
    rb = [r for r in b.get("ranks") or [] if isinstance(r, dict)]
    common = [
        r.get("rank")
        for r in ra
        if r.get("has_gpu_kernels")
        and any(o.get("rank") == r.get("rank") and o.get("has_gpu_kernels") for o in rb)
    ]
    if common:
        return (
            next(r for r in ra if r.get("rank") == common[0]),
            next(r for r in rb if r.get("rank") == common[0]),
        )
    first = lambda rs: next((r for r in rs if r.get("has_gpu_kernels")), rs[0] if rs else None)  # noqa: E731
    return first(ra), first(rb)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _pairs(
    sa: Mapping[str, Any] | None, sb: Mapping[str, Any] | None, keys: Sequence[tuple[str, str, str]]
) -> list[dict[str, Any]]:
    """Rows {key, label, unit, a, b, delta} of numeric keys of one section of both analyses."""
    out = []
    for key, label, unit in keys:
        va = _num((sa or {}).get(key))
        vb = _num((sb or {}).get(key))
        delta = vb - va if va is not None and vb is not None else None
        out.append(
            {
                "key": key,
                "label": label,
                "unit": unit,
                "a": va,
                "b": vb,
                "delta": None if delta is None else round(delta, 4),
            }
        )
    return out


def _nested(section: Mapping[str, Any] | None, key: str, sub: str) -> float | None:
    inner = (section or {}).get(key)
    return _num(inner.get(sub)) if isinstance(inner, dict) else None


def _by(rows: Any, name_key: str, fields: Sequence[str]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for r in rows if isinstance(rows, list) else []:
        if isinstance(r, dict) and r.get(name_key) is not None:
            out[str(r[name_key])] = {f: _num(r.get(f)) for f in fields}
    return out


def _table_diff(rows_a: Any, rows_b: Any, name_key: str, count: str, time: str) -> list[dict[str, Any]]:
    """Rows of a complete breakdown (every class / kind listed): a name absent from one side is 0 there."""
    a = _by(rows_a, name_key, (count, time))
    b = _by(rows_b, name_key, (count, time))
    out = []
    for name in sorted(set(a) | set(b)):
        ca, cb = (a.get(name) or {}).get(count) or 0.0, (b.get(name) or {}).get(count) or 0.0
        ta, tb = (a.get(name) or {}).get(time) or 0.0, (b.get(name) or {}).get(time) or 0.0
        out.append(
            {
                "name": name,
                "a_count": ca,
                "b_count": cb,
                "diff_count": cb - ca,
                "a_time_ms": ta,
                "b_time_ms": tb,
                "diff_time_ms": round(tb - ta, 4),
            }
        )
    return sorted(out, key=lambda r: -abs(r["diff_time_ms"]))


def kernel_name_diff(kb_a: Mapping[str, Any], kb_b: Mapping[str, Any], limit: int = 20) -> dict[str, Any]:
    """Kernels by name as HTA's TraceDiff.compare_traces/ops_diff define them (name = the full kernel name;
    diff = B − A in count and total time): added (absent in A, present in B), removed (HTA's "deleted"),
    increased / decreased / unchanged (in both, by count), and faster / slower (in both, by total time).

    The analyses keep each trace's top kernels by time only. A name missing from a side that lists all its
    kernels is absent (0, as HTA fills); missing from a side with more kernels than listed it is not known
    ("not in A's top N"), never 0. Rows sorted by the absolute change of total time, the top `limit`."""
    top_a = _by(kb_a.get("top_kernels"), "name", ("count", "total_ms"))
    top_b = _by(kb_b.get("top_kernels"), "name", ("count", "total_ms"))
    short = {
        str(r.get("name")): str(r.get("short_name") or r.get("name"))
        for r in [*(kb_a.get("top_kernels") or []), *(kb_b.get("top_kernels") or [])]
        if isinstance(r, dict)
    }
    distinct_a, distinct_b = _num(kb_a.get("distinct_kernels")), _num(kb_b.get("distinct_kernels"))
    complete_a = distinct_a is not None and distinct_a <= len(top_a)
    complete_b = distinct_b is not None and distinct_b <= len(top_b)
    rows: list[dict[str, Any]] = []
    for name in set(top_a) | set(top_b):
        ra, rb = top_a.get(name), top_b.get(name)
        ca = ra["count"] if ra else (0.0 if complete_a else None)
        cb = rb["count"] if rb else (0.0 if complete_b else None)
        ta = ra["total_ms"] if ra else (0.0 if complete_a else None)
        tb = rb["total_ms"] if rb else (0.0 if complete_b else None)
        if ra and rb:
            dc = (cb or 0.0) - (ca or 0.0)
            change = "increased" if dc > 0 else "decreased" if dc < 0 else "unchanged"
            timing = (
                "slower" if (tb or 0.0) > (ta or 0.0) else "faster" if (tb or 0.0) < (ta or 0.0) else "same"
            )
        elif rb:
            change, timing = ("added", "") if complete_a else (f"not in A's top {len(top_a)}", "")
        else:
            change, timing = ("removed", "") if complete_b else (f"not in B's top {len(top_b)}", "")
        diff_c = cb - ca if ca is not None and cb is not None else None
        diff_t = round(tb - ta, 4) if ta is not None and tb is not None else None
        rows.append(
            {
                "name": name,
                "short_name": short.get(name, name),
                "a_count": ca,
                "b_count": cb,
                "diff_count": diff_c,
                "a_time_ms": ta,
                "b_time_ms": tb,
                "diff_time_ms": diff_t,
                "change": change,
                "timing": timing,
            }
        )
    _disambiguate(rows)
    # Known changes by size first, then the rows whose change is unknown by their known side's time.
    rows.sort(
        key=lambda r: (
            r["diff_time_ms"] is None,
            -abs(r["diff_time_ms"] or 0.0),
            -((r["a_time_ms"] or 0.0) + (r["b_time_ms"] or 0.0)),
            r["name"],
        )
    )
    return {
        "rows": rows[:limit],
        "listed_a": len(top_a),
        "listed_b": len(top_b),
        "distinct_a": distinct_a,
        "distinct_b": distinct_b,
        "complete_a": complete_a,
        "complete_b": complete_b,
        "counts": {
            c: sum(1 for r in rows if r["change"] == c)
            for c in ("added", "removed", "increased", "decreased", "unchanged")
        },
    }


def _common_prefix(texts: list[str]) -> int:
    """Length of the characters all `texts` start with."""
    first, last = min(texts), max(texts)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return n


def _disambiguate(rows: list[dict[str, Any]], width: int = 48) -> None:
    """Rows whose short names collide (one template, several instantiations: "gemv2T_kernel" three times)
    get the part of their full names that differs, so the table never shows one name on several rows."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["short_name"], []).append(row)
    for short, group in groups.items():
        if len(group) < 2:
            continue
        names = [str(r["name"]) for r in group]
        prefix = _common_prefix(names)
        suffix = _common_prefix([n[::-1] for n in names])
        for row, name in zip(group, names, strict=True):
            middle = name[prefix : max(prefix, len(name) - suffix)].strip(" ,<>") or name
            if len(middle) > width:
                middle = middle[: width - 1] + "…"
            row["short_name"] = f"{short} ‹{middle}›"


_TEMPORAL = (
    ("idle_pct", "Idle", "%"),
    ("compute_pct", "Compute", "%"),
    ("non_compute_pct", "Non-compute", "%"),
    ("idle_ms", "Idle", "ms"),
    ("compute_ms", "Compute", "ms"),
    ("non_compute_ms", "Non-compute", "ms"),
    ("span_ms", "Analysed span", "ms"),
)
_IDLE = (
    ("host_wait_pct", "Host wait", "% of idle"),
    ("kernel_wait_pct", "Kernel wait", "% of idle"),
    ("other_pct", "Other", "% of idle"),
    ("host_wait_ms", "Host wait", "ms"),
    ("kernel_wait_ms", "Kernel wait", "ms"),
    ("other_ms", "Other", "ms"),
    ("idle_ms", "Idle (all streams)", "ms"),
)
_STEP = (
    ("step_ms_mean", "Step (mean)", "ms"),
    ("dataloader_pct", "Input (DataLoader)", "% of step"),
    ("kernel_pct", "Compute kernels", "% of step"),
    ("communication_pct", "Communication", "% of step"),
    ("memcpy_pct", "Memcpy", "% of step"),
    ("memset_pct", "Memset", "% of step"),
    ("runtime_pct", "CUDA runtime", "% of step"),
    ("cpu_exec_pct", "CPU execution", "% of step"),
    ("other_pct", "Other", "% of step"),
)
_ATTRIBUTION = (
    ("idle_pct", "GPU idle", "% of window"),
    ("input_pct", "… waiting for input", "% of window"),
    ("host_sync_pct", "… host blocking", "% of window"),
    ("launch_gaps_pct", "… launch gaps", "% of window"),
    ("other_pct", "… other", "% of window"),
)
_HOST = (
    ("calls", "Blocking calls", "calls"),
    ("blocked_ms", "Blocked", "ms"),
    ("step_pct", "Blocked", "% of step"),
)


def trace_diff(ta: TraceFact, tb: TraceFact) -> dict[str, Any]:
    """Deltas (B − A) of two trace analyses (jobs.profiling.trace_analysis.analyze_trace), on one rank each:
    temporal and idle breakdowns (HTA), step breakdown, GPU idle by host activity, kernel time by category
    and by name, kernel count and launch statistics, host blocking. Units in each row; % deltas in points."""
    ra, rb = pick_ranks(ta.analysis, tb.analysis)
    if ra is None or rb is None:
        return {"available": False, "reason": "a trace analysis has no rank with GPU work"}
    kba, kbb = ra.get("kernel_breakdown") or {}, rb.get("kernel_breakdown") or {}
    la, lb = ra.get("launch_stats") or {}, rb.get("launch_stats") or {}
    launch = _pairs(
        kba,
        kbb,
        (
            ("kernel_count", "Kernels", "kernels"),
            ("kernel_time_ms", "Kernel time", "ms"),
            ("distinct_kernels", "Distinct kernels", "names"),
        ),
    )
    launch += _pairs(
        la,
        lb,
        (
            ("launches", "Launches", "calls"),
            ("gpu_shorter_than_launch_pct", "GPU time shorter than its launch", "% of launches"),
            ("launch_delay_outliers_count", "Launch delays over the cutoff", "launches"),
        ),
    )
    for key, sub, label in (
        ("launch_delay", "p50_us", "Launch delay p50"),
        ("launch_delay", "p90_us", "Launch delay p90"),
        ("cpu_launch_duration", "p50_us", "CPU launch call p50"),
        ("gpu_duration", "p50_us", "GPU op duration p50"),
    ):
        va, vb = _nested(la, key, sub), _nested(lb, key, sub)
        launch.append(
            {
                "key": f"{key}.{sub}",
                "label": label,
                "unit": "µs",
                "a": va,
                "b": vb,
                "delta": round(vb - va, 4) if va is not None and vb is not None else None,
            }
        )
    tiny_a, tiny_b = kba.get("tiny_kernels") or {}, kbb.get("tiny_kernels") or {}
    launch += _pairs(
        tiny_a,
        tiny_b,
        (
            ("count", "Tiny kernels (< 10 µs)", "kernels"),
            ("count_pct", "Tiny kernels", "% of kernels"),
            ("time_pct", "Tiny kernels' time", "% of kernel time"),
        ),
    )
    ha, hb = ra.get("host_blocking") or {}, rb.get("host_blocking") or {}
    st_a, st_b = ra.get("step_times") or {}, rb.get("step_times") or {}
    step = _pairs(st_a, st_b, (("median_ms", "Step (median)", "ms"), ("count", "Steps", "steps")))
    step += _pairs(ra.get("step_breakdown"), rb.get("step_breakdown"), _STEP)
    return {
        "available": True,
        "kind": ta.kind,
        "a": {"artifact": ta.id, "name": ta.name, "rank": ra.get("rank"), "window": ra.get("window") or {}},
        "b": {"artifact": tb.id, "name": tb.name, "rank": rb.get("rank"), "window": rb.get("window") or {}},
        "temporal": _pairs(ra.get("temporal_breakdown"), rb.get("temporal_breakdown"), _TEMPORAL),
        "idle": _pairs(ra.get("idle_breakdown"), rb.get("idle_breakdown"), _IDLE),
        "step": step,
        "gpu_idle_attribution": _pairs(
            ra.get("gpu_idle_attribution"), rb.get("gpu_idle_attribution"), _ATTRIBUTION
        ),
        "kernel_classes": _table_diff(
            kba.get("by_class"), kbb.get("by_class"), "kernel_class", "count", "time_ms"
        ),
        "kernels": kernel_name_diff(kba, kbb),
        "launch": launch,
        "host_blocking": _pairs(ha, hb, _HOST),
        "host_blocking_kinds": _table_diff(ha.get("by_kind"), hb.get("by_kind"), "kind", "count", "time_ms"),
        "overlap": _pairs(
            ra.get("comm_compute_overlap"),
            rb.get("comm_compute_overlap"),
            (("overlap_pct", "Communication overlapped by compute", "% of communication"),),
        ),
        "notes": _window_notes(ra, rb),
    }


def _window_notes(ra: Mapping[str, Any], rb: Mapping[str, Any]) -> list[str]:
    notes = [
        "forward, backward and optimizer are not told apart by the trace analysis: the step is split "
        "into input, kernels, communication, copies, runtime and CPU time"
    ]
    wa, wb = ra.get("window") or {}, rb.get("window") or {}
    if wa.get("profiler_steps") != wb.get("profiler_steps"):
        notes.append(
            f"the traces cover different numbers of profiler steps ({wa.get('profiler_steps')} vs "
            f"{wb.get('profiler_steps')}): compare shares and per-step times, not totals"
        )
    return notes
