"""The cluster-wide poll cycle: each signal is read once for all running jobs, then split per job.

Pure (numpy and the Prometheus client; no Django). `jobs.pipeline.poll.poll_cycle` builds a `Target` per
running job, calls `read_cycle`, and archives each job's `JobSignals` exactly as a per-job poll would.

Why: a per-job poll sends ~44 requests per job (presence look-up, one aggregate and one per-GPU query per
signal, each OR-ing every label spelling and metric name), so 1,000 GPUs took 75-89 s per cycle with
5,500 requests. Here one cycle sends

- 2 discovery requests: which DCGM metric names (`X` or DCGM 4.6's `X_RATIO`) and which label names
  (`Hostname`/`hostname`/`exported_*`, `hpc_job`/`exported_hpc_job`) exist in the window, so every query
  names only the spelling that exists (the OR of all alternatives made one aggregate query 2.6-3x more
  expensive in Prometheus);
- per present signal and group, one aggregate query: jobs selected by exact label values (`hpc_job`, or
  `namespace` + `pod`) are one group per label-name set, aggregated on the server `avg/min/max/count by
  (<job labels>)`; jobs with explicit GPU lists are one group read per GPU (`Hostname`, `gpu`) and
  aggregated here (a GPU carries no job label to group by);
- for the jobs whose per-GPU turn it is (each job every POLL_PER_GPU_STEP_S, a fifth of them per cycle),
  one per-GPU query per present signal and group.

So requests per cycle grow with the number of signals, not of jobs. Selectors that cannot be grouped
(regex values, a label stored under two spellings at once, nothing to match) are returned as `fallback`
for the per-job path. The per-job numbers are the same as the per-job queries': the same `*_over_time`
windows on the same grid (a grid point's value depends only on its time, so one grid serves every job
whose start lies on it), the same stats (SAMPLED included), the same missing rules.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jobs.metrics.cycle_groups import (
    CycleClient,
    CycleResult,
    Discovery,
    Group,
    Target,
    could_match,
    discover,
    gpu_key,
    plan,
    read_group,
    rounds,
    selector_of,
    split_series,
)
from jobs.metrics.engine_signals import (
    ENGINE_NAME_REGEX,
    ENGINE_SIGNALS,
    NOT_JOINABLE,
    add_engine_signals,
    fetch_engine_signals,
)
from jobs.metrics.host_signals import (
    HOST_SIGNALS,
    HOSTS_UNKNOWN,
    HostJoin,
    add_host_signals,
    fetch_host_signals_bulk,
    job_hosts,
)
from jobs.metrics.prometheus import MAX_POINTS_PER_SERIES, RangeFetcher
from jobs.metrics.sampling import DEFAULT_SCRAPE_INTERVAL_S
from jobs.metrics.signal_queries import (
    missing_reason,
)
from jobs.metrics.signals import SIGNALS, JobSignals


def read_cycle(
    client: CycleClient,
    targets: Sequence[Target],
    *,
    step: float,
    per_gpu_step: float | None,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
    discovery: Discovery | None = None,
    max_spread_s: float = 900.0,
    catch_up_s: float | None = None,
    workers: int = 1,
    host_join: HostJoin | None = None,
) -> CycleResult:
    """Read every target's signals with a fixed number of queries per signal (see the module docstring).

    `workers` > 1: that many range queries in flight at once (`prometheus.RangeFetcher`; a plain
    PrometheusClient only), so Prometheus evaluates the next query while this process decodes and splits
    the last one.

    `per_gpu_step` None skips the per-GPU matrices (cycles between per-GPU reads). Jobs far behind (a
    first poll, a catch-up after an outage: window start more than `max_spread_s` before the newest start)
    are read apart from the up-to-date ones, whose windows they would otherwise widen, and together with
    each other (#26 item 3): one round per `catch_up_s` of window starts (default: Prometheus' points per
    series at `step`, ~91 h at 30 s), each query of which the client splits at that point limit. So a
    cycle sends at most 1 + ceil(spread of the starts / catch_up_s) rounds of queries, whatever the number
    of new jobs (was one round per 15 minutes of spread: 11 new jobs cost 316 requests).
    Prometheus errors bubble up from discovery; a failed group query marks that group's jobs (`errors`),
    not the others.

    `host_join` (NODE_EXPORTER_HOST_LABEL set): node_exporter's host signals of every job with hosts, in
    bulk (`_read_hosts`: 1 presence request + 1 query per present host signal for the cycle, plus 1 host
    look-up per label group whose jobs' per-GPU rows this cycle does not read), the rows a per-job poll's
    `attach_host_signals` gives.
    """
    result = CycleResult()
    if not targets:
        return result
    if discovery is None:
        lo = min(t.start for t in targets)
        hi = max(t.end for t in targets)
        discovery = discover(client, lo, hi)
        result.queries += 2
    groups: list[Group] = []
    span = (MAX_POINTS_PER_SERIES - 1) * step if catch_up_s is None else catch_up_s
    for bucket in rounds(targets, max_spread_s, span):
        found, fallback = plan(bucket, discovery)
        groups += found
        result.fallback += fallback
    fetcher = RangeFetcher(client, workers, name="poll-cycle")
    try:
        for group in groups:
            try:
                result.queries += read_group(
                    fetcher, group, discovery, result, step, per_gpu_step, scrape_interval_s
                )
            except Exception as exc:  # one failed group must not stop the cycle
                reason = f"{type(exc).__name__}: {exc}"
                for t, _ in group.members:
                    result.errors[t.key] = reason
                    result.signals.pop(t.key, None)
        result.queries += _read_engines(client, fetcher, targets, result, step, scrape_interval_s,
                                        max_spread_s, span)  # fmt: skip
        if host_join is not None:
            result.queries += _read_hosts(client, fetcher, groups, discovery, result, step, host_join)
    finally:
        fetcher.close()
    return result


def _read_engines(
    client: CycleClient,
    fetcher: RangeFetcher,
    targets: Sequence[Target],
    result: CycleResult,
    step: float,
    scrape: float,
    max_spread_s: float,
    span: float,
) -> int:
    """The serving engines' counters of the cycle's `engine` targets, added to their signals: one
    discovery (2 requests) on the engines' names and labels, then per present counter one aggregate
    query per label group, as the GPU signals are read (a selector that cannot be grouped, e.g. a regex
    value, is read on its own). Targets with explicit GPU lists have nothing to join on (NOT_JOINABLE).
    Auxiliary: a failed engine read leaves the engine signals missing with the error, never fails a job.
    Returns the requests sent."""
    wanting = [t for t in targets if t.engine and t.key in result.signals]
    for t in wanting:
        if not t.labels:
            result.signals[t.key].missing.update(dict.fromkeys(ENGINE_SIGNALS, NOT_JOINABLE))
    labelled = [t for t in wanting if t.labels]
    if not labelled:
        return 0
    queries = 2
    try:
        found = discover(
            client, min(t.start for t in labelled), max(t.end for t in labelled), ENGINE_NAME_REGEX
        )
    except Exception as exc:
        _engine_failed(result, labelled, exc)
        return queries
    engines = CycleResult()
    alone: list[int] = []
    for bucket in rounds(labelled, max_spread_s, span):
        groups, fallback = plan(bucket, found)
        alone += fallback
        for group in groups:
            try:
                queries += read_group(fetcher, group, found, engines, step, None, scrape, ENGINE_SIGNALS)
            except Exception as exc:
                _engine_failed(result, [t for t, _ in group.members], exc)
    by_key = {t.key: t for t in labelled}
    for key, sigs in engines.signals.items():
        add_engine_signals(result.signals[key], sigs.signals, sigs.missing)
    for key in alone:
        t = by_key[key]
        if not could_match(t.labels or {}, found):
            # A label no engine series carries (e.g. hpc_job): nothing can match, no request needed.
            none = {k: missing_reason(sig, False) for k, sig in ENGINE_SIGNALS.items()}
            result.signals[key].missing.update(none)
            continue
        try:
            series, missing = fetch_engine_signals(
                client, t.labels, t.start, t.end, step, scrape_interval_s=scrape
            )
            queries += 1 + len(series)
        except Exception as exc:
            _engine_failed(result, [t], exc)
            continue
        add_engine_signals(result.signals[key], series, missing)
    return queries


def _read_hosts(
    client: CycleClient,
    fetcher: RangeFetcher,
    groups: Sequence[Group],
    discovery: Discovery,
    result: CycleResult,
    step: float,
    join: HostJoin,
) -> int:
    """node_exporter's host signals of the cycle's jobs, in bulk (#25: the cycle reads them as a per-job poll
    does, not only per-job polls and finalize). A job's hosts are those its GPUs carry, as the per-job
    poll takes them (`host_signals.job_hosts`): its per-GPU rows when this cycle read them, the hosts of
    an explicit GPU list, else one look-up per label group (which host labels its jobs' series carry in
    the window). Then `fetch_host_signals_bulk`: 1 presence request and 1 query per present host signal
    for all jobs. Auxiliary: a failed read leaves the host signals missing with the error. Returns the
    requests sent."""
    hosts: dict[int, list[str]] = {}
    queries = 0
    for group in groups:
        members = [(t, v) for t, v in group.members if t.key in result.signals]
        lacking: list[tuple[Target, tuple[str, ...]]] = []
        for t, v in members:
            known = job_hosts(result.signals[t.key]) or sorted({h for h, _ in t.gpus})
            if known:
                hosts[t.key] = known
            else:
                lacking.append((t, v))
        if lacking and group.labels:
            try:
                found = _group_hosts(fetcher, group, lacking, discovery, step)
                queries += 1
            except Exception as exc:
                _hosts_failed(result, [t.key for t, _ in lacking], exc)
                continue
            hosts.update(found)
    for key, sigs in result.signals.items():
        if key not in hosts:
            sigs.missing.update({k: HOSTS_UNKNOWN for k in HOST_SIGNALS if k not in sigs.signals})
    if not hosts:
        return queries
    try:
        read, sent = fetch_host_signals_bulk(
            client, {k: (h, result.signals[k].timestamps) for k, h in hosts.items()}, step, join=join
        )
    except Exception as exc:
        _hosts_failed(result, list(hosts), exc)
        return queries + 1
    for key, (series, missing) in read.items():
        add_host_signals(result.signals[key], series, missing)
    return queries + sent


def _group_hosts(
    fetcher: RangeFetcher,
    group: Group,
    members: Sequence[tuple[Target, tuple[str, ...]]],
    discovery: Discovery,
    step: float,
) -> dict[int, list[str]]:
    """The host names on each member job's GPU series in its window: one query for the group, the series of
    one signal (the first collected) grouped by the job labels and every host-label spelling."""
    sig = next((s for s in SIGNALS.values() if discovery.names(s)), None)
    if sig is None or not discovery.host_labels:
        return {}
    lo = min(t.start for t, _ in members)
    hi = max(t.end for t, _ in members)
    selector = selector_of(group.labels, members, discovery) or group.selector
    seen = selector.select_range(discovery.names(sig), "last_over_time", hi - lo + step)
    query = f"group by ({', '.join((*group.labels, *discovery.host_labels))}) ({seen})"
    sub = Group(group.labels, selector, list(members))
    split = split_series(fetcher.submit(query, hi, hi, step).result(), sub)
    out: dict[int, list[str]] = {}
    for t, _ in members:
        names = sorted({gpu_key(s.labels)[0] for s in split.get(t.key, [])} - {""})
        if names:
            out[t.key] = names
    return out


def _hosts_failed(result: CycleResult, keys: Sequence[int], exc: Exception) -> None:
    why = f"host signals not read: {type(exc).__name__}: {exc}"[:300]
    for key in keys:
        if key in result.signals:
            sigs = result.signals[key]
            sigs.missing.update({k: why for k in HOST_SIGNALS if k not in sigs.signals})


def _engine_failed(result: CycleResult, targets: Sequence[Target], exc: Exception) -> None:
    why = f"engine signals not read: {type(exc).__name__}: {exc}"[:300]
    for t in targets:
        if t.key in result.signals:
            result.signals[t.key].missing.update(dict.fromkeys(ENGINE_SIGNALS, why))


#: Range queries a poll cycle keeps in flight (`read_cycle(workers=)`): Prometheus evaluates one query
#: per core, and this process is busy decoding and splitting the previous answer meanwhile; two keep
#: both busy on the 2-core machine measured in issue #14 (more only queue inside Prometheus).
CYCLE_QUERY_WORKERS = 2


def settled_until(sigs: JobSignals) -> float | None:
    """The last grid time up to which every present signal has data across the job's GPUs: from each
    signal's first data point on (a rate has none at the job's first point), every point has that
    signal's full GPU count (its most GPUs in the window). The window's first point when nothing is
    settled yet; None when no signal has any data. A point where some GPU has no sample yet (a late
    scrape, a replica behind) ends the settled run, so the next poll re-reads from there.
    """
    ts = sigs.timestamps
    # Every signal's count as one row of a matrix, so the rule runs once per job, not once per signal.
    counts = [
        c for s in sigs.signals.values() if s.count is not None and (c := np.asarray(s.count)).size == ts.size
    ]
    if not counts:
        return None
    c = np.vstack(counts).astype(np.float64, copy=False).reshape(len(counts), ts.size)
    ok = np.isfinite(c)
    with_data = ok.any(axis=1)
    if not with_data.any():
        return None
    c, ok = c[with_data], ok[with_data]
    most = np.nanmax(c, axis=1, keepdims=True)  # each signal's full GPU count
    started = np.logical_or.accumulate(ok, axis=1)  # points before a signal's first sample are not late
    full = ((ok & (np.where(ok, c, -1.0) >= most)) | ~started).all(axis=0)
    bad = np.flatnonzero(~full)
    if bad.size == 0:
        return float(ts[-1])
    return float(ts[max(int(bad[0]) - 1, 0)])
