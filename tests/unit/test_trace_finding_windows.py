"""Findings from a trace alone cover the window the trace captured, for every trace rule."""

from __future__ import annotations

from jobs.diagnosis import ArtifactAnalysis, DiagnosisInput, diagnose

CAPTURE = (1_764_000_000.0, 1_764_000_002.5)


def _input(rank: dict) -> DiagnosisInput:
    analysis = {
        "ranks": [rank],
        "capture": {"gpu_names": [], "start_unix": CAPTURE[0], "end_unix": CAPTURE[1], "ranks": [0]},
    }
    art = ArtifactAnalysis(kind="kineto", analysis=analysis, name="t.json", rank=0)
    return DiagnosisInput(signals=None, gpu_count=8, artifacts=[art], cost_per_day_usd=1000.0,
                          waste_per_day_usd=500.0)  # fmt: skip


def test_an_exposed_collective_from_a_trace_is_anchored_to_the_capture_window():
    # 400 ms of NCCL kernels in a 1,000 ms span, 5 % overlapped: 400 x 0.95 / 1000 = 38 % exposed.
    rank = {
        "rank": 0,
        "temporal_breakdown": {"idle_pct": 5.0, "compute_pct": 55.0, "span_ms": 1000.0},
        "kernel_breakdown": {"kernel_count": 200},
        "comm_compute_overlap": {"communication_ms": 400.0, "overlap_pct": 5.0},
    }
    (comm,) = [f for f in diagnose(_input(rank)) if f.code == "communication_wait"]
    assert comm.windows == [CAPTURE]
    assert comm.title.startswith("In the captured trace window") and "38.0 %" in comm.title


def test_host_blocking_from_a_trace_is_anchored_to_the_capture_window():
    rank = {
        "rank": 0,
        "temporal_breakdown": {"idle_pct": 30.0, "span_ms": 1000.0},
        "kernel_breakdown": {"kernel_count": 200},
        "sync": {"cpu_sync_calls": 60, "cpu_sync_ms": 400.0},
        "step_times": {"count": 5},
    }
    (sync,) = [f for f in diagnose(_input(rank)) if f.code == "host_sync"]
    assert sync.windows == [CAPTURE]
