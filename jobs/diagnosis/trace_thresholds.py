"""Thresholds of the trace-side rules, on the shares of the step a trace analysis measures.

The trace analysis (`jobs.profiling.host_analysis`) splits the GPU's idle time inside the profiled steps
into input (host in the DataLoader), host_sync (host blocked on the GPU, or relaunching after a drain),
launch gaps (idle gaps under 1 ms) and other. Each rule fires on its own share, and its impact is that
share, so the findings of one trace rank by what they measurably cost.
"""

from __future__ import annotations

#: Fewer GPU kernels than this in a rank: a smoke test or a warm-up snippet (the shared samples' 1- and
#: 2-kernel exports), whose shares describe initialisation, not training steps. No trace rule reads it.
MIN_TRACE_KERNELS = 10

#: data_pipeline_stall: GPU idle while the host is inside the DataLoader iterator, as % of the step, at or
#: above this. The TensorBoard profiler plugin recommends more DataLoader workers above a 5 % DataLoader
#: share of the step; we ask that much *exposed* (GPU idle) loader time.
INPUT_IDLE_PCT = 5.0
#: ... at or above this it is a warning (the metric rules' DATALOADER_PCT).
INPUT_IDLE_WARN_PCT = 10.0

#: launch_overhead: idle time in gaps shorter than the launch-gap limit, as % of the step, at or above
#: this (below ~10 % of the step, fusing kernels or CUDA graphs are not worth the effort) ...
LAUNCH_GAPS_PCT = 10.0
#: ... while the host is busy launching: a traced op or runtime call covers at least this share of the
#: gaps, or the kernels are tiny / shorter than their launch calls (HTA's launch statistics).
LAUNCH_HOST_BUSY_PCT = 50.0
TINY_KERNEL_PCT = 50.0
SHORTER_THAN_LAUNCH_PCT = 50.0

#: host_sync: GPU idle caused by host blocking (blocked, or relaunching after a drain), % of the step, at
#: or above this. A host that blocks while the GPU keeps working (a GPU-bound step whose CPU waits
#: ahead of it) costs nothing, so the CPU-side blocked share alone does not fire the rule.
HOST_SYNC_IDLE_PCT = 5.0
HOST_SYNC_IDLE_WARN_PCT = 10.0

#: A warning needs a pattern that repeats in the steady state (issue #24): over several profiled steps,
#: at least this many steps and this share of them show it (each at least host_analysis'
#: STEP_SHARE_MIN_PCT of its step); over a single window (one step, or no ProfilerStep), at least this many
#: distinct idle gaps show it and no single gap holds most of it (a one-off -- a lazy cudaFree of the first
#: forward pass, a checkpoint -- is not the steady state).
REPEAT_MIN_STEPS = 2
REPEAT_STEP_SHARE_PCT = 50.0
REPEAT_MIN_GAPS = 3
ONE_OFF_GAP_PCT = 50.0

#: tensor_cores_idle: share of compute-kernel time in SIMT (CUDA-core) GEMM/convolution kernels at or
#: above this, when compute is a real part of the step (COMPUTE_MIN_PCT of the GPU span).
SIMT_COMPUTE_PCT = 30.0
COMPUTE_MIN_PCT = 20.0
#: Share of SIMT matmul time tensor cores would save: dense BF16/FP16 tensor math is 8-16x FP32 FFMA on
#: A100/H100 (312 vs 19.5 TFLOP/s on A100), so even a 4x practical speedup saves 75 %.
SIMT_TIME_SAVED = 0.75

#: data_pipeline_stall's host-work reading: GPU idle in long gaps that end with a late launch (nothing was
#: queued) while the launching threads run traced CPU operators, as % of the window, at or above this (the
#: same bar as launch_overhead's: below ~10 % moving host work off the critical path is not worth it). A
#: warning needs it to repeat (REPEAT_*), as for host_sync.
HOST_WORK_IDLE_PCT = 10.0
