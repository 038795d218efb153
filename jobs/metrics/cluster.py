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

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from jobs.metrics.engine_signals import (
    ENGINE_NAME_REGEX,
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
from jobs.metrics.promql import (
    HOST_LABEL_SPELLINGS,
    Matcher,
    Selector,
    label_spellings,
    promql_string,
    regex_any,
)
from jobs.metrics.sampling import DEFAULT_SCRAPE_INTERVAL_S, lattice_point, step_window_s
from jobs.metrics.sampling import rate_window_s as _rate_window
from jobs.metrics.signal_queries import (
    DCGM_NAME_REGEX,
    aggregate_query,
    base_vector,
    missing_reason,
    per_gpu_matrix,
    per_gpu_query,
    stats_from_series,
)
from jobs.metrics.signals import (
    COUNT,
    ENGINE_SIGNALS,
    MAX,
    MEAN,
    MIN,
    NONZERO,
    SAMPLED,
    SIGNALS,
    THROTTLE_BITS,
    GpuKey,
    JobSignals,
    Signal,
    SignalSeries,
    grid,
)

_VALUE, _SAMPLES = "value", "samples"  # stat tags of the per-GPU aggregate read (explicit GPU lists)


class CycleClient(Protocol):
    """What a cycle needs from a client (PrometheusClient satisfies it)."""

    def range(self, query: str, start: Any, end: Any, step: float | None = None) -> Sequence[Any]: ...

    def label_values(
        self, label: str, match: Sequence[str] = (), start: Any = None, end: Any = None
    ) -> list[str]: ...

    def label_names(self, match: Sequence[str] = (), start: Any = None, end: Any = None) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class Discovery:
    """Which DCGM metric names and which label names Prometheus holds in the cycle's window."""

    metrics: frozenset[str]
    labels: frozenset[str]

    def names(self, signal: Signal) -> tuple[str, ...]:
        """The signal's metric names that exist (preferred first); empty when it is not collected."""
        return tuple(m for m in signal.names if m in self.metrics)  # DCGM names, then aliases

    @property
    def host_labels(self) -> tuple[str, ...]:
        """The host-label spellings that exist, in `HOST_LABEL_SPELLINGS` order."""
        return tuple(n for n in HOST_LABEL_SPELLINGS if n in self.labels)


def discover(client: CycleClient, start: float, end: float, name_regex: str = DCGM_NAME_REGEX) -> Discovery:
    """Two requests: DCGM metric names and the label names on DCGM series in [start, end] (`name_regex`:
    another registry's names, e.g. the serving engines' counters)."""
    match = [f"{{__name__=~{promql_string(name_regex)}}}"]
    names = client.label_values("__name__", match, start, end)
    labels = client.label_names(match, start, end)
    return Discovery(frozenset(names), frozenset(labels))


@dataclass(frozen=True, slots=True)
class Target:
    """One running job as the cycle sees it: how it is selected and which window it needs.

    `start`/`end`: the aggregate grid (start on the step's grid); `gpu_start`: where its per-GPU rows are
    read from; `per_gpu`: whether this cycle reads them (a cycle reads them for the jobs whose turn it
    is, jobs.metrics.ingest.per_gpu_due). Exactly one of `labels` (a label selector, as stored) and `gpus`
    ((host, gpu) pairs). `engine`: the job serves a model, so the cycle also reads its serving engine's
    FLOP counters (jobs.metrics.engine_signals), joined by its label selector.
    """

    key: int
    start: float
    end: float
    gpu_start: float
    labels: Mapping[str, Any] | None = None
    gpus: tuple[tuple[str, str], ...] = ()
    per_gpu: bool = True
    engine: bool = False


@dataclass(slots=True)
class _Group:
    """Jobs read by the same queries: label groups by their (spelled) label names, or explicit GPUs."""

    labels: tuple[str, ...]  # label names to aggregate by; () = the explicit-GPU group
    selector: Selector
    members: list[tuple[Target, tuple[str, ...]]] = field(default_factory=list)  # (target, label values)


@dataclass(slots=True)
class CycleResult:
    """Per job key: its signals, or an error (the group's query failed), or fallback to a per-job poll."""

    signals: dict[int, JobSignals] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    fallback: list[int] = field(default_factory=list)
    queries: int = 0


def plan(targets: Iterable[Target], discovery: Discovery) -> tuple[list[_Group], list[int]]:
    """Groups of targets read together, and the keys that need a per-job poll."""
    by_labels: dict[tuple[str, ...], list[tuple[Target, tuple[str, ...]]]] = defaultdict(list)
    explicit: list[Target] = []
    fallback: list[int] = []
    for t in targets:
        if t.gpus:
            if discovery.host_labels:
                explicit.append(t)
            else:
                fallback.append(t.key)
            continue
        spelled = _spelled(t.labels or {}, discovery)
        if spelled is None:
            fallback.append(t.key)
            continue
        names = tuple(sorted(spelled))
        by_labels[names].append((t, tuple(spelled[n] for n in names)))
    groups: list[_Group] = []
    for names, members in sorted(by_labels.items()):
        selector = _selector_of(names, members, discovery)
        assert selector is not None  # a label group's selector always exists
        groups.append(_Group(names, selector, members))
    if explicit:
        union = _selector_of((), [(t, ()) for t in explicit], discovery)
        if union is None:  # pragma: no cover - host_labels was non-empty
            fallback += [t.key for t in explicit]
        else:
            groups.append(_Group((), union, [(t, ()) for t in explicit]))
    return groups, fallback


def _spelled(labels: Mapping[str, Any], discovery: Discovery) -> dict[str, str] | None:
    """{spelling that exists: exact value} for a groupable label selector, else None (regex values, no
    or several spellings of one label present, or anything the selector builder would refuse)."""
    if not isinstance(labels, Mapping) or not labels:
        return None
    out: dict[str, str] = {}
    for name, value in labels.items():
        if not isinstance(value, str) or not value:
            return None
        try:
            spellings = [s for s in label_spellings(name) if s in discovery.labels]
        except ValueError:
            return None
        if len(spellings) != 1 or spellings[0] in out:
            return None
        out[spellings[0]] = value
    return out


def _any(name: str, values: Sequence[str]) -> Matcher:
    uniq = sorted(set(values))
    return Matcher(name, "=", uniq[0]) if len(uniq) == 1 else Matcher(name, "=~", regex_any(uniq))


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
    groups: list[_Group] = []
    span = (MAX_POINTS_PER_SERIES - 1) * step if catch_up_s is None else catch_up_s
    for bucket in _rounds(targets, max_spread_s, span):
        found, fallback = plan(bucket, discovery)
        groups += found
        result.fallback += fallback
    fetcher = RangeFetcher(client, workers, name="poll-cycle")
    try:
        for group in groups:
            try:
                result.queries += _read_group(
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
    for bucket in _rounds(labelled, max_spread_s, span):
        groups, fallback = plan(bucket, found)
        alone += fallback
        for group in groups:
            try:
                queries += _read_group(fetcher, group, found, engines, step, None, scrape, ENGINE_SIGNALS)
            except Exception as exc:
                _engine_failed(result, [t for t, _ in group.members], exc)
    by_key = {t.key: t for t in labelled}
    for key, sigs in engines.signals.items():
        add_engine_signals(result.signals[key], sigs.signals, sigs.missing)
    for key in alone:
        t = by_key[key]
        if not _could_match(t.labels or {}, found):
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
    groups: Sequence[_Group],
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
    group: _Group,
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
    selector = _selector_of(group.labels, members, discovery) or group.selector
    seen = selector.select_range(discovery.names(sig), "last_over_time", hi - lo + step)
    query = f"group by ({', '.join((*group.labels, *discovery.host_labels))}) ({seen})"
    sub = _Group(group.labels, selector, list(members))
    split = _split(fetcher.submit(query, hi, hi, step).result(), sub)
    out: dict[int, list[str]] = {}
    for t, _ in members:
        names = sorted({_gpu_key(s.labels)[0] for s in split.get(t.key, [])} - {""})
        if names:
            out[t.key] = names
    return out


def _hosts_failed(result: CycleResult, keys: Sequence[int], exc: Exception) -> None:
    why = f"host signals not read: {type(exc).__name__}: {exc}"[:300]
    for key in keys:
        if key in result.signals:
            sigs = result.signals[key]
            sigs.missing.update({k: why for k in HOST_SIGNALS if k not in sigs.signals})


def _could_match(labels: Mapping[str, Any], discovery: Discovery) -> bool:
    """Whether every label of a selector exists (in some spelling) on the discovered series; True when a
    name cannot be checked (the read then says what is wrong with it)."""
    try:
        return all(any(s in discovery.labels for s in label_spellings(name)) for name in labels)
    except ValueError:
        return True


def _engine_failed(result: CycleResult, targets: Sequence[Target], exc: Exception) -> None:
    why = f"engine signals not read: {type(exc).__name__}: {exc}"[:300]
    for t in targets:
        if t.key in result.signals:
            result.signals[t.key].missing.update(dict.fromkeys(ENGINE_SIGNALS, why))


#: Range queries a poll cycle keeps in flight (`read_cycle(workers=)`): Prometheus evaluates one query
#: per core, and this process is busy decoding and splitting the previous answer meanwhile; two keep
#: both busy on the 2-core machine measured in issue #14 (more only queue inside Prometheus).
CYCLE_QUERY_WORKERS = 2


def _rounds(targets: Sequence[Target], max_spread_s: float, catch_up_s: float) -> list[list[Target]]:
    """The up-to-date targets (window start within `max_spread_s` of the newest start) as one round, and
    the ones far behind in rounds of their own, sorted by start and cut where a start lies more than
    `catch_up_s` after its round's first one: rounds bounded by the spread of the starts, not by the
    number of jobs behind. Catch-up rounds first (oldest first), the up-to-date round last."""
    ordered = sorted(targets, key=lambda t: t.start)
    if not ordered:
        return []
    newest = ordered[-1].start
    current = [t for t in ordered if newest - t.start <= max_spread_s]
    rounds: list[list[Target]] = []
    for t in ordered[: len(ordered) - len(current)]:  # the rest, all earlier than every current start
        if rounds and t.start - rounds[-1][0].start <= catch_up_s:
            rounds[-1].append(t)
        else:
            rounds.append([t])
    rounds.append(current)
    return rounds


def _read_group(
    fetcher: RangeFetcher,
    group: _Group,
    discovery: Discovery,
    result: CycleResult,
    step: float,
    per_gpu_step: float | None,
    scrape: float,
    registry: Mapping[str, Signal] = SIGNALS,
) -> int:
    queries = 0
    g0 = min(t.start for t, _ in group.members)
    g1 = max(t.end for t, _ in group.members)
    window = max(_rate_window(step, scrape), step)
    grids = {t.key: grid(t.start, t.end, step) for t, _ in group.members}
    out = {t.key: JobSignals(t.start, t.end, step, grids[t.key]) for t, _ in group.members}
    # Every signal's aggregate query first (in flight together with a pooled fetcher), then the answers
    # in signal order; each per-GPU query once its signal's answer says which jobs have it.
    asked: list[tuple[Signal, tuple[str, ...], Future[Sequence[Any]]]] = []
    for sig in registry.values():
        names = discovery.names(sig)
        if not names:
            for t, _ in group.members:
                out[t.key].missing[sig.key] = missing_reason(sig, False)
            continue
        if group.labels:
            query = aggregate_query(
                sig, group.selector, window, step_s=step, scrape_interval_s=scrape,
                by=group.labels, metrics=names,
            )  # fmt: skip
        else:
            query = _per_series_query(sig, group.selector, window, step, names)
        asked.append((sig, names, fetcher.submit(query, g0, g1, step)))
        queries += 1
    wide: list[tuple[Signal, list[tuple[Target, tuple[str, ...]]], float, Future[Sequence[Any]]]] = []
    for sig, names, answer in asked:
        split = _split(answer.result(), group)
        for t, _ in group.members:
            ts = grids[t.key]
            mine = split.get(t.key, [])
            if group.labels:
                stats = stats_from_series(mine, ts)
                if NONZERO in sig.stats:
                    # The per-job query's `or vector(0)`: no GPU with a code is 0, on every grid point.
                    stats[NONZERO] = np.nan_to_num(stats.get(NONZERO, np.full(ts.size, np.nan)), nan=0.0)
            else:
                stats = _stats_from_gpu_series(sig, mine, ts, scrape / step)
            if COUNT not in stats or np.isnan(stats[COUNT]).all():
                out[t.key].missing[sig.key] = missing_reason(sig, False)
                continue
            out[t.key].signals[sig.key] = SignalSeries(sig.key, sig.unit, ts, stats)
        if per_gpu_step:
            request = _per_gpu_request(sig, names, group, discovery, out, g1, per_gpu_step, scrape)
            if request is not None:
                wanting, lo, query = request
                wide.append((sig, wanting, lo, fetcher.submit(query, lo, max(g1, lo), per_gpu_step)))
                queries += 1
    for sig, wanting, _, answer in wide:
        split = _split(answer.result(), group)
        for t, _ in wanting:
            g0t = lattice_point(t.gpu_start, per_gpu_step or step)
            gts = grid(g0t, max(t.end, g0t), per_gpu_step or step)
            series = out[t.key].signals[sig.key]
            series.gpus, series.per_gpu = per_gpu_matrix(split.get(t.key, []), gts)
            series.gpu_timestamps = gts
    result.signals.update(out)
    return queries


def _per_gpu_request(
    sig: Signal,
    names: tuple[str, ...],
    group: _Group,
    discovery: Discovery,
    out: dict[int, JobSignals],
    g1: float,
    per_gpu_step: float,
    scrape: float,
) -> tuple[list[tuple[Target, tuple[str, ...]]], float, str] | None:
    """The per-GPU query of a signal for the group's jobs that have it and whose per-GPU rows this cycle
    reads (`Target.per_gpu`): (those jobs, the query's start on the per-GPU lattice, the query, which
    selects only them); None when there are none."""
    wanting = [(t, v) for t, v in group.members if t.per_gpu and sig.key in out[t.key].signals]
    if not wanting:
        return None
    lo = min(lattice_point(t.gpu_start, per_gpu_step) for t, _ in wanting)
    gwindow = max(_rate_window(per_gpu_step, scrape), per_gpu_step)
    by = (*group.labels, *discovery.host_labels)
    selector = _selector_of(group.labels, wanting, discovery) if len(wanting) < len(group.members) else None
    query = per_gpu_query(sig, selector or group.selector, gwindow, step_s=per_gpu_step, by=by, metrics=names)
    return wanting, lo, query


def _selector_of(
    labels: tuple[str, ...], members: Sequence[tuple[Target, tuple[str, ...]]], discovery: Discovery
) -> Selector | None:
    """The selector of `members` (a group's, or the part of it a query reads): each job label matching any
    of their values (a superset where a group has several labels: `_split` keeps each job's own series),
    or, for explicit GPUs (`labels` empty), their (host, gpu) pairs in the spellings that exist (None when
    no host label exists)."""
    if labels:
        return Selector([[_any(n, [values[i] for _, values in members]) for i, n in enumerate(labels)]])
    refs = sorted({pair for t, _ in members for pair in t.gpus})
    return Selector.from_gpus([{"hostname": h, "gpu": g} for h, g in refs]).restricted(discovery.labels)


def _split(series: Sequence[Any], group: _Group) -> dict[int, list[Any]]:
    """Result series per job key: by label values for label groups, by (host, gpu) for explicit GPUs."""
    out: dict[int, list[Any]] = defaultdict(list)
    if group.labels:
        owners: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for t, values in group.members:
            owners[values].append(t.key)
        for s in series:
            for key in owners.get(tuple(s.labels.get(n, "") for n in group.labels), ()):
                out[key].append(s)
        return out
    gpu_owners: dict[tuple[str, str], list[int]] = defaultdict(list)
    for t, _ in group.members:
        for pair in t.gpus:
            gpu_owners[pair].append(t.key)
    for s in series:
        k = GpuKey(*_gpu_key(s.labels))
        for key in gpu_owners.get((k.hostname, k.gpu), ()):
            out[key].append(s)
    return out


def _gpu_key(labels: Mapping[str, str]) -> tuple[str, str]:
    host = next((labels[n] for n in HOST_LABEL_SPELLINGS if labels.get(n)), "")
    return host, labels.get("gpu", "")


def _per_series_query(
    sig: Signal, selector: Selector, window: float, step: float, names: Sequence[str]
) -> str:
    """Every selected series' step value and its raw sample count, tagged `stat` value/samples, for the
    cross-GPU stats to be taken here (the explicit-GPU group has no job label to aggregate by)."""
    base = base_vector(sig, selector, window, step_s=step, metrics=names)
    counted = selector.select_range(names, "count_over_time", step_window_s(step))
    return (
        f'label_replace({base}, "stat", "{_VALUE}", "", "") or '
        f'label_replace(({counted}), "stat", "{_SAMPLES}", "", "")'
    )


def _stats_from_gpu_series(
    sig: Signal, series: Sequence[Any], ts: np.ndarray, ratio: float
) -> dict[str, np.ndarray]:
    """The stats `aggregate_query` computes in Prometheus, from per-series values and sample counts:
    mean/min/max/count over the series reporting at each point (NaN where none), NONZERO 0 where none
    has a code (`or vector(0)`), the share of reporting series with each throttle bit, SAMPLED = all
    samples x scrape / step (NaN where no series has a sample)."""
    values = [s.on_grid(ts) for s in series if s.labels.get("stat") == _VALUE]
    counts = [s.on_grid(ts) for s in series if s.labels.get("stat") == _SAMPLES]
    v = np.vstack(values) if values else np.full((0, ts.size), np.nan)
    ok = np.isfinite(v)
    n = ok.sum(axis=0).astype(np.float64)
    have = n > 0
    count = np.where(have, n, np.nan)
    out: dict[str, np.ndarray] = {}
    filled = np.where(ok, v, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        for stat in sig.stats:
            if stat == COUNT:
                out[COUNT] = count
            elif stat == MEAN:
                out[MEAN] = np.where(have, filled.sum(axis=0) / np.where(have, n, 1.0), np.nan)
            elif stat == MIN:
                out[MIN] = np.where(have, np.where(ok, v, np.inf).min(axis=0, initial=np.inf), np.nan)
            elif stat == MAX:
                out[MAX] = np.where(have, np.where(ok, v, -np.inf).max(axis=0, initial=-np.inf), np.nan)
            elif stat == NONZERO:
                out[NONZERO] = (ok & (filled != 0)).sum(axis=0).astype(np.float64)
            else:
                bit = THROTTLE_BITS[stat]
                set_bit = np.where(ok, np.mod(np.floor(filled / bit), 2), 0.0)
                out[stat] = np.where(have, set_bit.sum(axis=0) / np.where(have, n, 1.0), np.nan)
    c = np.vstack(counts) if counts else np.full((0, ts.size), np.nan)
    cok = np.isfinite(c)
    out[SAMPLED] = np.where(cok.any(axis=0), np.where(cok, c, 0.0).sum(axis=0) * ratio, np.nan)
    return out


def settled_until(sigs: JobSignals) -> float | None:
    """The last grid time up to which every present signal has data across the job's GPUs: from each
    signal's first data point on (a rate has none at the job's first point), every point has that
    signal's full GPU count (its most GPUs in the window). The window's first point when nothing is
    settled yet; None when no signal has any data. A point where some GPU has no sample yet (a late
    scrape, a replica behind) ends the settled run, so the next poll re-reads from there.
    """
    ts = sigs.timestamps
    full = np.ones(ts.size, dtype=bool)
    any_data = False
    for s in sigs.signals.values():
        c = None if s.count is None else np.asarray(s.count, dtype=np.float64)
        if c is None or c.size != ts.size or not np.isfinite(c).any():
            continue
        any_data = True
        ok = np.isfinite(c)
        first = int(np.argmax(ok))  # points before the signal's first sample are not late data
        full[first:] &= (ok & (np.where(ok, c, -1.0) >= np.nanmax(c)))[first:]
    if not any_data:
        return None
    bad = np.flatnonzero(~full)
    if bad.size == 0:
        return float(ts[-1])
    return float(ts[max(int(bad[0]) - 1, 0)])
