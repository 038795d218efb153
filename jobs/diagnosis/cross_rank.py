"""Compare the traces of several ranks of one job: who waits for whom in the collectives. Pure: no Django.

In synchronous data-parallel (and all-to-all) training every rank enters each collective and none can leave
before the last one has arrived. A collective kernel therefore runs, on each rank, for the transfer itself
*plus* the time that rank waited for the last arrival. The rank that arrives last waits least: its NCCL
kernel time is (close to) the transfer alone, and the others' extra NCCL time is time spent waiting for it
(HTA's "communication/computation overlap" and NCCL kernel durations; the same reading as PyTorch's
"Straggler" analysis in the Holistic Trace Analysis docs, which compares per-rank collective durations).

So, per rank, over the steps its trace captured:

* NCCL (collective) kernel time per step: the union of communication kernels (`comm_compute_overlap.
  communication_ms`) divided by the steps analysed (HTA's window: every ProfilerStep but the last);
* step time (median ProfilerStep) and compute time per step (`computation_ms` / steps).

The spread of NCCL time across ranks, and the rank(s) with the least of it, name who the others wait for;
the late rank's own NCCL time estimates what the collective costs without the skew (the network's part).

What it cannot see: whether the same rank is late in *every* step (only per-rank totals over the captured
steps are compared); ranks whose traces were captured at different times (they are compared only when their
capture windows overlap, or when no rank's clock is known); collectives outside NCCL kernels (gloo, CPU).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from jobs.diagnosis import artifacts as A
from jobs.diagnosis.base import DiagnosisInput, Evidence
from jobs.profiling.schema.trace import TraceRank

#: Fewest ranks with collective kernels that can be compared.
MIN_RANKS = 2
#: The spread of NCCL time per step (most minus least) must be at least this share of the step: a few % of
#: skew is the normal jitter of launches and of the network (the two real ranks of a 128-rank TorchRec job
#: in ../shared/samples differ by 4.5 % of their 600 ms step) and no fix is worth chasing below ~10 %.
MIN_SPREAD_STEP_SHARE = 0.10
#: ... and the late rank(s) must spend at most this fraction of the other ranks' median NCCL time in NCCL:
#: the others wait at least as long again as the collective itself takes.
LATE_MAX_RATIO = 0.5
#: Ranks within this share of the spread above the least NCCL time count as late too (a slow node makes
#: all of its ranks late by about the same amount).
LATE_BAND = 0.25
#: An imbalance costing at least this share of every rank's step (the mean wait for the late ranks) is a
#: warning; below, context.
WARN_WAIT_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class RankNumbers:
    """One rank's per-step numbers from its trace analysis (milliseconds per step; None when unknown)."""

    rank: int | None
    label: str
    collective_ms: float
    step_ms: float | None
    compute_ms: float | None
    steps: int
    window: tuple[float, float] | None = None
    source: str = "trace"  # the artifact kind as a finding source ("kineto trace", "nsys_sqlite trace")

    @property
    def name(self) -> str:
        """ "rank 3" or, without a rank number, the artifact's label."""
        return f"rank {self.rank}" if self.rank is not None else self.label


@dataclass(frozen=True, slots=True)
class Imbalance:
    """The comparison of the ranks of one capture.

    `late` are the ranks the others wait for (least NCCL time) when they are at most half of the ranks;
    otherwise `late` is empty and `longest` names the few ranks that wait longest (they arrive early: the
    others are all slower than them). `wait_share` is the mean over all ranks of (own NCCL time - the
    least) / step: the share of the step lost to the skew rather than to the transfer.
    """

    ranks: tuple[RankNumbers, ...]
    late: tuple[RankNumbers, ...]
    longest: tuple[RankNumbers, ...]
    least_ms: float
    most_ms: float
    step_ms: float
    wait_ms: float
    significant: bool

    @property
    def spread_ms(self) -> float:
        """Most minus least NCCL time per step across the ranks."""
        return self.most_ms - self.least_ms

    @property
    def wait_share(self) -> float:
        """Mean time per step the ranks wait for the late ones, as a share of the step."""
        return self.wait_ms / self.step_ms if self.step_ms > 0 else 0.0

    @property
    def late_names(self) -> str:
        """ "rank 5" / "ranks 4, 5"."""
        return rank_names(self.late)

    @property
    def windows(self) -> list[tuple[float, float]]:
        """The capture windows of the compared ranks (distinct, in order)."""
        return sorted({r.window for r in self.ranks if r.window is not None})

    def evidence(self) -> list[Evidence]:
        """Per-rank evidence (NCCL time, compute and step per step) and the spread."""
        out = [
            Evidence("ranks compared (one capture)", len(self.ranks), "count"),
            Evidence("NCCL time per step, least to most", f"{self.least_ms:.3g}-{self.most_ms:.3g}", "ms"),
            Evidence(
                "spread of NCCL time across ranks", round(100 * self.spread_ms / self.step_ms, 1), "% of step"
            )
            if self.step_ms > 0
            else Evidence("spread of NCCL time across ranks", round(self.spread_ms, 3), "ms"),
        ]
        for r in sorted(self.ranks, key=lambda r: (r.rank is None, r.rank or 0, r.label)):
            tag = " (late: the others wait for it)" if r in self.late else ""
            out.append(Evidence(f"{r.name}: NCCL kernel time per step{tag}", round(r.collective_ms, 3), "ms"))
            if r.compute_ms is not None:
                out.append(Evidence(f"{r.name}: compute kernel time per step", round(r.compute_ms, 3), "ms"))
            if r.step_ms is not None:
                out.append(Evidence(f"{r.name}: step time (median)", round(r.step_ms, 3), "ms"))
        return out


def rank_names(ranks: Iterable[RankNumbers]) -> str:
    items = sorted(ranks, key=lambda r: (r.rank is None, r.rank or 0, r.label))
    numbered = [r.rank for r in items if r.rank is not None]
    if numbered and len(numbered) == len(items):
        return ("rank " if len(numbered) == 1 else "ranks ") + ", ".join(map(str, numbered))
    return ", ".join(r.name for r in items)


def steps_analysed(rank: TraceRank) -> int:
    """Steps inside a rank's analysis window (HTA's: every ProfilerStep but the last; 1 without steps)."""
    profiler = rank.window.profiler_steps
    if profiler is None or profiler < 2:
        return 1
    return int(profiler) - 1 if rank.window.excludes_last_profiler_step is True else int(profiler)


def rank_numbers(view: A.RankView) -> RankNumbers | None:
    """The per-step numbers of one trace rank, or None when it ran no collective kernels."""
    overlap = view.rank.comm_compute_overlap
    comm = overlap.communication_ms
    if comm is None or comm <= 0:
        return None
    steps = steps_analysed(view.rank)
    compute = overlap.computation_ms
    step = view.rank.step_times.median_ms
    if step is None or step <= 0:
        span = view.rank.temporal_breakdown.span_ms
        step = span / steps if span else None
    rank = view.rank.rank if view.rank.rank is not None else view.artifact.rank
    windows = view.windows
    return RankNumbers(
        rank=rank,
        label=view.label,
        collective_ms=comm / steps,
        step_ms=step,
        compute_ms=compute / steps if compute is not None else None,
        steps=steps,
        window=windows[0] if windows else None,
        source=view.source,
    )


def captures(ranks: Sequence[RankNumbers]) -> list[list[RankNumbers]]:
    """The ranks grouped into captures: overlapping capture windows form one group, and the ranks without
    a wall clock form one group of their own. A rank number seen twice in a group is kept once (the first:
    the same rank uploaded twice, or one file read as two artifacts)."""
    timed = sorted((r for r in ranks if r.window is not None), key=lambda r: r.window or (0.0, 0.0))
    groups: list[list[RankNumbers]] = []
    end = float("-inf")
    for r in timed:
        assert r.window is not None
        if not groups or r.window[0] > end:
            groups.append([])
            end = r.window[1]
        groups[-1].append(r)
        end = max(end, r.window[1])
    untimed = [r for r in ranks if r.window is None]
    if untimed:
        groups.append(untimed)
    out = []
    for g in groups:
        seen: set[Any] = set()
        kept = []
        for r in g:
            key = r.rank if r.rank is not None else r.label
            if key not in seen:
                seen.add(key)
                kept.append(r)
        out.append(kept)
    return out


def compare(ranks: Sequence[RankNumbers]) -> Imbalance | None:
    """Compare the ranks of one capture; None with fewer than MIN_RANKS ranks that ran collectives.

    `significant` when the spread is at least MIN_SPREAD_STEP_SHARE of the step and the late ranks spend
    at most LATE_MAX_RATIO of the others' median NCCL time in NCCL.
    """
    ranks = [r for r in ranks if r.collective_ms > 0]
    if len(ranks) < MIN_RANKS:
        return None
    least = min(r.collective_ms for r in ranks)
    most = max(r.collective_ms for r in ranks)
    spread = most - least
    late = [r for r in ranks if r.collective_ms <= least + LATE_BAND * spread]
    longest = [r for r in ranks if r.collective_ms >= most - LATE_BAND * spread]
    steps = [r.step_ms for r in ranks if r.step_ms is not None and r.step_ms > 0]
    step = statistics.median(steps) if steps else 0.0
    wait = statistics.fmean(r.collective_ms - least for r in ranks)
    others = [r.collective_ms for r in ranks if r not in late]
    named = len(late) * 2 <= len(ranks)
    significant = (
        bool(others)
        and step > 0
        and spread >= MIN_SPREAD_STEP_SHARE * step
        and max(r.collective_ms for r in late) <= LATE_MAX_RATIO * statistics.median(others)
    )
    return Imbalance(
        ranks=tuple(ranks),
        late=tuple(late) if named else (),
        longest=tuple(longest) if not named else (),
        least_ms=least,
        most_ms=most,
        step_ms=step,
        wait_ms=wait,
        significant=significant,
    )


def imbalances(inp: DiagnosisInput) -> list[Imbalance]:
    """The significant imbalances among the job's trace ranks, one per capture, worst first."""
    numbers = [n for v in A.trace_ranks(inp) if (n := rank_numbers(v)) is not None]
    found = [c for g in captures(numbers) if (c := compare(g)) is not None and c.significant]
    return sorted(found, key=lambda c: -c.wait_share)
