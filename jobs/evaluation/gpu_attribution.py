"""Each job's share of each GPU it used (pure, no Django): per GPU the timeline is cut where the set of
users changes; in each segment a MIG instance's slice fraction goes to its users (split evenly when several
share one instance), whole-GPU users split the GPU evenly (time-slicing), and what no one holds is
`unallocated`. So per GPU and segment the shares plus the unallocated part sum to 1: a GPU's cost is split,
never counted once per job. `sharing` finds the usages (which jobs held which GPU when) and summarises a
job's attribution for the evaluation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

from jobs.evaluation.catalog import mig_slice


@dataclass(frozen=True, slots=True)
class Usage:
    """One job on one physical GPU over [start, end) (unix s); `instance`/`profile` for a MIG slice."""

    gpu: str
    job: str
    start: float
    end: float
    instance: str = ""
    profile: str = ""


def mig_fraction(profile: str) -> float | None:
    """Share of the GPU a MIG profile is billed for: its GPU instance's compute slices / 7 (`3g.40gb` and
    `1c.3g.40gb` -> 3/7; compute instances of one GPU instance share its GPU_I_ID and so split it). None
    when the profile is unknown or not MIG. One definition: jobs.evaluation.catalog.mig_slice."""
    piece = mig_slice(None, profile)
    return piece.cost_fraction if piece is not None else None


@dataclass
class Attribution:
    """GPU-seconds per (job, gpu) attributed by share, the unallocated GPU-seconds per GPU, and each job's
    own GPU-seconds (what it would be charged if every GPU were its alone)."""

    shares: dict[tuple[str, str], float] = field(default_factory=dict)
    unallocated: dict[str, float] = field(default_factory=dict)
    held: dict[tuple[str, str], float] = field(default_factory=dict)

    def job_share(self, job: str) -> float | None:
        """The job's attributed GPU-time over the GPU-time it held (1.0 = no sharing)."""
        held = sum(v for (j, _), v in self.held.items() if j == job)
        if held <= 0:
            return None
        return sum(v for (j, _), v in self.shares.items() if j == job) / held


def attribute(usages: Iterable[Usage]) -> Attribution:
    """Split each GPU's time between its users (see the module docstring). A GPU's segments covered by
    nobody are not counted (no job held the GPU then)."""
    result = Attribution()
    by_gpu: dict[str, list[Usage]] = defaultdict(list)
    for u in usages:
        if u.end > u.start:
            by_gpu[u.gpu].append(u)
            key = (u.job, u.gpu)
            result.held[key] = result.held.get(key, 0.0) + (u.end - u.start)
    for gpu, users in by_gpu.items():
        cuts = sorted({t for u in users for t in (u.start, u.end)})
        for t0, t1 in pairwise(cuts):
            active = [u for u in users if u.start < t1 and u.end > t0]
            if not active:
                continue
            span = t1 - t0
            slices: dict[str, list[Usage]] = defaultdict(list)
            whole: list[Usage] = []
            for u in active:
                fraction = mig_fraction(u.profile) if u.instance else None
                (slices[f"{u.instance}|{u.profile}"] if fraction is not None else whole).append(u)
            allocated = 0.0
            for slice_key, group in slices.items():
                fraction = mig_fraction(slice_key.split("|", 1)[1]) or 0.0
                allocated += fraction
                for u in {g.job: g for g in group}.values():
                    k = (u.job, gpu)
                    result.shares[k] = result.shares.get(k, 0.0) + span * fraction / len(
                        {g.job for g in group}
                    )
            remainder = max(0.0, 1.0 - allocated)
            jobs = sorted({u.job for u in whole})
            for job in jobs:
                k = (job, gpu)
                result.shares[k] = result.shares.get(k, 0.0) + span * remainder / len(jobs)
            if not jobs and remainder > 0:
                result.unallocated[gpu] = result.unallocated.get(gpu, 0.0) + span * remainder
    return result
