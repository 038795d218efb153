"""A job's MIG instances, read from Prometheus: dcgm-exporter labels each instance's series with `GPU_I_ID`
and `GPU_I_PROFILE` (e.g. `3g.40gb`, reference/dcgm.md "Labels"), while `gpu`/`UUID` stay the parent GPU's.
dcgm-exporter reports no DCGM_FI_DEV_GPU_UTIL for MIG instances (NVIDIA/dcgm-exporter #216, #50: use
DCGM_FI_PROF_GR_ENGINE_ACTIVE), so instances are looked up on either metric. One job at a time
(`mig_instances`) or a poll cycle's jobs in batched queries (`mig_instances_of`); `stored_mig` is what the
job's last evaluation saw. `sharing` bills a job on a slice for its compute slices / 7 of the GPU.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime

from jobs.metrics.prometheus import PrometheusClient, PrometheusError
from jobs.metrics.promql import (
    GpuRef,
    Matcher,
    Selector,
    label_spellings,
    regex_any,
    regex_batches,
)
from jobs.models import Job


def job_window(job: Job, now: datetime) -> tuple[float, float]:
    """The job's registered window (Unix s): start to end, or to `now` while it runs."""
    return job.started_at.timestamp(), (job.ended_at or now).timestamp()


def job_selector(job: Job) -> Selector | None:
    """The selector of the job's GPUs: its explicit GPU list, else its label selector (None without)."""
    if job.gpus:
        return Selector.from_gpus(job.gpus)
    if job.selector:
        return Selector.from_labels(job.selector)
    return None


#: How far back from the end of a job's window its MIG instances are looked up (s).
MIG_LOOKBACK_S = 3600


#: The metrics MIG instances are found on (no GPU_UTIL for MIG instances: the module docstring).
_MIG_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE")


def mig_instances(client: PrometheusClient, job: Job, now: datetime) -> dict[str, tuple[str, str]]:
    """{host/index: (GPU_I_ID, GPU_I_PROFILE)} of the job's MIG instances ({} without MIG, or when
    Prometheus cannot answer). One instant query over the last MIG_LOOKBACK_S of the job's window: a MIG
    layout does not change under a running job, and a week-long range on every poll would be costly."""
    selector = job_selector(job)
    if selector is None:
        return {}
    end, window = _mig_window(job, now)
    inner = selector.select_range(_MIG_METRICS, "last_over_time", window)
    query = f"count by ({', '.join(_MIG_BY)}) ({inner})"
    try:
        samples = client.instant(query, end)
    except PrometheusError:
        return {}
    out: dict[str, tuple[str, str]] = {}
    for s in samples:
        _add_instance(out, s.labels)
    return out


#: The labels a MIG look-up groups by (host spellings, GPU index, instance, profile), as `mig_instances`.
_MIG_BY = ("Hostname", "hostname", "gpu", "GPU_I_ID", "GPU_I_PROFILE")


#: GPUs (explicit lists) or characters of label values (label selectors) per batched MIG query: bounds
#: one query's regex on a large cluster.
MIG_BATCH_GPUS = 512


MIG_BATCH_CHARS = 4000


def _mig_window(job: Job, now: datetime) -> tuple[float, int]:
    """(end, window s) of the job's MIG look-up: `mig_instances`' instant time and lookback."""
    start, end = job_window(job, now)
    return end, max(min(int(end - start), MIG_LOOKBACK_S), 60)


def _add_instance(out: dict[str, tuple[str, str]], labels: Mapping[str, str]) -> None:
    """`mig_instances`' reading of one result sample: host/index -> (GPU_I_ID, GPU_I_PROFILE)."""
    host = labels.get("Hostname") or labels.get("hostname") or ""
    if labels.get("GPU_I_ID") not in (None, "") and host:
        out[f"{host}/{labels.get('gpu', '')}"] = (labels["GPU_I_ID"], labels.get("GPU_I_PROFILE", ""))


def _eq_or_any(name: str, values: Sequence[str]) -> Matcher:
    uniq = sorted(set(values))
    return Matcher(name, "=", uniq[0]) if len(uniq) == 1 else Matcher(name, "=~", regex_any(uniq))


def _exact_labels(job: Job) -> dict[str, str] | None:
    """The job's label selector when every value is an exact string of a valid label (batchable)."""
    if job.gpus or not isinstance(job.selector, Mapping) or not job.selector:
        return None
    out: dict[str, str] = {}
    for name, value in job.selector.items():
        if not isinstance(value, str) or not value:
            return None
        try:
            label_spellings(name)
        except ValueError:
            return None
        out[name] = value
    return out


def _explicit_pairs(job: Job) -> frozenset[tuple[str, str]] | None:
    """The job's explicit (host, gpu index) pairs, or None when its list is not one `from_gpus` takes."""
    if not job.gpus:
        return None
    try:
        return frozenset((r.hostname, str(r.gpu)) for r in map(GpuRef.coerce, job.gpus))
    except (ValueError, TypeError, AttributeError):
        return None


def _label_batches(members: list[tuple[Job, dict[str, str]]]) -> list[list[tuple[Job, dict[str, str]]]]:
    return regex_batches(members, lambda member: member[1].values(), MIG_BATCH_CHARS)


def _read_label_batch(
    client: PrometheusClient, names: tuple[str, ...], batch: list[tuple[Job, dict[str, str]]], at: float,
    window: int, out: dict[int, dict[str, tuple[str, str]]],
) -> None:  # fmt: skip
    """One query for jobs selected by the same label names: every spelling of each name matches any of the
    batch's values (a superset of each job's series); a sample goes to the jobs whose own selector matches
    it (for each label, one of its spellings holds the job's value), as their own query would have."""
    spellings = {n: label_spellings(n) for n in names}
    per_label = [[_eq_or_any(s, [v[n] for _, v in batch]) for s in spellings[n]] for n in names]
    selector = Selector([list(combo) for combo in itertools.product(*per_label)])
    inner = selector.select_range(_MIG_METRICS, "last_over_time", window)
    by = ", ".join(dict.fromkeys([*_MIG_BY, *(s for n in names for s in spellings[n])]))
    samples = client.instant(f"count by ({by}) ({inner})", at)
    owners: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for job, values in batch:
        owners[tuple(values[n] for n in names)].append(job.pk)
        out[job.pk] = {}
    for s in sorted(samples, key=lambda s: sorted(s.labels.items())):
        candidates = [sorted({s.labels.get(sp, "") for sp in spellings[n]} - {""}) for n in names]
        for combo in itertools.product(*candidates):
            for pk in owners.get(combo, ()):
                _add_instance(out[pk], s.labels)


def _read_gpu_batch(
    client: PrometheusClient, batch: list[tuple[Job, frozenset[tuple[str, str]]]], at: float, window: int,
    out: dict[int, dict[str, tuple[str, str]]],
) -> None:  # fmt: skip
    """One query for jobs with explicit GPU lists: the union of their GPUs; a sample goes to each job one of
    whose (host, gpu) pairs it carries under any host spelling (what `Selector.from_gpus` matches)."""
    refs = sorted({pair for _, pairs in batch for pair in pairs})
    selector = Selector.from_gpus([{"hostname": h, "gpu": g} for h, g in refs])
    inner = selector.select_range(_MIG_METRICS, "last_over_time", window)
    hosts = label_spellings("Hostname")
    by = ", ".join(dict.fromkeys([*_MIG_BY, *hosts]))
    samples = client.instant(f"count by ({by}) ({inner})", at)
    owners: dict[tuple[str, str], list[int]] = defaultdict(list)
    for job, pairs in batch:
        out[job.pk] = {}
        for pair in pairs:
            owners[pair].append(job.pk)
    for s in sorted(samples, key=lambda s: sorted(s.labels.items())):
        gpu = s.labels.get("gpu", "")
        mine = {pk for h in hosts if s.labels.get(h) for pk in owners.get((s.labels[h], gpu), ())}
        for pk in sorted(mine):
            _add_instance(out[pk], s.labels)


def mig_instances_of(
    client: PrometheusClient, jobs: Sequence[Job], now: datetime
) -> dict[int, dict[str, tuple[str, str]]]:
    """{job pk: `mig_instances(client, job, now)`} for many jobs with one instant query per batch instead
    of one per job (the poll cycle's MIG look-up: ~500 queries per 4k-GPU cycle before).

    Jobs are batched when their look-ups are the same query but for the selector: the same instant and
    lookback (`mig_instances`' window: every running job older than MIG_LOOKBACK_S shares one), and either
    exact-string label selectors with the same label names, or explicit GPU lists. Each batch reads the
    union of its jobs' series grouped by the labels that tell the jobs apart, and a sample goes to the jobs
    whose own selector matches it. A job not batchable (regex values, a GPU list `from_gpus` refuses) is
    left out: `sharing.look_up` asks for it alone. A batch whose query fails gets {} per job, as the per-job
    query answers a Prometheus error. When a job has two instances on one GPU, the per-job answer keeps
    whichever sample Prometheus lists last; here the last by sorted labels (a fixed choice).
    """
    labelled: dict[tuple[float, int, tuple[str, ...]], list[tuple[Job, dict[str, str]]]] = defaultdict(list)
    explicit: dict[tuple[float, int], list[tuple[Job, frozenset[tuple[str, str]]]]] = defaultdict(list)
    for job in jobs:
        at, window = _mig_window(job, now)
        labels = _exact_labels(job)
        if labels is not None:
            labelled[(at, window, tuple(sorted(labels)))].append((job, labels))
        elif (pairs := _explicit_pairs(job)) is not None:
            explicit[(at, window)].append((job, pairs))
    out: dict[int, dict[str, tuple[str, str]]] = {}
    for (at, window, names), members in sorted(labelled.items(), key=lambda kv: kv[0]):
        members.sort(key=lambda m: tuple(m[1][n] for n in names))
        for batch in _label_batches(members):
            try:
                _read_label_batch(client, names, batch, at, window, out)
            except PrometheusError:
                out.update({job.pk: {} for job, _ in batch})
    for (at, window), gpu_members in sorted(explicit.items(), key=lambda kv: kv[0]):
        gpu_members.sort(key=lambda m: sorted(m[1]))
        batches: list[list[tuple[Job, frozenset[tuple[str, str]]]]] = []
        count = 0
        for member in gpu_members:
            if batches and count + len(member[1]) <= MIG_BATCH_GPUS:
                batches[-1].append(member)
                count += len(member[1])
            else:
                batches.append([member])
                count = len(member[1])
        for gpu_batch in batches:
            try:
                _read_gpu_batch(client, gpu_batch, at, window, out)
            except PrometheusError:
                out.update({job.pk: {} for job, _ in gpu_batch})
    return out


def stored_mig(job: Job) -> dict[str, tuple[str, str]]:
    """The MIG instances the job's last evaluation saw (when there is no Prometheus to ask)."""
    evaluated = job.evaluated
    sharing = evaluated.sharing if evaluated is not None else None
    if sharing is None:
        return {}
    return {gpu: (pair[0], pair[1]) for gpu, pair in sharing.mig.items() if len(pair) == 2}
