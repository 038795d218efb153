"""Shared GPUs without a database: MIG slices' peaks in the catalog, the cost and MFU of a share through
the one KPI definition (compute_kpis), and the shared_gpu rule (evidence, severity, what it does to the
other findings)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from jobs.diagnosis import DiagnosisInput, Evidence, Finding, Severity, diagnose
from jobs.diagnosis.rules import shared_gpu
from jobs.evaluation.catalog import gpu_by_name, match_gpu_name, match_mig_name, mig_profile, mig_slice
from jobs.evaluation.gpu_attribution import Attribution, Usage, attribute
from jobs.evaluation.kpis import ModelShape, compute_kpis
from jobs.evaluation.schema import GpuSharing, SharedWith
from jobs.evaluation.sharing import SharedGpu, SharingReport, summarise

HOUR = 3600.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)
H100 = gpu_by_name("H100 SXM")
PRICE = 6.88  # USD per GPU-hour (H100 on demand, the seeded price book)


# ------------------------------------------------------------------------------------------- catalog


def test_a_mig_slice_is_billed_by_compute_slices_and_peaks_by_its_sms():
    # H100: 16 SMs per compute slice, 132 SMs in all; a 3g slice is billed 3/7 and reaches 48/132.
    piece = mig_slice(H100, "3g.40gb")
    assert piece is not None
    assert piece.cost_fraction == pytest.approx(3 / 7)
    assert piece.peak_fraction == pytest.approx(48 / 132)
    # A100: 14 SMs per slice of 108.
    a100 = mig_slice(gpu_by_name("A100 SXM 80GB"), "1g.10gb")
    assert a100 is not None and a100.peak_fraction == pytest.approx(14 / 108)
    # One compute instance of a 3g GPU instance: billed with the GPU instance, 1 slice of SMs.
    ci = mig_slice(H100, "1c.3g.40gb")
    assert (
        ci is not None
        and ci.cost_fraction == pytest.approx(3 / 7)
        and ci.peak_fraction == pytest.approx(16 / 132)
    )


def test_without_an_sm_reading_a_slice_peaks_at_its_compute_slices_over_seven():
    piece = mig_slice(gpu_by_name("B200"), "2g.45gb")
    assert piece is not None and piece.peak_fraction == pytest.approx(2 / 7)
    assert "approximation" in piece.source
    assert mig_slice(H100, "8g.90gb") is None and mig_slice(H100, "full") is None


def test_mig_device_names_resolve_to_the_parent_gpu_and_the_slice_never_to_a_whole_gpu():
    assert match_gpu_name("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb") is None
    found = match_mig_name("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb")
    assert found is not None and found[0].name == "H100 SXM" and found[1].profile == "3g.40gb"
    assert mig_profile("nvidia.com/mig-1g.10gb") == "1g.10gb"
    assert match_mig_name("NVIDIA H100 80GB HBM3") is None


# --------------------------------------------------------------------------------------- attribution


def _kpis(gpu_count: int, hours: float, gpu_eq: float | None = None, peak_eq: float | None = None):
    ts = np.arange(0.0, hours * HOUR, 60.0)
    return compute_kpis(
        start=T0,
        end=T0 + timedelta(hours=hours),
        gpu_count=gpu_count,
        shape=ModelShape(n_params=7e9),
        peak_flops_per_gpu=989.5e12,
        peak_clock_mhz=None,
        grid_step_s=60.0,
        tokens_per_second=np.full(ts.shape, 1000.0),
        throughput_source="test",
        gpu_util=np.full(ts.shape, 0.9),
        sm_active=None,
        tensor_active=None,
        sm_clock=None,
        prices=[(T0, PRICE)],
        price_label="H100 SXM, on demand",
        reference_mfu=0.45,
        reference_source="target",
        flops_convention="6n",
        gpu_equivalents=gpu_eq,
        peak_equivalents=peak_eq,
    )


def test_two_time_sliced_jobs_are_charged_shares_that_add_up_to_the_gpus_cost():
    # A holds n/0 for 0-2 h, B for 1-3 h: A alone 1 h, both 1 h (half each), B alone 1 h, so each gets
    # 1.5 GPU-h of its 2 h held: share 0.75, 0.75 GPU equivalents, cost 1.5 h x $6.88 = $10.32.
    att = attribute([Usage("n/0", "A", 0, 2 * HOUR), Usage("n/0", "B", HOUR, 3 * HOUR)])
    costs = []
    for job in ("A", "B"):
        share = att.job_share(job)
        assert share == pytest.approx(0.75)
        k = _kpis(1, 2.0, gpu_eq=share)
        assert k.gpu_hours == pytest.approx(1.5)
        assert k.cost_usd == pytest.approx(1.5 * PRICE)
        assert k.cost_per_day_usd == pytest.approx(0.75 * PRICE * 24)
        costs.append(k.cost_usd)
    # The GPU was held 3 h in all: $20.64, split between the two, not $27.52 (each charged in full).
    assert sum(costs) == pytest.approx(3 * PRICE)
    assert _kpis(1, 2.0).cost_usd == pytest.approx(2 * PRICE)  # unshared: the whole GPU


def test_mfu_on_a_mig_slice_is_against_the_slices_peak():
    # 6N = 4.2e10 FLOPs/token x 1000 tokens/s = 4.2e13 FLOP/s; the 3g slice of an H100 peaks at
    # 48/132 x 989.5e12 = 3.598e14 FLOP/s: MFU 0.1167 (against the whole GPU it would read 0.0424).
    k = _kpis(1, 2.0, gpu_eq=3 / 7, peak_eq=48 / 132)
    assert k.mfu == pytest.approx(4.2e13 / (48 / 132 * 989.5e12))
    assert _kpis(1, 2.0).mfu == pytest.approx(4.2e13 / 989.5e12)
    assert k.cost_usd == pytest.approx(2 * PRICE * 3 / 7)
    # Waste is of the slice's cost, against the slice's MFU.
    assert k.waste is not None and k.waste.total_per_day == pytest.approx(
        3 / 7 * PRICE * 24 * (1 - k.mfu / 0.45)
    )
    assert "GPU equivalents" in k.variants["cost"]
    assert "against 0.364 GPU peaks" in k.variants["mfu"]


def test_summarise_gives_gpu_and_peak_equivalents_of_a_mig_slice():
    att = attribute([Usage("n/0", "A", 0, HOUR, "1", "3g.40gb"), Usage("n/0", "B", 0, HOUR, "2", "4g.40gb")])
    report = SharingReport(
        "A", [SharedGpu("n/0", "B", T0, T0 + timedelta(hours=1), True)], att, att.job_share("A"),
        {"n/0": ("1", "3g.40gb")},
    )  # fmt: skip
    sharing = summarise(report, 1, H100)
    assert sharing is not None
    assert sharing.gpu_equivalents == pytest.approx(3 / 7)
    assert sharing.peak_equivalents == pytest.approx(48 / 132)
    assert sharing.label == "0.43 of 1 GPU, MIG 3g.40gb"
    unshared = SharingReport("C", [], Attribution({("C", "n/1"): HOUR}, {}, {("C", "n/1"): HOUR}), 1.0)
    assert summarise(unshared, 1, H100) is None


# ------------------------------------------------------------------------------------------------ rule


def _sliced() -> GpuSharing:
    return GpuSharing(
        share=0.875,
        gpu_equivalents=1.75,
        peak_equivalents=1.75,
        label="1.75 of 2 GPUs, time-sliced with 6004",
        shared=[SharedWith(gpu="node-t/0", other_job="6004", start=T0.timestamp() + HOUR,
                           end=T0.timestamp() + 2 * HOUR)],
    )  # fmt: skip


def _evidence(finding: Finding) -> dict[str, object]:
    return {e.label: e.value for e in finding.evidence}


def test_time_sliced_gpus_give_a_shared_gpu_warning_with_whom_when_and_the_share():
    findings = diagnose(DiagnosisInput(signals=None, gpu_count=2, sharing=_sliced()))
    found = [f for f in findings if f.code == "shared_gpu"]
    assert len(found) == 1
    f = found[0]
    assert f.severity is Severity.WARNING and "thinned out" in f.title
    ev = _evidence(f)
    assert ev["this job's share of its GPUs' time"] == 87.5
    assert ev["time-sliced GPUs"] == "node-t/0" and ev["other jobs on them"] == "6004"
    assert ev["node-t/0 with 6004"] == "2026-01-01 01:00 – 2026-01-01 02:00 UTC"
    # 1 / 0.875 = 1.14x slower while 6004 is busy.
    assert ev["expected slowdown while the other jobs are busy (1 / share)"] == pytest.approx(1.14)
    assert f.windows == [(T0.timestamp() + HOUR, T0.timestamp() + 2 * HOUR)]
    assert f.impact == 0.0


def test_mig_slices_alone_are_context_not_a_warning():
    neighbour = SharedWith(gpu="node-m/0", other_job="6002", start=0.0, end=HOUR, mig=True)
    sharing = GpuSharing(
        share=3 / 7,
        gpu_equivalents=3 / 7,
        peak_equivalents=48 / 132,
        label="0.43 of 1 GPU, MIG 3g.40gb",
        mig={"node-m/0": ["1", "3g.40gb"]},
        shared=[neighbour],
    )
    f = next(
        f
        for f in diagnose(DiagnosisInput(signals=None, gpu_count=1, sharing=sharing))
        if f.code == "shared_gpu"
    )
    assert f.severity is Severity.INFO and "3g.40gb" in f.title
    assert _evidence(f)["MIG profiles"] == "3g.40gb"
    assert not f.windows  # MIG neighbours do not slow the job: no contention window


def test_no_sharing_no_finding():
    assert not [f for f in diagnose(DiagnosisInput(signals=None, gpu_count=2)) if f.code == "shared_gpu"]


def test_activity_findings_on_time_sliced_gpus_say_so_and_lose_confidence_but_idle_keeps_it():
    inp = DiagnosisInput(signals=None, gpu_count=2, sharing=_sliced())

    def make(code: str) -> Finding:
        return Finding(code, Severity.WARNING, 0.9, "t", "r", [Evidence("x", 1.0)], sources=["metrics"])

    low_sm, idle, xid = make("false_saturation"), make("idle_gpus"), make("gpu_errors")
    shared_gpu.qualify([low_sm, idle, xid], inp)
    assert low_sm.confidence == pytest.approx(0.9 * 0.8)
    assert any("time-sliced" in e.label for e in low_sm.evidence)
    assert idle.confidence == 0.9 and any("unused" in e.label for e in idle.evidence)
    assert xid.confidence == 0.9 and len(xid.evidence) == 1


# ------------------------------------------------------------------------------------------- simulator


def test_simulated_mig_instances_are_labelled_like_dcgm_exporter_and_report_no_gpu_util():
    from jobs.simulate import SimSpec, simulate
    from jobs.simulate.writers import exporter_text

    res = simulate(SimSpec(gpus=2, job_id="1", duration_s=600, hosts=("n",), mig=(("1", "3g.40gb"),)))
    assert res.gpus[0].labels["GPU_I_ID"] == "1" and res.gpus[0].labels["GPU_I_PROFILE"] == "3g.40gb"
    assert "GPU_I_ID" not in res.gpus[1].labels  # the second GPU is whole
    util = res.fields["gpu_util"]
    assert np.isnan(util[0]).all() and np.isfinite(util[1]).any()
    text = exporter_text([res], res.timestamps[5])
    mig_lines = [line for line in text.splitlines() if 'GPU_I_PROFILE="3g.40gb"' in line]
    assert any(line.startswith("DCGM_FI_PROF_GR_ENGINE_ACTIVE{") for line in mig_lines)
    assert not any(line.startswith("DCGM_FI_DEV_GPU_UTIL{") for line in mig_lines)
