"""Unified Memory page migrations in an `nsys stats` memory summary count as host<->device copies
(host_device_copy), with prefetch advice when they are most of the copy time.

The tables are written here in nsys' documented column layout (cuda_gpu_kern_sum, cuda_gpu_mem_time_sum;
Nsight Systems User Guide, "Report Scripts") with numbers chosen for the test; the real GPUJoin summaries
(tests/unit/test_real_nsys_stats.py) show the same "[CUDA Unified Memory memcpy HtoD]" labels at a copy
share too small to matter (0.03-0.24 % of kernel time).
"""

from __future__ import annotations

from jobs.diagnosis import diagnose
from jobs.diagnosis.base import ArtifactAnalysis, DiagnosisInput, Finding
from jobs.profiling.nsys_stats import analyze_nsys_stats

KERNELS = (
    "[6/8] Executing 'cuda_gpu_kern_sum' stats report\n\n"
    " Time (%)  Total Time (ns)  Instances  Avg (ns)   Med (ns)   Min (ns)  Max (ns)  StdDev (ns)  Name\n"
    " --------  ---------------  ---------  ---------  ---------  --------  --------  -----------  ----\n"
    "    100.0       20,000,000         20  1,000,000  1,000,000   990,000  1,010,000      5,000.0  "
    "add_kernel(float *, float *, float *, int)\n\n"
)


def memtime(*rows: tuple[str, int, int]) -> str:
    """A cuda_gpu_mem_time_sum table of (operation label, total ns, count)."""
    lines = [
        "[7/8] Executing 'cuda_gpu_mem_time_sum' stats report\n\n",
        " Time (%)  Total Time (ns)  Count  Avg (ns)  Med (ns)  Min (ns)  Max (ns)  StdDev (ns)  Operation\n",
        " --------  ---------------  -----  --------  --------  --------  --------  -----------  ---------\n",
    ]
    total = sum(t for _, t, _ in rows)
    for label, t, n in rows:
        avg = t // n
        stats = f"{avg:8}  {avg:8}  {avg:8}  {avg:8}  {0.0:11}"
        lines.append(f" {100 * t / total:8.1f}  {t:15,}  {n:5}  {stats}  {label}\n")
    return "".join(lines) + "\n"


def host_device_copy(text: str) -> Finding | None:
    analysis = analyze_nsys_stats(text.encode(), filename="stats.txt")
    art = ArtifactAnalysis("nsys_stats_csv", analysis, name="stats.txt")
    found = diagnose(DiagnosisInput(signals=None, gpu_count=1, artifacts=[art]))
    return next((f for f in found if f.code == "host_device_copy"), None)


def test_unified_memory_migrations_that_outweigh_kernels_are_host_device_copies() -> None:
    # 30 ms of page migrations beside 20 ms of kernels: 60 % of copy + kernel time.
    f = host_device_copy(
        KERNELS
        + memtime(
            ("[CUDA Unified Memory memcpy HtoD]", 24_000_000, 6_000),
            ("[CUDA Unified Memory memcpy DtoH]", 6_000_000, 1_500),
        )
    )
    assert f is not None
    ev = {e.label: e.value for e in f.evidence}
    assert ev["stats.txt: Unified Memory page migrations"] == 30.0
    assert "stats.txt: host<->device memcpy time" not in ev  # no explicit copy in the summary
    assert f.recommendation.startswith("Most of the copy time is Unified Memory page migration")


def test_explicit_copies_keep_the_pinning_advice() -> None:
    f = host_device_copy(
        KERNELS
        + memtime(
            ("[CUDA memcpy Host-to-Device]", 24_000_000, 10),
            ("[CUDA Unified Memory memcpy HtoD]", 1_000_000, 250),
        )
    )
    assert f is not None
    assert f.recommendation.startswith("If the host buffers are pageable")


def test_device_to_device_migrations_are_not_host_traffic() -> None:
    # Unified Memory DtoD (peer migration) never crosses to the host.
    assert host_device_copy(KERNELS + memtime(("[CUDA Unified Memory memcpy DtoD]", 30_000_000, 100))) is None


def test_migrations_that_are_a_small_share_of_kernel_time_are_no_finding() -> None:
    assert host_device_copy(KERNELS + memtime(("[CUDA Unified Memory memcpy HtoD]", 500_000, 120))) is None
