"""The poll cycle's grouped reads: which metric and label names exist (`discover`), which running jobs can be
read by the same queries (`plan`: label groups and the explicit-GPU group), and one query per group and signal
(`read_group`, with the per-GPU query of the jobs whose turn it is), split back per job (`split_series`).

Pure (numpy and the Prometheus client; no Django). `jobs.metrics.cluster.read_cycle` drives these reads for
the cluster's jobs and joins the serving engines' and hosts' signals on top; why the cycle reads this way
(requests grow with signals, not jobs) is in that module's docstring.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from jobs.metrics.prometheus import RangeFetcher
from jobs.metrics.promql import (
    HOST_LABEL_SPELLINGS,
    Matcher,
    Selector,
    label_spellings,
    promql_string,
    regex_any,
)
from jobs.metrics.sampling import lattice_point, rows_on_grids, step_window_s
from jobs.metrics.sampling import rate_window_s as _rate_window
from jobs.metrics.signal_queries import (
    DCGM_NAME_REGEX,
    aggregate_query,
    base_vector,
    missing_reason,
    per_gpu_matrices,
    per_gpu_query,
    stats_placed,
)
from jobs.metrics.signals import (
    COUNT,
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
class Group:
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


def plan(targets: Iterable[Target], discovery: Discovery) -> tuple[list[Group], list[int]]:
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
        spelled = spelled_labels(t.labels or {}, discovery)
        if spelled is None:
            fallback.append(t.key)
            continue
        names = tuple(sorted(spelled))
        by_labels[names].append((t, tuple(spelled[n] for n in names)))
    groups: list[Group] = []
    for names, members in sorted(by_labels.items()):
        selector = selector_of(names, members, discovery)
        assert selector is not None  # a label group's selector always exists
        groups.append(Group(names, selector, members))
    if explicit:
        union = selector_of((), [(t, ()) for t in explicit], discovery)
        if union is None:  # pragma: no cover - host_labels was non-empty
            fallback += [t.key for t in explicit]
        else:
            groups.append(Group((), union, [(t, ()) for t in explicit]))
    return groups, fallback


def spelled_labels(labels: Mapping[str, Any], discovery: Discovery) -> dict[str, str] | None:
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


def rounds(targets: Sequence[Target], max_spread_s: float, catch_up_s: float) -> list[list[Target]]:
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


def read_group(
    fetcher: RangeFetcher,
    group: Group,
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
        answered = answer.result()
        # Label groups: every job's series of the answer found and placed on its grid, one pass each.
        placed = stats_placed(label_stats(answered, group), grids) if group.labels else {}
        split = {} if group.labels else split_series(answered, group)
        for t, _ in group.members:
            ts = grids[t.key]
            if group.labels:
                stats = placed[t.key]
                if NONZERO in sig.stats:
                    # The per-job query's `or vector(0)`: no GPU with a code is 0, on every grid point.
                    stats[NONZERO] = np.nan_to_num(stats.get(NONZERO, np.full(ts.size, np.nan)), nan=0.0)
            else:
                stats = _stats_from_gpu_series(sig, split.get(t.key, []), ts, scrape / step)
            if COUNT not in stats or np.isnan(stats[COUNT]).all():
                out[t.key].missing[sig.key] = missing_reason(sig, False)
                continue
            out[t.key].signals[sig.key] = SignalSeries(sig.key, sig.unit, ts, stats)
        if per_gpu_step:
            request = per_gpu_request(sig, names, group, discovery, out, g1, per_gpu_step, scrape)
            if request is not None:
                wanting, lo, query = request
                wide.append((sig, wanting, lo, fetcher.submit(query, lo, max(g1, lo), per_gpu_step)))
                queries += 1
    for sig, wanting, _, answer in wide:
        split = split_series(answer.result(), group)
        gpu_grids: dict[int, np.ndarray] = {}
        for t, _ in wanting:
            g0t = lattice_point(t.gpu_start, per_gpu_step or step)
            gpu_grids[t.key] = grid(g0t, max(t.end, g0t), per_gpu_step or step)
        # Every wanting job's per-GPU rows placed in one pass, straight into its matrix.
        for key, (gpus, matrix) in per_gpu_matrices(split, gpu_grids).items():
            series = out[key].signals[sig.key]
            series.gpus, series.per_gpu = gpus, matrix
            series.gpu_timestamps = gpu_grids[key]
    result.signals.update(out)
    return queries


def per_gpu_request(
    sig: Signal,
    names: tuple[str, ...],
    group: Group,
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
    selector = selector_of(group.labels, wanting, discovery) if len(wanting) < len(group.members) else None
    query = per_gpu_query(sig, selector or group.selector, gwindow, step_s=per_gpu_step, by=by, metrics=names)
    return wanting, lo, query


def selector_of(
    labels: tuple[str, ...], members: Sequence[tuple[Target, tuple[str, ...]]], discovery: Discovery
) -> Selector | None:
    """The selector of `members` (a group's, or the part of it a query reads): each job label matching any
    of their values (a superset where a group has several labels: `split_series` keeps each job's own series),
    or, for explicit GPUs (`labels` empty), their (host, gpu) pairs in the spellings that exist (None when
    no host label exists)."""
    if labels:
        return Selector([[_any(n, [values[i] for _, values in members]) for i, n in enumerate(labels)]])
    refs = sorted({pair for t, _ in members for pair in t.gpus})
    return Selector.from_gpus([{"hostname": h, "gpu": g} for h, g in refs]).restricted(discovery.labels)


def label_stats(series: Sequence[Any], group: Group) -> list[tuple[int, str, Any]]:
    """(job key, stat, series) for each series of a label group's aggregate answer and each job it belongs
    to, in answer order: `split_series` and `stats_of_jobs`' stat look-up in one pass over the answer's
    hundreds of series (`signal_queries.stats_placed` places them)."""
    owners: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for t, values in group.members:
        owners[values].append(t.key)
    names, blanks = group.labels, ("",) * len(group.labels)
    picked: list[tuple[int, str, Any]] = []
    for s in series:
        labels = s.labels
        stat = labels.get(STAT_LABEL)
        if stat:
            picked += [(key, stat, s) for key in owners.get(tuple(map(labels.get, names, blanks)), ())]
    return picked


def split_series(series: Sequence[Any], group: Group) -> dict[int, list[Any]]:
    """Result series per job key: by label values for label groups, by (host, gpu) for explicit GPUs."""
    out: dict[int, list[Any]] = defaultdict(list)
    if group.labels:
        owners: dict[tuple[str, ...], list[int]] = defaultdict(list)
        for t, values in group.members:
            owners[values].append(t.key)
        names, blanks = group.labels, ("",) * len(group.labels)
        for s in series:  # the label values as a tuple, built in C: hundreds of series per answer
            for key in owners.get(tuple(map(s.labels.get, names, blanks)), ()):
                out[key].append(s)
        return out
    gpu_owners: dict[tuple[str, str], list[int]] = defaultdict(list)
    for t, _ in group.members:
        for pair in t.gpus:
            gpu_owners[pair].append(t.key)
    for s in series:
        k = GpuKey(*gpu_key(s.labels))
        for key in gpu_owners.get((k.hostname, k.gpu), ()):
            out[key].append(s)
    return out


def gpu_key(labels: Mapping[str, str]) -> tuple[str, str]:
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
    tagged = [s for s in series if s.labels.get("stat") in (_VALUE, _SAMPLES)]
    rows = rows_on_grids([s.timestamps for s in tagged], [s.values for s in tagged], [ts] * len(tagged))
    values = [r for s, r in zip(tagged, rows, strict=True) if s.labels["stat"] == _VALUE]
    counts = [r for s, r in zip(tagged, rows, strict=True) if s.labels["stat"] == _SAMPLES]
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


def could_match(labels: Mapping[str, Any], discovery: Discovery) -> bool:
    """Whether every label of a selector exists (in some spelling) on the discovered series; True when a
    name cannot be checked (the read then says what is wrong with it)."""
    try:
        return all(any(s in discovery.labels for s in label_spellings(name)) for name in labels)
    except ValueError:
        return True
