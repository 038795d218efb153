"""What the job does changes what its utilisation means (pure: numpy, no Django).

* training / fine-tuning: the step loop is supposed to keep the GPUs busy, so utilisation below 100 % is
  time the GPUs wait (input, host, collectives) or launch gaps: the causes of jobs.diagnosis.rules.
* inference / serving: a server is busy only while it has requests. Utilisation that follows the load
  (requests, tokens/s, batch size where exported) is the load, not a stall: it is judged against the load
  (`load_reading`), with right-sizing, batching and autoscaling advice, and never read as an input stall
  or launch-bound training steps.
* unknown (registered without a kind, discovered from label values): neither reading can be chosen, so no
  cause whose reading depends on the kind is shown above info (`gate_unknown`).

The kind-specific causes are the ones that read partial utilisation as a training-step problem
(`KIND_SPECIFIC_CODES`); hardware and allocation findings (idle GPUs, throttling, XID errors, stragglers,
collectives with link traffic) read the same on any job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jobs.diagnosis import detectors as D
from jobs.diagnosis.base import Evidence, Finding, Severity
from jobs.diagnosis.features import Features

TRAINING = "training"
FINE_TUNING = "fine_tuning"
INFERENCE = "inference"
UNKNOWN = "unknown"
#: Kinds with a step loop (jobs.models.Job.Kind values).
STEP_LOOP_KINDS = frozenset({TRAINING, FINE_TUNING})
#: Causes whose reading of the metrics depends on the kind (partial utilisation read as input waits, as
#: launch gaps of a step loop, or memory headroom read as a larger micro-batch).
KIND_SPECIFIC_CODES = frozenset({"data_pipeline_stall", "launch_overhead", "memory_headroom"})

#: Utilisation following the load: Pearson correlation of the job's mean GPU_UTIL with its load series at
#: or above this (a server's busy time rises and falls with its requests; an input-starved step loop's
#: does not follow anything the server is asked).
LOAD_FOLLOWING_CORR = 0.5

SERVING_ADVICE = (
    "A serving job's utilisation is its load: judge it against requests and tokens/s, not as a stall. "
    "Right-size the deployment to the load it gets (fewer replicas, or smaller or shared GPUs for a low, "
    "steady load), batch requests (continuous batching, a larger max batch size / max_num_seqs) so each "
    "forward pass does more work, and autoscale replicas on queue depth or requests in flight (scale to "
    "zero where the latency budget allows)."
)


def normalise(kind: str | None) -> str:
    """The job's kind as one of training, fine_tuning, inference or unknown (empty or other: unknown)."""
    value = (kind or "").strip().lower()
    return value if value in (TRAINING, FINE_TUNING, INFERENCE) else UNKNOWN


def is_serving(kind: str | None) -> bool:
    """The job serves requests (inference)."""
    return normalise(kind) == INFERENCE


def is_unknown(kind: str | None) -> bool:
    """Nobody said what the job does."""
    return normalise(kind) == UNKNOWN


def gate_unknown(finding: Finding | None, kind: str | None) -> Finding | None:
    """A kind-specific cause on a job of unknown kind, read from metrics alone, is context (info): the same
    partial utilisation is an input stall in a step loop and plain load on a server. Artifact evidence (a
    trace, py-spy) measures the cause directly and keeps its severity."""
    if finding is None or not is_unknown(kind) or finding.code not in KIND_SPECIFIC_CODES:
        return finding
    if any(s != "metrics" for s in finding.sources) or finding.severity is Severity.INFO:
        return finding
    finding.severity = Severity.INFO
    finding.evidence.append(
        Evidence(
            "job kind",
            "unknown: partial utilisation is a stall in training and load in serving; register the kind",
        )
    )
    return finding


@dataclass(frozen=True, slots=True)
class LoadReading:
    """A serving job's utilisation against its load."""

    util_mean: float | None  # mean GPU_UTIL (ratio)
    util_p90: float | None  # 90th percentile of the job's mean utilisation
    load_key: str | None  # the load series read ("tokens_per_second"), None when none is exported
    load_corr: float | None  # Pearson correlation of utilisation with the load
    load_mean: float | None

    @property
    def follows_load(self) -> bool | None:
        """Utilisation rises and falls with the load (None without a load series)."""
        if self.load_corr is None:
            return None
        return self.load_corr >= LOAD_FOLLOWING_CORR

    def evidence(self) -> list[Evidence]:
        """The reading as evidence lines."""
        out = [
            Evidence("GPU_UTIL, mean", _pct(self.util_mean), "%"),
            Evidence("GPU_UTIL, 90th percentile over time (the busiest load seen)", _pct(self.util_p90), "%"),
        ]
        if self.load_key is None:
            out.append(
                Evidence("load", "no request or token throughput exported: utilisation read as the load")
            )
        else:
            out.append(Evidence(f"{self.load_key}, mean", _round(self.load_mean), "tokens/s"))
            out.append(
                Evidence(f"correlation of GPU_UTIL with {self.load_key}", _round(self.load_corr, 3), "r")
            )
        return out


#: Load series a serving job may carry, in order of preference (the job's throughput: pushed progress or
#: its throughput query; the evaluation archives it as "tokens_per_second").
LOAD_KEYS = ("tokens_per_second",)


def load_reading(f: Features) -> LoadReading | None:
    """The job's utilisation against its load; None without utilisation."""
    util = f.util
    if util is None or not np.isfinite(util).any():
        return None
    u = util[np.isfinite(util)]
    key, corr, mean = None, None, None
    if f.sigs is not None:
        for candidate in LOAD_KEYS:
            series = f.sigs.get(candidate)
            values = None if series is None else series.mean
            if values is None or np.asarray(values).shape != util.shape:
                continue
            load = np.asarray(values, dtype=np.float64)
            if not np.isfinite(load).any():
                continue
            key, mean = candidate, float(np.nanmean(load))
            corr = D.correlation(util, load)
            break
    return LoadReading(float(u.mean()), float(np.quantile(u, 0.9)), key, corr, mean)


def _pct(v: float | None) -> float | None:
    return None if v is None else round(100.0 * v, 1)


def _round(v: float | None, digits: int = 1) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, digits)
