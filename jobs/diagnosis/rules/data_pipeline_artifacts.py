"""data_pipeline_stall's evidence from uploaded artifacts (profiler traces, py-spy profiles); the rule
itself, and its reading of the metrics, is `data_pipeline_stall`.

A trace shows GPU idle time whose gaps start when the host launches late (HTA's host wait) and a
DataLoader share of the step; py-spy shows the input pipeline hot in the training process.

A trace also shows the host side when it is not the DataLoader (issue #24's trace without ProfilerStep:
GPU idle 63.2 % of the steady state in 63 ms gaps while the host runs CPU operators): idle gaps of at
least the launch-gap limit (1 ms) that end with a *late launch* (the kernel that ends the gap was
launched after the gap began: nothing was queued, so the GPU waited for the host) while the threads
that launch GPU work were inside traced CPU operators -- not the DataLoader, not a blocking call
(host_sync), not a host-side collective (communication), not a CUDA runtime call (allocation, lazy
init). That is CPU-bound host work between kernels: the launch queue runs dry. It is this rule's cause
(the GPUs wait on the host side; at metric resolution it is the same unresolved "host / input" look),
not launch_overhead's (per-launch cost in gaps under 1 ms). The share of the analysed window is the
impact; only the steady state counts (the window starts at the first kernel or step, so start-up is in
the analysis' ``phases``), and a warning needs the pattern to repeat (several steps, or several gaps
with no one-off holding most of it). Cannot see: what the untraced host time was (Python between
operators, ``time.sleep``, I/O -- reported as ``untraced``, never a finding), Python source lines
(the operators are named, not the code that called them), work in other processes, and any of it in an
Nsight Systems export, which has CUDA API calls but no PyTorch operators (its host time is runtime or
untraced).
"""

from __future__ import annotations

from jobs.diagnosis import artifacts as A
from jobs.diagnosis import thresholds as T
from jobs.diagnosis import trace_thresholds as TT
from jobs.diagnosis.base import DiagnosisInput, Evidence, clamp01
from jobs.diagnosis.rules.common import pct


def trace_input_share(
    inp: DiagnosisInput,
    evidence: list[Evidence],
    sources: list[str],
    windows: list[tuple[float, float]] | None = None,
) -> float | None:
    """Share of the step the GPU waits for the DataLoader in a trace, or None; appends capture windows.

    Decided by the input share of the step, not by GPU idle alone: with the analysis' GPU idle
    attribution (`jobs.profiling.host_analysis`), the GPU idle time while the host is inside the
    DataLoader iterator (``enumerate(DataLoader)#...__next__``) over the profiled steps. Idle time in
    short launch gaps or behind blocking calls belongs to launch_overhead / host_sync. Older analyses:
    the TensorBoard-style DataLoader share of the step (without ProfilerStep, analyses made before
    issue #24 measured it over the host's extent, start-up included; newer ones over the steady state).
    Cannot see: DataLoader worker processes (they are not in the training process's trace) -- the
    iterator class only says whether there are any.
    """
    worst: float | None = None
    for r in A.trace_ranks(inp):
        if r.attributed():
            exposed = r.idle.input_pct
            if exposed is None or exposed < TT.INPUT_IDLE_PCT:
                continue
            loader = r.rank.input_pipeline.dataloader_step_pct
            iterator = r.rank.input_pipeline.iterator
            evidence += [
                Evidence(f"{r.label}: GPU idle while the host waits in the DataLoader", exposed, "% of step"),
                Evidence(f"{r.label}: DataLoader time on the host (captured window)", loader, "% of step"),
                Evidence(f"{r.label}: GPU idle", r.idle.idle_pct, "% of step"),
            ]
            if iterator is not None:
                evidence.append(Evidence(f"{r.label}: DataLoader iterator", iterator))
            share = exposed / 100.0
        else:
            loader = r.rank.step_breakdown.dataloader_pct
            if loader is None or loader < T.DATALOADER_PCT:
                continue  # GPU idle without a hot DataLoader is not evidence of an input stall
            idle = r.rank.temporal_breakdown.idle_pct
            evidence += [
                Evidence(f"{r.label}: DataLoader share of step", round(loader, 2), "%"),
                Evidence(f"{r.label}: GPU idle", None if idle is None else round(idle, 2), "% of span"),
            ]
            share = loader / 100.0
        worst = max(worst or 0.0, share)
        if windows is not None:
            windows += r.windows
        if r.source not in sources:
            sources.append(r.source)
    return worst


def trace_host_work(
    inp: DiagnosisInput,
    evidence: list[Evidence],
    sources: list[str],
    windows: list[tuple[float, float]],
) -> tuple[float, bool, list[str]] | None:
    """The GPU waiting for the host's CPU work between kernels, from traces: (recurring share of the
    window, repeats?, the operators that fill the idle), or None; appends evidence and windows.

    Reads the analysis' ``gpu_idle_attribution.host_work`` (`jobs.profiling.host_work.host_work_breakdown`):
    late-launch idle in long gaps while a launching thread is inside a traced CPU operator. The worst
    rank decides; its share must reach `TT.HOST_WORK_IDLE_PCT` of the window.
    """
    worst: tuple[float, bool, list[str]] | None = None
    for r in A.trace_ranks(inp):
        if not r.attributed():
            continue
        hw = r.idle.host_work
        share = hw.cpu_ops_pct
        if share is None or share < TT.HOST_WORK_IDLE_PCT:
            continue
        repeats, recurring, how = A.repetition(
            share,
            r.idle.steps,
            hw.cpu_ops_steps,
            hw.cpu_ops_gaps,
            hw.cpu_ops_largest_gap_pct,
        )
        ops = hw.top_ops
        evidence += [
            Evidence(
                f"{r.label}: GPU idle with nothing queued while the launching threads run CPU operators",
                round(share, 2),
                "% of window",
            ),
            Evidence(f"{r.label}: GPU idle", _round(r.idle.idle_pct), "% of window"),
            Evidence(
                f"{r.label}: GPU idle in gaps of >= 1 ms ended by a late launch",
                _round(hw.late_launch_pct),
                "% of window",
            ),
            Evidence(
                f"{r.label}: of it, the host in CUDA runtime calls (allocation, lazy init)",
                _round(hw.runtime_pct),
                "% of window",
            ),
            Evidence(
                f"{r.label}: of it, the host in nothing traced (Python, sleep, I/O: not visible)",
                _round(hw.untraced_pct),
                "% of window",
            ),
            Evidence(
                f"{r.label}: DataLoader time on the host", r.rank.input_pipeline.dataloader_step_pct, "%"
            ),
        ]
        if how is not None:
            evidence.append(
                Evidence(
                    f"{r.label}: host-work idle {how}"
                    + ("" if repeats else " (not a repeating pattern of the steady state)"),
                    round(recurring, 2),
                    "% of window recurring",
                )
            )
        for op in ops[:3]:
            evidence.append(
                Evidence(
                    f"{r.label}: host in {(op.name or '?')[:160]} "
                    f"({int(op.count or 0)} calls) while the GPU waits",
                    op.idle_pct,
                    "% of window",
                )
            )
        names = [op.name for op in ops[:2] if op.name]
        hit = (clamp01(recurring / 100.0), repeats, names)
        if worst is None or hit[0] > worst[0]:
            worst = hit
        windows += r.windows
        if r.source not in sources:
            sources.append(r.source)
    return worst


def host_work_title(host: tuple[float, bool, list[str]]) -> str:
    recurring, repeats, names = host
    ops = f" ({', '.join(names)})" if names else ""
    if repeats:
        return (
            f"In the captured trace window the GPU waits for the host: CPU work between kernels{ops} "
            f"leaves it idle with nothing queued {pct(recurring)} of the time"
        )
    return (
        "In the captured trace window the GPU waited for host CPU work between kernels once, not in a "
        f"repeating pattern{ops}"
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def trace_advice(inp: DiagnosisInput) -> str:
    """What the traces' DataLoader iterator class says about the workers, as advice ('' when unknown)."""
    iterators = {
        r.rank.input_pipeline.iterator
        for r in A.trace_ranks(inp)
        if (r.idle.input_pct or 0.0) >= TT.INPUT_IDLE_PCT
    }
    if "single_process" in iterators:
        return (
            "The DataLoader runs inside the training process (num_workers=0: _SingleProcessDataLoaderIter): "
            "give it worker processes (num_workers=4-8 per GPU, persistent_workers=True) so batches are "
            "prepared while the GPU computes. "
        )
    if "multi_process" in iterators:
        return (
            "The DataLoader already has worker processes (_MultiProcessingDataLoaderIter) that cannot keep "
            "up: make each sample cheaper first (decode/tokenise offline, cache on local NVMe), then add "
            "workers or raise prefetch_factor. "
        )
    return ""


def pyspy_input(inp: DiagnosisInput, evidence: list[Evidence], sources: list[str]) -> bool:
    hit = False
    for art in A.pyspy(inp):
        analysis = art.pyspy
        share = analysis.input_pipeline_pct
        if share is None or share < T.PYSPY_INPUT_PCT:
            continue
        hit = True
        evidence.append(Evidence(f"{A.source_label(art)}: Python samples in the input pipeline", share, "%"))
        hot = [
            h for h in analysis.hot_inclusive if h.frame_class in ("data_loading", "tokenization", "collate")
        ][:3]
        for h in hot:
            evidence.append(Evidence(f"hot: {(h.label or '?')[:120]}", h.inclusive_pct, "%"))
        if "py-spy" not in sources:
            sources.append("py-spy")
    return hit
