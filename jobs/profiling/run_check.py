"""Does an artifact belong to its job? Compare what the file says about itself with the job. Pure.

A trace uploaded to the wrong job (an A100 trace on an H100 job, last month's capture, rank 37 of a
128-rank run on an 8-GPU job) would otherwise rewrite that job's findings and dollars. The parsers put what
the file says about its capture in `analysis["capture"]` (contract: `gpu_names`, `start_unix`, `end_unix`,
`ranks`, `world_size`, `source`; any of them may be unknown). Three checks, each made only when both
sides are known:

* **GPU model**: every GPU the capture names must be the job's GPU model (catalog canonical names, so
  "NVIDIA H100 80GB HBM3" and "H100 SXM" agree). A name the catalog does not know cannot be shown to
  differ from a job whose model is unknown too, so that pair is not judged.
* **Capture time**: the capture window must overlap the job's window, with `CLOCK_SLACK_S` either side for
  clock skew between the node that captured and the scheduler that registered the job.
* **Rank**: the upload's rank (or the ranks in the file) must be below the job's GPU count, and a world
  size stated in the file must equal it (one process per GPU, the launchers' default). A rank typed at
  upload can only show a mismatch: alone it does not make a file that states nothing `matches`.
* **Host**: a host the file names (dstat's "Host:" line, capture key `hosts`) must be one of the job's
  hosts (its explicit GPU mapping), compared by short name ("node7.cluster" is "node7").

Files that carry none of these (py-spy: no GPU, no time, no rank; a dstat log of a job without a host
mapping) are `unverifiable`: the diagnosis still shows what they say, but they never raise a finding's
confidence, severity or dollars (`jobs.diagnosis.belonging`) until a user confirms them. The pids and
command lines py-spy records (capture keys `pids`, `commands`) have nothing on the job to be compared with;
they are shown to the user who decides.

What it cannot see: a file from another job of the same GPU model, captured in the same window, on a rank
that exists in this job — the metadata is identical. The user can exclude such an artifact by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from jobs.profiling.schema.blocks import Capture
from jobs.profiling.schema.common import lenient

#: Seconds of clock skew tolerated between the capturing node and the job's registered window.
CLOCK_SLACK_S = 600.0


@dataclass(frozen=True)
class JobFacts:
    """What the check compares against: the job's GPU model (canonical), count and window."""

    gpu_model: str | None
    gpu_count: int
    start_unix: float
    end_unix: float | None  # None while running: up to now
    hosts: tuple[str, ...] = ()  # hostnames of the job's explicit GPU mapping; () when unknown


@dataclass(frozen=True)
class RunCheckResult:
    """`status` is a jobs.models.Artifact.RunCheck value; `mismatches` say why, in the user's words."""

    status: str
    mismatches: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)


def _iso(ts: float) -> str:
    try:
        return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, OSError, ValueError):
        return f"{ts:.0f} (unix s)"


def short_host(name: str) -> str:
    """A hostname as compared: lower case, its first DNS label ("Node7.cluster.local" -> "node7"); an IPv4
    address stays whole."""
    text = name.strip().lower()[:200]
    if text.replace(".", "").isdigit():
        return text
    return text.split(".", 1)[0]


def check_run(
    capture: Capture | Mapping[str, Any] | None,
    job: JobFacts,
    *,
    rank: int | None,
    now_unix: float,
    canonical_gpu: Callable[[str], str | None],
) -> RunCheckResult:
    """Compare an artifact's capture metadata (and its uploaded `rank`) with `job`.

    `canonical_gpu` maps a device name as the file spells it to the catalog's canonical name (None when
    the catalog does not know it). Returns `matches` when at least one check could be made and all
    passed, `mismatch` with the reasons when any failed, `unverifiable` when nothing could be checked.
    A stored capture block (a mapping) is decoded leniently (jobs.profiling.schema.blocks): what is
    missing or of another type is not checked.
    """
    cap = capture if isinstance(capture, Capture) else lenient(capture, Capture)
    mismatches: list[str] = []
    checked: list[str] = []

    names = [n.strip()[:200] for n in cap.gpu_names if n.strip()]
    if names:
        other: list[str] = []
        for name in dict.fromkeys(names):
            canon = canonical_gpu(name)
            if canon is None and job.gpu_model is None:
                continue
            checked.append("gpu")
            if canon != job.gpu_model:
                other.append(name)
        if other:
            ours = job.gpu_model or "an unknown GPU model"
            mismatches.append(f"captured on {', '.join(other)}, but the job runs on {ours}")

    start, end = cap.start_unix, cap.end_unix
    if start is not None or end is not None:
        checked.append("time")
        first = start if start is not None else end
        last = end if end is not None else start
        assert first is not None and last is not None
        job_end = job.end_unix if job.end_unix is not None else now_unix
        if last < job.start_unix - CLOCK_SLACK_S or first > job_end + CLOCK_SLACK_S:
            mismatches.append(
                f"captured {_iso(first)} – {_iso(last)}, outside the job's window "
                f"{_iso(job.start_unix)} – {_iso(job_end)}"
            )

    file_ranks = list(cap.ranks)
    ranks = ([rank] if rank is not None else []) + file_ranks
    if ranks:
        checked.append("rank")
        outside = sorted({r for r in ranks if r < 0 or r >= job.gpu_count})
        if outside:
            mismatches.append(
                f"rank {', '.join(map(str, outside))} is not one of the job's {job.gpu_count} GPUs "
                f"(ranks 0–{job.gpu_count - 1})"
            )
    world = cap.world_size
    if world is not None and world > 0:
        checked.append("world size")
        if world != job.gpu_count:
            mismatches.append(f"the trace is from a {world}-rank run; the job has {job.gpu_count} GPUs")

    file_hosts = {short_host(h) for h in cap.hosts}
    job_hosts = {short_host(h) for h in job.hosts}
    file_hosts.discard("")
    job_hosts.discard("")
    if file_hosts and job_hosts:
        checked.append("host")
        if not file_hosts & job_hosts:
            mismatches.append(
                f"captured on host {', '.join(sorted(file_hosts)[:4])}, not one of the job's hosts "
                f"({', '.join(sorted(job_hosts)[:8])})"
            )

    if mismatches:
        return RunCheckResult("mismatch", mismatches, checked)
    # The rank typed at upload is the uploader's claim, not the file's: it can show a mismatch (rank 9 of 8
    # GPUs) but not that the file belongs. A file that states nothing itself stays unverifiable.
    from_file = bool(file_ranks) or any(c != "rank" for c in checked)
    return RunCheckResult("matches" if from_file else "unverifiable", [], checked)
