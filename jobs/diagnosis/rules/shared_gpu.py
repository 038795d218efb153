"""shared_gpu: the job's GPUs were also used by other jobs (time-slicing) or it ran on MIG slices.

The seed's causes 4 and 7: "a GPU shared by several tasks competing for time slices ... utilisation is
thinned out"; MIG partitions and a scheduler giving one GPU to several jobs make a GPU "look underfed".
The detection and the attribution are jobs.evaluation.sharing's (one computation, stored with the evaluation
as `GpuSharing` and passed in `DiagnosisInput.sharing`); this rule explains it:

* which GPUs, with whom, when, and the job's share of their GPU-time;
* the dilution: on a time-sliced GPU the job gets about its share of the GPU's time while the other jobs
  are busy, so it runs up to 1 / share times slower than on a GPU of its own; the evaluation already
  charges its share of the cost and measures its MFU against its share of the peak (so a low MFU is not
  blamed on the job for the other jobs' part);
* what the utilisation means: dcgm-exporter's per-GPU fields (GPU_UTIL, SM/tensor activity, power) on a
  time-sliced GPU include every user's kernels, so the job's own activity cannot be told apart; on a MIG
  instance the profiling fields are the instance's own (GPU_UTIL is not reported for MIG instances).

Severity: warning for time-sliced GPUs (contention the job's owner can fix by asking for whole GPUs or
another binding), info for MIG slices alone (isolated by design: only the accounting changes). Impact 0:
the share itself is not waste of this job's money (its cost is already the share); what the sharing costs
in speed shows in its MFU and baseline regression, which this finding then explains.

`qualify` marks the other metric findings read on time-sliced GPUs, lowering their confidence, because
their activity numbers include the other jobs' work.

Cannot see: sharing by processes outside any registered job, and MPS clients (no per-process fields in
dcgm-exporter's default counters); the time-sliced split is assumed even while the users overlap.
Resolution: the jobs' registered windows (seconds), not the scheduler's actual time slices (milliseconds).
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from jobs.diagnosis.base import DiagnosisInput, Evidence, Finding, Severity
from jobs.diagnosis.features import Features

CODE = "shared_gpu"
RECOMMENDATION = (
    "These GPUs were also used by other jobs in this job's window (time-slicing) or are MIG slices: "
    "utilisation is thinned out and the job's cost and MFU are its share, not the whole GPU. For training, "
    "request whole GPUs (exclusive mode, no time-slicing replicas in the device plugin, Slurm --exclusive "
    "or gres binding); check CUDA_VISIBLE_DEVICES and the scheduler's GPU binding for double bookings. A "
    "MIG slice is right for small jobs; a job that fills its slice needs a larger profile."
)
MIG_RECOMMENDATION = (
    "This job ran on MIG slices: its cost is the slice's share of the GPU and its MFU is against the "
    "slice's SMs. A MIG instance is isolated from its neighbours, so nothing else slowed it; if it keeps "
    "the slice busy and needs more speed, use a larger profile or a whole GPU."
)
#: Confidence of other metric findings read on time-sliced GPUs (their activity includes other jobs').
SHARED_READING_FACTOR = 0.8
#: Findings whose evidence is not per-GPU activity, or that are this one, are left as they are.
UNQUALIFIED = frozenset({CODE, "gpu_errors", "throttling", "memory_headroom", "unexplained_waste"})


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M")


def time_sliced_gpus(inp: DiagnosisInput) -> list[str]:
    """The job's GPUs that another job used at the same time as a whole GPU (not a MIG slice)."""
    sharing = inp.sharing
    if sharing is None:
        return []
    return sorted({s.gpu for s in sharing.shared if not s.mig and s.gpu not in sharing.mig})


def check(inp: DiagnosisInput, f: Features) -> Finding | None:
    """Fire when the evaluation found the job's GPUs shared or sliced (`inp.sharing`)."""
    sharing = inp.sharing
    if sharing is None:
        return None
    sliced = time_sliced_gpus(inp)
    others = sorted({s.shown for s in sharing.shared})
    profiles = sorted({pair[1] for pair in sharing.mig.values() if len(pair) == 2 and pair[1]})
    share = sharing.share
    evidence = [
        Evidence("this job's share of its GPUs' time", round(100 * share, 1), "%"),
        Evidence("GPUs charged (share of the GPUs held)", round(sharing.gpu_equivalents, 3), "GPUs"),
        Evidence("GPU peaks MFU is measured against", round(sharing.peak_equivalents, 3), "GPUs"),
    ]
    if sharing.label:
        evidence.append(Evidence("allocation", sharing.label))
    if profiles:
        evidence.append(Evidence("MIG profiles", ", ".join(profiles)))
        if sharing.peak_source:
            evidence.append(Evidence("slice peak", sharing.peak_source))
    if sliced:
        evidence.append(
            Evidence("time-sliced GPUs", ", ".join(sliced[:8]) + (" ..." if len(sliced) > 8 else ""))
        )
    if others:
        evidence.append(
            Evidence("other jobs on them", ", ".join(others[:10]) + (" ..." if len(others) > 10 else ""))
        )
    for s in sharing.shared[:6]:
        evidence.append(Evidence(f"{s.gpu} with {s.shown}", f"{_utc(s.start)} – {_utc(s.end)} UTC"))
    windows = [(s.start, s.end) for s in sharing.shared if s.end > s.start and not s.mig]
    if sliced:
        util = f.util
        mean = float(np.nanmean(util)) if util is not None and np.isfinite(util).any() else None
        slowdown = 1.0 / share if share > 0 else None
        evidence.append(
            Evidence(
                "expected slowdown while the other jobs are busy (1 / share)",
                slowdown and round(slowdown, 2),
                "x",
            )
        )
        if mean is not None:
            evidence.append(
                Evidence(
                    "GPU utilisation, every user's kernels included (not this job's own)",
                    round(100 * mean, 1),
                    "%",
                )
            )
        title = (
            f"{len(sliced)} GPU(s) time-sliced with {len(others)} other job(s): this job held "
            f"{share:.0%} of their time, so its utilisation is thinned out"
        )
        severity, recommendation = Severity.WARNING, RECOMMENDATION
    else:
        title = (
            f"Ran on MIG slice(s) {', '.join(profiles) or '(profile unknown)'}: charged "
            f"{sharing.gpu_equivalents:.2f} GPU(s), MFU against {sharing.peak_equivalents:.2f} GPU peaks"
        )
        severity, recommendation = Severity.INFO, MIG_RECOMMENDATION
    return Finding(
        code=CODE,
        severity=severity,
        # The GPU claims come from the registered jobs and the exporter's MIG labels: facts, not an estimate.
        confidence=0.9,
        title=title,
        recommendation=recommendation,
        evidence=evidence,
        windows=windows,
        impact=0.0,
        sources=["metrics", "job registry"],
    )


def qualify(findings: list[Finding], inp: DiagnosisInput) -> None:
    """Say on every other activity-based finding that its readings include the other jobs' kernels, and
    lower its confidence (SHARED_READING_FACTOR): on a time-sliced GPU they cannot be told apart."""
    sliced = time_sliced_gpus(inp)
    if not sliced:
        return
    for finding in findings:
        if finding.code in UNQUALIFIED or "metrics" not in finding.sources:
            continue
        if finding.code == "idle_gpus":
            # Idle on a time-sliced GPU means no user ran a kernel: this job's share sat unused for sure
            # (its cost is already the share). The reverse is what cannot be seen: this job idle while
            # another job kept the GPU busy reads as busy.
            finding.evidence.append(
                Evidence("idle on time-sliced GPUs: no user's kernels, so this job's share was unused", "")
            )
            continue
        finding.confidence = round(finding.confidence * SHARED_READING_FACTOR, 3)
        finding.evidence.append(
            Evidence(
                "read on GPUs time-sliced with other jobs (their kernels included)", ", ".join(sliced[:4])
            )
        )
