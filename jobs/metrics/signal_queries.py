"""The PromQL that reads the registry's DCGM fields (jobs.metrics.signals) and one job's read of them.

Pure: no Django and no HTTP. `fetch_job_signals` takes any client with `range()` and `label_values()`
(`jobs.metrics.prometheus.PrometheusClient`); the poll cycle (jobs.metrics.cluster) reads the same queries
for all jobs at once.

Every signal is aggregated across the job's GPUs on the server (one query per signal returns mean, min,
max and count series, told apart by a `stat` label), so the number of queries grows with the number of
signals, never with the number of GPUs. A finalize (`stats_here`) instead reads each signal's per-GPU
expression once and aggregates it here (jobs.metrics.cross_gpu): PromQL evaluates that expression once
per stat, so the one query read every raw sample five times. A second, optional query per signal
returns one series per GPU (`by (Hostname, hostname, exported_*, gpu)`) at a coarse step for the heatmap.
Values are normalised in PromQL to the registry's `unit` (see jobs.metrics.signals).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

import numpy as np

from jobs.metrics.cross_gpu import stats_from_rows
from jobs.metrics.promql import HOST_LABEL_SPELLINGS, Selector, duration, gpu_key, regex_any
from jobs.metrics.sampling import (
    DEFAULT_SCRAPE_INTERVAL_S,
    grid_frame,
    lattice_point,
    place_rows,
    step_window_s,
)
from jobs.metrics.sampling import (
    rate_window_s as _rate_window,  # the parameter of fetch_job_signals has its name
)
from jobs.metrics.signals import (
    ALIAS_METRICS,
    COUNT,
    DEFAULT_RATE_WINDOW_S,
    DEFAULT_STEP_S,
    ENGINE_GROUP,
    MAX,
    MEAN,
    MIN,
    NONZERO,
    SAMPLED,
    SIGNALS,
    STAT_LABEL,
    THROTTLE_BITS,
    GpuKey,
    JobSignals,
    Reading,
    Signal,
    SignalSeries,
    grid,
)

K = TypeVar("K", bound=Hashable)  # a job's key in the many-jobs helpers (the poll cycle's job pk)


def _over_time(signal: Signal) -> str:
    """How a gauge-like field's samples inside one step become that step's value."""
    if signal.reading in (Reading.CODE, Reading.LEVEL):
        # Any non-zero code in the step matters; an average of codes means nothing. A count since driver
        # load only rises (until a reset): its highest value in the step is its latest.
        return "max_over_time"
    if signal.reading is Reading.BITMASK:
        # Neither an average nor a max of bitmasks is a bitmask: keep the state at the end of the step.
        return "last_over_time"
    return "avg_over_time"


def base_vector(
    signal: Signal,
    selector: Selector,
    rate_window_s: float = DEFAULT_RATE_WINDOW_S,
    *,
    step_s: float = DEFAULT_STEP_S,
    metrics: Sequence[str] | None = None,
) -> str:
    """Per-GPU instant vector of `signal` in its normalised unit, one value per step of `step_s`.

    Evaluated at grid time t, a gauge reads `avg_over_time(x[step - 1ms])`: the mean of the samples in
    (t - step, t] (see `jobs.metrics.sampling.step_window_s` for the millisecond), so a step coarser than the
    scrape interval averages every sample instead of keeping the last, and a step without any sample
    returns nothing (NaN on the grid) instead of the 5-minute lookback's stale value. Counters are turned
    into rates over `rate_window_s` (callers pass `jobs.metrics.sampling.rate_window_s`). `metrics` narrows
    the names to those known to exist (the poll cycle's discovery); default all of `signal.metrics`.
    """
    names = _names(signal, metrics)
    # Names with one scale share a selector; an alias in other units (the GPM exporter's mW) gets its own,
    # scaled to the signal's unit before `or` joins them (the DCGM names first: `or` keeps the left side
    # where two series have the same labels).
    by_scale: dict[float, list[str]] = {}
    for name in names:
        by_scale.setdefault(signal.scale_of(name), []).append(name)
    parts = []
    for scale, group in by_scale.items():
        if signal.reading in (Reading.RATE, Reading.ENERGY, Reading.COUNTER):
            expr = selector.select_range(group, "rate", rate_window_s)
        else:
            expr = selector.select_range(group, _over_time(signal), step_window_s(step_s))
        parts.append(f"({expr})" if scale == 1.0 else f"({expr}) * {scale!r}")
    return parts[0] if len(parts) == 1 else f"({' or '.join(parts)})"


def _names(signal: Signal, metrics: Sequence[str] | None) -> tuple[str, ...]:
    if metrics is None:
        return signal.names
    names = tuple(m for m in signal.names if m in set(metrics))
    if not names:
        raise ValueError(f"{signal.key}: none of {signal.names} among the given metric names")
    return names


def _by(labels: Sequence[str]) -> str:
    return f" by ({', '.join(labels)})" if labels else ""


def _tag(expr: str, stat: str) -> str:
    # label_replace with an empty source label and regex always matches: it just adds stat="...".
    return f'label_replace({expr}, "{STAT_LABEL}", "{stat}", "", "")'


def sampled_vector(
    signal: Signal,
    selector: Selector,
    *,
    step_s: float = DEFAULT_STEP_S,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
    by: Sequence[str] = (),
    metrics: Sequence[str] | None = None,
) -> str:
    """How many GPUs' worth of each step the raw samples cover: samples of all GPUs in (t - step, t]
    times scrape interval / step (4 GPUs scraped without a miss read 4.0; see `coverage_from_stats`);
    `by` keeps one such series per value of those labels (one per job in the poll cycle)."""
    counted = selector.select_range(_names(signal, metrics), "count_over_time", step_window_s(step_s))
    return f"sum{_by(by)}({counted}) * {scrape_interval_s / step_s!r}"


def aggregate_query(
    signal: Signal,
    selector: Selector,
    rate_window_s: float = DEFAULT_RATE_WINDOW_S,
    *,
    step_s: float = DEFAULT_STEP_S,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
    by: Sequence[str] = (),
    metrics: Sequence[str] | None = None,
) -> str:
    """One query whose series (labelled `stat`) are the cross-GPU aggregates in `signal.stats`, plus
    SAMPLED (the coverage of each step), all on the grid of `step_s`.

    Cross-GPU min and max are taken over each GPU's mean of the step, so they still compare GPUs (the
    least busy one) rather than mixing in every sample's jitter. `by` (the poll cycle: the job label)
    aggregates per value of those labels instead of over everything selected; NONZERO then has no
    `or vector(0)` (a labelless 0 belongs to no job): the caller writes 0 where it is missing.
    """
    base = base_vector(signal, selector, rate_window_s, step_s=step_s, metrics=metrics)
    grouped = _by(by)
    parts: list[str] = []
    for stat in signal.stats:
        if stat == MEAN:
            parts.append(_tag(f"avg{grouped}({base})", MEAN))
        elif stat in (MIN, MAX, COUNT):
            parts.append(_tag(f"{stat}{grouped}({base})", stat))
        elif stat == NONZERO and by:
            parts.append(_tag(f"count{grouped}({base} != 0)", NONZERO))
        elif stat == NONZERO:
            # `count(x != 0)` is empty, not 0, when no GPU has an error: `or vector(0)` keeps a line.
            parts.append(_tag(f"(count({base} != 0) or vector(0))", NONZERO))
        else:  # a throttle reason: share of reporting GPUs with that bit set
            bit = THROTTLE_BITS[stat]
            parts.append(_tag(f"avg{grouped}(floor({base} / {bit}) % 2)", stat))
    sampled = sampled_vector(
        signal, selector, step_s=step_s, scrape_interval_s=scrape_interval_s, by=by, metrics=metrics
    )
    parts.append(_tag(sampled, SAMPLED))
    return " or ".join(parts)


def per_gpu_query(
    signal: Signal,
    selector: Selector,
    rate_window_s: float = DEFAULT_RATE_WINDOW_S,
    *,
    step_s: float = DEFAULT_STEP_S,
    by: Sequence[str] = HOST_LABEL_SPELLINGS,
    metrics: Sequence[str] | None = None,
) -> str:
    """One series per GPU, keyed by every host-label spelling and `gpu`, one value per `step_s`.

    `avg by` also merges copies of one GPU's series (an `hpc_job` label emits one per job); codes and
    bitmasks use `max` because an average of codes means nothing. `by` replaces the host spellings
    (the poll cycle passes the job label and the spellings that exist); `gpu` is always added.
    """
    base = base_vector(signal, selector, rate_window_s, step_s=step_s, metrics=metrics)
    agg = "max" if signal.reading in (Reading.CODE, Reading.BITMASK) else "avg"
    return f"{agg} by ({', '.join((*by, 'gpu'))}) ({base})"


def window_total_query(signal: Signal, selector: Selector, window_s: float) -> str:
    """Instant query (evaluate at the job's end) for a counter's total over the job across its GPUs:
    energy in J for TOTAL_ENERGY_CONSUMPTION, GPU-seconds throttled for the *_VIOLATION counters."""
    if signal.reading not in (Reading.ENERGY, Reading.RATE, Reading.COUNTER):
        raise ValueError(f"{signal.key} is not a counter")
    expr = selector.select_range(signal.metrics, "increase", window_s)
    return f"sum({expr}) * {signal.scale!r}"


def xid_codes_query(selector: Selector, window_s: float) -> str:
    """Instant query (at the job's end): per GPU, the highest XID code seen in the window (0 = none)."""
    sig = SIGNALS["xid_errors"]
    expr = selector.select_range(sig.metrics, "max_over_time", window_s)
    return f"max by ({', '.join((*HOST_LABEL_SPELLINGS, 'gpu'))}) ({expr})"


# The presence look-ups' regex: every DCGM field, and the registry's other exporters' names (exactly).
DCGM_NAME_REGEX = "DCGM_FI_.+|" + regex_any(ALIAS_METRICS)


def stats_from_series(series: Sequence[Any], timestamps: np.ndarray) -> dict[str, np.ndarray]:
    """Aggregate-query series (`prometheus.Series`: labels, timestamps, values) -> {stat: values on the
    grid}, each as `Series.on_grid` places it (a stat seen twice: the last series wins)."""
    return stats_of_jobs({0: series}, {0: timestamps})[0]


def stats_of_jobs(
    series: Mapping[K, Sequence[Any]], grids: Mapping[K, np.ndarray]
) -> dict[K, dict[str, np.ndarray]]:
    """`stats_from_series` of many jobs at once (each key's series on that key's grid; a key without
    series gets no stats), every series placed in one vectorised pass (`stats_placed`): the poll cycle's
    answer of one signal holds a few series for each of hundreds of jobs."""
    picked = [
        (key, stat, s) for key, mine in series.items() for s in mine if (stat := s.labels.get(STAT_LABEL))
    ]
    return stats_placed(picked, grids)


def stats_placed(
    picked: Sequence[tuple[K, str, Any]], grids: Mapping[K, np.ndarray]
) -> dict[K, dict[str, np.ndarray]]:
    """{job key: {stat: values}} of (job key, stat, series) triples, each series on its key's grid, all in
    one `sampling.place_rows` pass (a key's stat seen twice: its last series wins; a key of `grids` with
    no triple: no stats). For callers that find each series' job and stat in one pass over an answer (the
    poll cycle's label groups: `cycle_groups.label_stats`)."""
    frames = {key: (*grid_frame(ts), len(ts)) for key, ts in grids.items()}
    spans = [frames[key] for key, _, _ in picked]
    flat = place_rows(
        [s.timestamps for _, _, s in picked], [s.values for _, _, s in picked],
        [f[0] for f in spans], [f[1] for f in spans], [f[2] for f in spans],
    )  # fmt: skip
    out: dict[K, dict[str, np.ndarray]] = {key: {} for key in grids}
    at = 0
    for (key, stat, _), (_, _, size) in zip(picked, spans, strict=True):
        out[key][stat] = flat[at : at + size]
        at += size
    return out


def per_gpu_matrix(series: Sequence[Any], timestamps: np.ndarray) -> tuple[tuple[GpuKey, ...], np.ndarray]:
    """Per-GPU series -> (sorted GPU keys, matrix gpus x time with NaN where a GPU has no sample)."""
    return per_gpu_matrices({0: series}, {0: timestamps})[0]


def per_gpu_matrices(
    series: Mapping[K, Sequence[Any]], grids: Mapping[K, np.ndarray]
) -> dict[K, tuple[tuple[GpuKey, ...], np.ndarray]]:
    """`per_gpu_matrix` of many jobs at once (each key's series on that key's grid), every series placed in
    one vectorised pass (`sampling.place_rows`) straight into its job's matrix row, GPUs sorted by host
    and index. One GPU under two host spellings (two series): the first series' values, the next one's
    where the first has none (in series order)."""
    layout: list[tuple[K, tuple[GpuKey, ...], int]] = []  # (job, its sorted GPUs, its matrix's offset)
    rows: list[tuple[Any, float, float, int]] = []  # (series, grid origin, step, size) in flat order
    extra: list[tuple[int, Any, float, float, int]] = []  # (offset of the row it merges into, its row)
    offset = 0
    for key, ts in grids.items():
        by_gpu: dict[GpuKey, list[Any]] = {}
        for s in series.get(key, ()):
            by_gpu.setdefault(GpuKey(*gpu_key(s.labels)), []).append(s)
        keys = tuple(sorted(by_gpu, key=lambda k: (k.hostname, int(k.gpu) if k.gpu.isdigit() else -1, k.gpu)))
        origin, step = grid_frame(ts)
        size = len(ts)
        layout.append((key, keys, offset))
        for gk in keys:
            first, *rest = by_gpu[gk]
            rows.append((first, origin, step, size))
            extra += [(offset, s, origin, step, size) for s in rest]
            offset += size
    rows += [(s, origin, step, size) for _, s, origin, step, size in extra]
    flat = place_rows(
        [r[0].timestamps for r in rows], [r[0].values for r in rows],
        [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows],
    )  # fmt: skip
    tail = offset
    for at, _, _, _, size in extra:  # in series order: a value already in the GPU's row is kept
        row = flat[at : at + size]
        np.copyto(row, flat[tail : tail + size], where=np.isnan(row))
        tail += size
    out: dict[K, tuple[tuple[GpuKey, ...], np.ndarray]] = {}
    for key, keys, at in layout:
        size = len(grids[key])
        out[key] = (keys, flat[at : at + len(keys) * size].reshape(len(keys), size))
    return out


class RangeClient(Protocol):
    """What `fetch_job_signals` needs from a client (PrometheusClient satisfies it)."""

    def range(self, query: str, start: Any, end: Any, step: float | None = None) -> Sequence[Any]: ...

    def label_values(
        self, label: str, match: Sequence[str] = (), start: Any = None, end: Any = None
    ) -> list[str]: ...


class Submitter(Protocol):
    """Sends range queries ahead and answers them as futures (`jobs.metrics.prometheus.RangeFetcher`)."""

    def submit(self, query: str, start: float, end: float, step: float) -> Future[Sequence[Any]]: ...


def range_parts(start: float, end: float, step: float, max_points: int) -> list[tuple[float, float]]:
    """[start, end] cut into parts of at most `max_points` points of one grid (start + k*step)."""
    n_last = int(np.floor((end - start) / step + 1e-9))
    parts = []
    first = 0
    while first <= n_last:
        last = min(n_last, first + max_points - 1)
        parts.append((start + first * step, start + last * step))
        first = last + 1
    return parts


def join_parts(answers: Iterable[Sequence[Any]]) -> list[Any]:
    """The series of consecutive parts of one range query joined by label set (in the parts' order)."""
    parts: dict[tuple[tuple[str, str], ...], list[Any]] = {}
    for answer in answers:
        for s in answer:
            parts.setdefault(tuple(sorted(s.labels.items())), []).append(s)
    out: list[Any] = []
    for chunks in parts.values():
        if len(chunks) == 1:
            out.append(chunks[0])
        else:
            out.append(
                type(chunks[0])(
                    chunks[0].labels,
                    np.concatenate([c.timestamps for c in chunks]),
                    np.concatenate([c.values for c in chunks]),
                )
            )
    return out


def bounded_range(
    client: RangeClient, query: str, start: float, end: float, step: float, max_points: int
) -> list[Any]:
    """`client.range` in parts of at most `max_points` grid points (the same grid: start + k*step), the
    parts' series joined by label set: a large job's window read in queries that each stay well inside
    Prometheus' point limit and the client's timeout."""
    return join_parts(client.range(query, a, b, step) for a, b in range_parts(start, end, step, max_points))


def missing_reason(signal: Signal, found_metric: bool) -> str:
    """Human reason for a missing signal (shown next to the empty chart and in readiness)."""
    if signal.group == ENGINE_GROUP:  # a serving engine's counter, joined by the job's label selector
        if found_metric:
            return "the serving engine's counter exists but has no samples for this job in the window"
        return (
            f"not exported: no {' or '.join(signal.metrics)} series carrying the job's selector labels "
            f"({signal.enable_line})"
        )
    if found_metric:
        return "the metric exists but has no samples for this job's GPUs in the window"
    if not signal.default_enabled:
        return f"not collected: off in dcgm-exporter's default counters ({signal.enable_line})"
    return "not collected although in the default counters: is the exporter scraped on these nodes?"


def fetch_job_signals(
    client: RangeClient,
    selector: Selector,
    start: float,
    end: float,
    step: float,
    *,
    keys: Iterable[str] | None = None,
    per_gpu_step: float | None = None,
    rate_window_s: float | None = None,
    aggregates: bool = True,
    stats_here: bool = False,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
    max_samples: float | None = None,
    gpus_hint: int = 1,
    fetcher: Submitter | None = None,
    registry: Mapping[str, Signal] | None = None,
    name_regex: str = DCGM_NAME_REGEX,
) -> JobSignals:
    """Read a job's signals: 1 presence query, then 1 aggregate (+1 per-GPU) range query per signal.

    Every grid point t stands for the window (t - step, t] of its grid (`base_vector`): the aggregate
    grid is start, start + step, ... as requested (ingestion passes a start aligned to the step); the
    per-GPU grid always lies on multiples of `per_gpu_step` on the Unix clock, from the first one at or
    after `start`, which is where `jobs.metrics.archive` puts it back, so per-GPU rows never shift or
    collide on reload. `per_gpu_step` None skips the per-GPU matrices; `aggregates=False` reads only those
    (signals then carry empty stats). Counters use `rate_window_s`, by default
    `jobs.metrics.sampling.rate_window_s`, and never a window shorter than the grid's step.
    `scrape_interval_s` scales the SAMPLED coverage stat. Queries name only the metric spellings the
    presence look-up found (`X` or `X_RATIO`, not both OR-ed: that costs Prometheus 2.6-3x). `max_samples`
    bounds the raw samples one range query may read (finalize of a large job): the range is split on the
    same grid into parts of at most that many samples across the job's GPUs, so no single query can run
    into the client's timeout (`gpus_hint`: the job's GPUs; read one by one, the bound also rises to the
    GPUs the aggregates count as they are read).

    `stats_here` (a finalize): each signal's cross-GPU stats are computed here (`jobs.metrics.cross_gpu`) from
    one per-series read of its per-GPU expression, plus the server-side SAMPLED sum, instead of one
    `aggregate_query` in which Prometheus evaluates that expression once per stat: each raw sample is read
    twice instead of five times, for the same stats (see `cross_gpu` for how they match Prometheus').

    `fetcher` (a finalize: `jobs.metrics.prometheus.RangeFetcher`): every signal's aggregate queries (all
    their parts) are sent ahead and read in signal order, then every per-GPU query of the signals that
    have data. The same queries on the same grids, so the same result as one by one (a grid point's value
    depends only on its time, not on how the range was cut); only the cut can differ, since the bound
    then uses `gpus_hint` for every aggregate query.

    `registry` / `name_regex`: another registry's signals and its presence look-up's names (the serving
    engines' counters, jobs.metrics.engine_signals); default the DCGM fields.
    """
    if not scrape_interval_s > 0:
        raise ValueError(f"scrape interval must be positive, got {scrape_interval_s}")
    window = max(rate_window_s or _rate_window(step, scrape_interval_s), step)
    duration(window)  # validates
    signals = SIGNALS if registry is None else registry
    wanted = [signals[k] for k in (keys if keys is not None else signals)]
    present = set(client.label_values("__name__", selector.series_selectors(name_regex), start, end))
    ts = grid(start, end, step)
    result = JobSignals(start, end, step, ts)
    gpus = float(max(1, gpus_hint))  # raised to the GPUs counted by the aggregates, as they are read

    def cuts(t0: float, t1: float, step_s: float) -> list[tuple[float, float]]:
        if max_samples is None:
            return [(t0, t1)]  # the client splits at Prometheus' point limit itself
        # Samples per grid point across the GPUs: each GPU has step / scrape samples in each window.
        per_point = max(1.0, gpus) * max(1.0, step_s / scrape_interval_s)
        return range_parts(t0, t1, step_s, max(2, int(max_samples // per_point)))

    def send(query: str, t0: float, t1: float, step_s: float) -> list[Future[Sequence[Any]]]:
        if fetcher is not None:
            return [fetcher.submit(query, a, b, step_s) for a, b in cuts(t0, t1, step_s)]
        done: Future[Sequence[Any]] = Future()  # one by one: read now, on the bound as it stands
        try:
            parts = cuts(t0, t1, step_s)
            done.set_result(
                client.range(query, t0, t1, step_s) if max_samples is None
                else join_parts(client.range(query, a, b, step_s) for a, b in parts)
            )  # fmt: skip
        except Exception as exc:  # raised where the answer is read, as a sent-ahead query's would be
            done.set_exception(exc)
        return [done]

    def answer(sent: list[Future[Sequence[Any]]]) -> list[Any]:
        return join_parts(f.result() for f in sent)

    def per_gpu_sent(sig: Signal, metrics: list[str]) -> tuple[np.ndarray, list[Future[Sequence[Any]]]]:
        assert per_gpu_step is not None
        g0 = lattice_point(start, per_gpu_step)
        g1 = max(end, g0)  # a window shorter than one per-GPU step still gets the point closing it
        gwindow = max(rate_window_s or _rate_window(per_gpu_step, scrape_interval_s), per_gpu_step)
        query = per_gpu_query(sig, selector, gwindow, step_s=per_gpu_step, metrics=metrics)
        return grid(g0, g1, per_gpu_step), send(query, g0, g1, per_gpu_step)

    def aggregates_sent(sig: Signal, metrics: list[str]) -> Callable[[], dict[str, np.ndarray]]:
        """Send `sig`'s cross-GPU stats query (or, `stats_here`, its per-series and SAMPLED queries); the
        returned call reads the answers into {stat: values on `ts`}."""
        if not stats_here:
            query = aggregate_query(
                sig, selector, window, step_s=step, scrape_interval_s=scrape_interval_s, metrics=metrics
            )
            sent = send(query, start, end, step)
            return lambda: stats_from_series(answer(sent), ts)
        rows = send(base_vector(sig, selector, window, step_s=step, metrics=metrics), start, end, step)
        sampled_query = sampled_vector(
            sig, selector, step_s=step, scrape_interval_s=scrape_interval_s, metrics=metrics
        )
        sampled = send(sampled_query, start, end, step)

        def read() -> dict[str, np.ndarray]:
            stats = stats_from_rows(sig, answer(rows), ts)
            for s in answer(sampled):  # one series (a `sum` without `by`), none without samples
                stats[SAMPLED] = s.on_grid(ts)
            return stats

        return read

    found_names = {sig.key: [m for m in sig.names if m in present] for sig in wanted}
    ahead: dict[str, Callable[[], dict[str, np.ndarray]]] = {}
    if aggregates and fetcher is not None:
        for sig in wanted:
            if found_names[sig.key]:
                ahead[sig.key] = aggregates_sent(sig, found_names[sig.key])
    later: list[tuple[SignalSeries, np.ndarray, list[Future[Sequence[Any]]]]] = []
    for sig in wanted:
        metrics = found_names[sig.key]
        if not metrics:
            result.missing[sig.key] = missing_reason(sig, False)
            continue
        stats: dict[str, np.ndarray] = {}
        if aggregates:
            read = ahead.get(sig.key) or aggregates_sent(sig, metrics)
            stats = read()
            # `count` is NaN wherever no GPU reported; `or vector(0)` lines do not count as data.
            if COUNT not in stats or np.isnan(stats[COUNT]).all():
                result.missing[sig.key] = missing_reason(sig, True)
                continue
            gpus = max(gpus, float(np.nanmax(stats[COUNT])))
        series = SignalSeries(sig.key, sig.unit, ts, stats)
        if per_gpu_step:
            gts, sent = per_gpu_sent(sig, metrics)
            if fetcher is None:  # one by one: this signal's rows now
                series.gpus, series.per_gpu = per_gpu_matrix(answer(sent), gts)
                series.gpu_timestamps = gts
            else:
                later.append((series, gts, sent))
        result.signals[sig.key] = series
    for series, gts, sent in later:
        series.gpus, series.per_gpu = per_gpu_matrix(answer(sent), gts)
        series.gpu_timestamps = gts
    return result
