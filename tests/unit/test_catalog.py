"""GPU catalog, device-name matching, dtypes and seed prices (jobs/evaluation/catalog.py)."""

from __future__ import annotations

import copy
import importlib
import json
import pickle
from datetime import date

import pytest

from jobs.evaluation import catalog

# Every device row of reference/gpus.md, with the names it is reported under.
DEVICE_NAMES = [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("Tesla V100-SXM2-16GB", "V100 SXM2"),
    ("Tesla V100-PCIE-16GB", "V100 PCIe"),
    ("AMD Instinct MI250X / MI250", "MI250X"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI325X", "MI325X"),
    ("TPU v4", "TPU v4"),
    # Kubernetes node labels and GKE accelerator names use dashes.
    ("NVIDIA-H100-80GB-HBM3", "H100 SXM"),
    ("nvidia-tesla-a100", "A100 SXM 80GB"),
    ("nvidia-l4", "L4"),
    ("nvidia_h100_pcie", "H100 PCIe"),
]


@pytest.mark.parametrize(("reported", "expected"), DEVICE_NAMES)
def test_reported_device_names_match_their_row(reported: str, expected: str) -> None:
    spec = catalog.match_gpu_name(reported)
    assert spec is not None, reported
    assert spec.name == expected


def test_every_catalog_row_is_reachable_by_canonical_name_and_aliases() -> None:
    for spec in catalog.GPU_SPECS:
        assert catalog.match_gpu_name(spec.name) is spec
        for alias in spec.aliases:
            assert catalog.match_gpu_name(alias) is spec, alias


def test_catalog_covers_every_row_of_gpus_md() -> None:
    names = {spec.name for spec in catalog.GPU_SPECS}
    assert names == {
        "V100 SXM2", "V100 PCIe", "A100 SXM 40GB", "A100 SXM 80GB", "A100 PCIe 40GB", "A100 PCIe 80GB",
        "A10", "A10G", "L4", "L40S", "H100 SXM", "H100 PCIe", "H100 NVL", "H200 SXM", "H200 NVL", "B200",
        "GB200", "MI250X", "MI300X", "MI325X", "TPU v4",
    }  # fmt: skip


def test_l40s_is_not_matched_as_l4() -> None:
    l40s = catalog.match_gpu_name("NVIDIA L40S")
    assert l40s is not None and l40s.name == "L40S"
    assert l40s.peak_tflops["bf16"] == 362.0  # L4 would give 121: MFU 3x too high


@pytest.mark.parametrize(
    "reported",
    [
        "NVIDIA L40",
        "Tesla T4",
        "NVIDIA GH200 480GB",
        "NVIDIA H800",
        "AMD Instinct MI250",
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
        "H100 or A100",
        "v4",
        "",
        None,
    ],
)
def test_unknown_ambiguous_or_partial_names_return_none(reported: str | None) -> None:
    assert catalog.match_gpu_name(reported) is None


def test_b200_is_not_matched_inside_gb200() -> None:
    spec = catalog.match_gpu_name("NVIDIA GB200")
    assert spec is not None and spec.name == "GB200"


def test_peaks_are_dense_and_absent_dtypes_are_missing_not_zero() -> None:
    h100 = catalog.gpu_by_name("H100 SXM")
    a100 = catalog.gpu_by_name("A100 SXM 80GB")
    v100 = catalog.gpu_by_name("V100 SXM2")
    assert h100 is not None and a100 is not None and v100 is not None
    assert h100.peak_tflops["bf16"] == 989.5 and h100.peak_tflops["fp8"] == 1979.0
    assert "fp8" not in a100.peak_tflops
    assert a100.peak_flops("fp8") is None
    assert "bf16" not in v100.peak_tflops
    for spec in catalog.GPU_SPECS:
        assert set(spec.peak_tflops) <= set(catalog.DTYPE_KEYS)
        assert all(value > 0 for value in spec.peak_tflops.values()), spec.name


def test_fp64_vector_and_tensor_and_fp8_vs_int8_are_distinct() -> None:
    h100_pcie = catalog.gpu_by_name("H100 PCIe")
    h100_nvl = catalog.gpu_by_name("H100 NVL")
    assert h100_pcie is not None and h100_nvl is not None
    assert h100_pcie.peak_tflops["fp64"] == 25.6 and h100_pcie.peak_tflops["fp64_tensor"] == 51.0
    assert h100_nvl.peak_tflops["fp8"] == 1671.0 and h100_nvl.peak_tflops["int8"] == 1670.5


def test_peak_flops_converts_to_flop_per_second_and_accepts_aliases() -> None:
    h100 = catalog.gpu_by_name("H100 SXM")
    assert h100 is not None
    assert h100.peak_flops("torch.bfloat16") == pytest.approx(989.5e12)
    assert h100.peak_flops("half") == pytest.approx(989.5e12)
    assert h100.peak_flops("nonsense") is None


def test_database_rows_and_specs_share_one_peak_lookup_that_normalises_the_dtype() -> None:
    # The GpuModel row used to look its JSON up by the raw dtype: "bf16-mixed" found no peak there while
    # the spec found 989.5 TFLOP/s. Both now go through catalog.peak_flops.
    from jobs.models import GpuModel

    spec = catalog.gpu_by_name("H100 SXM")
    assert spec is not None
    row = GpuModel(name=spec.name, peak_tflops=dict(spec.peak_tflops))
    for dtype in ("bf16", "bf16-mixed", "torch.bfloat16", "BF16", "fp8", "e4m3", "half", "fp32", "nonsense"):
        assert row.peak_flops(dtype) == spec.peak_flops(dtype), dtype
    assert row.peak_flops("bf16-mixed") == pytest.approx(989.5e12)
    assert row.peak_flops("fp32") is None  # no dense FP32 tensor peak in the table: unknown, not 0
    assert catalog.peak_flops({"bf16": 0}, "bf16") is None
    assert catalog.peak_flops({"bf16": "312"}, "bf16") is None


def test_an_admin_edit_of_a_row_is_held_to_the_dtype_table() -> None:
    from django.core.exceptions import ValidationError

    from jobs.models import GpuModel

    GpuModel(name="X", peak_tflops={"bf16": 312.0, "fp64_tensor": 19.5}).clean()
    for peaks, message in (
        ({"bf16-mixed": 312.0}, "unknown dtype keys"),
        ({"fp32": 19.5}, "unknown dtype keys"),  # no dense FP32 tensor peak: DTYPE_KEYS leaves it out
        ({"bf16": 0}, "positive number"),
        ({"bf16": "312"}, "positive number"),
    ):
        with pytest.raises(ValidationError, match=message):
            GpuModel(name="X", peak_tflops=peaks).clean()


def test_variant_specific_facts() -> None:
    specs = {spec.name: spec for spec in catalog.GPU_SPECS}
    assert specs["A100 SXM 40GB"].bandwidth_tbps == 1.555 and specs["A100 SXM 80GB"].bandwidth_tbps == 2.039
    assert specs["A100 PCIe 40GB"].tdp_w == 250 and specs["A100 PCIe 80GB"].tdp_w == 300
    assert specs["A10"].sm_count == 72 and specs["A10G"].sm_count == 80
    assert specs["H100 SXM"].peak_clock_mhz == 1830 and specs["A100 SXM 80GB"].peak_clock_mhz == 1410
    assert specs["B200"].peak_clock_mhz is None and specs["B200"].max_clock_mhz is None
    assert specs["L4"].single_source and not specs["H100 SXM"].single_source
    assert "GCD" in specs["MI250X"].source


def test_to_dict_is_json_serialisable_and_complete() -> None:
    for spec in catalog.GPU_SPECS:
        data = spec.to_dict()
        json.dumps(data)
        assert data["name"] == spec.name and data["peak_tflops"] == dict(spec.peak_tflops)


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("bfloat16", "bf16"),
        ("BF16", "bf16"),
        ("bf16-mixed", "bf16"),
        ("torch.bfloat16", "bf16"),
        ("half", "fp16"),
        ("float16", "fp16"),
        ("16-mixed", "fp16"),
        ("tf32", "tf32"),
        ("float32", "fp32"),
        ("float8_e4m3fn", "fp8"),
        ("fp8", "fp8"),
        ("int8", "int8"),
        ("float64", "fp64"),
    ],
)
def test_normalise_dtype_aliases(alias: str, canonical: str) -> None:
    assert catalog.normalise_dtype(alias) == canonical


def test_normalise_dtype_unknown_is_none() -> None:
    assert catalog.normalise_dtype("bf17") is None
    assert catalog.normalise_dtype(None) is None


def test_price_seeds_reference_catalog_rows_and_valid_tiers() -> None:
    for seed in (*catalog.PRICE_SEEDS, *catalog.MARKET_PRICES):
        assert catalog.gpu_by_name(seed.gpu) is not None, seed.gpu
        assert seed.tier in catalog.PRICE_TIERS
        assert seed.usd_per_gpu_hour > 0
        assert isinstance(seed.effective_from, date)
        assert seed.source
        json.dumps(seed.to_dict())


def test_price_seeds_have_one_price_per_gpu_and_tier() -> None:
    keys = [(seed.gpu, seed.tier) for seed in catalog.PRICE_SEEDS]
    assert len(keys) == len(set(keys))


def test_price_seeds_use_aws_on_demand_and_capacity_block_figures() -> None:
    seeds = {(seed.gpu, seed.tier): seed for seed in catalog.PRICE_SEEDS}
    assert seeds[("H100 SXM", "on_demand")].usd_per_gpu_hour == 6.88
    assert seeds[("H100 SXM", "reserved")].usd_per_gpu_hour == 4.92
    assert seeds[("H100 SXM", "spot")].usd_per_gpu_hour == 6.57
    assert seeds[("H200 SXM", "on_demand")].usd_per_gpu_hour == 7.91
    assert seeds[("H200 SXM", "reserved")].usd_per_gpu_hour == 5.41
    assert seeds[("B200", "on_demand")].usd_per_gpu_hour == 14.24
    assert seeds[("A100 SXM 40GB", "on_demand")].usd_per_gpu_hour == 2.74
    assert seeds[("A100 SXM 40GB", "reserved")].usd_per_gpu_hour == 1.74
    assert seeds[("A100 SXM 80GB", "on_demand")].usd_per_gpu_hour == 3.43
    assert seeds[("A100 SXM 80GB", "reserved")].usd_per_gpu_hour == 2.18
    assert "p5.48xlarge" in seeds[("H100 SXM", "on_demand")].source


def test_specs_survive_pickle_and_deepcopy() -> None:
    spec = catalog.GPU_SPECS[0]
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert copy.deepcopy(spec) == spec


def test_catalog_peaks_cannot_be_mutated() -> None:
    spec = catalog.GPU_SPECS[0]
    with pytest.raises(TypeError):
        spec.peak_tflops["fp16"] = 1.0  # type: ignore[index]


# ---------------------------------------------------------------------------- clocks and memory capacity


def test_h100_sxm_dense_peak_is_reproduced_by_its_peak_clock_not_its_max_clock() -> None:
    h100 = catalog.gpu_by_name("H100 SXM")
    assert h100 is not None and h100.peak_clock_mhz is not None and h100.max_clock_mhz is not None
    # 528 tensor cores (132 SMs x 4) x 512 dense BF16 FMA per clock each x 2 FLOP per FMA:
    # 528 x 512 = 270,336 FMA/clk; x 2 = 540,672 FLOP/clk; x 1.83e9 clk/s = 989.43e12 FLOP/s.
    flop_per_clock = 528 * 512 * 2
    assert flop_per_clock == 540_672
    from_peak_clock = flop_per_clock * h100.peak_clock_mhz * 1e6
    assert from_peak_clock == pytest.approx(989.43e12, rel=1e-4)
    # The table's 989.5 is NVIDIA's rounding of 989.4: within 0.01 %.
    assert from_peak_clock == pytest.approx(h100.peak_flops("bf16"), rel=1e-3)
    # At the 1980 MHz max boost the same arithmetic gives 540,672 x 1.98e9 = 1070.5e12: 8 % off the quoted
    # peak, so the quoted peak does not assume the max clock.
    from_max_clock = flop_per_clock * h100.max_clock_mhz * 1e6
    assert from_max_clock == pytest.approx(1070.5e12, rel=1e-4)
    assert from_max_clock / h100.peak_flops("bf16") > 1.05


def test_h100_sxm_max_boost_clock_is_1980_mhz_above_the_peaks_1830() -> None:
    h100 = catalog.gpu_by_name("H100 SXM")
    assert h100 is not None
    # reference/gpus.md: "a healthy H100 SXM runs its SMs up to 1980 MHz (max boost)".
    assert h100.max_clock_mhz == 1980
    assert h100.peak_clock_mhz == 1830


def test_a100_peak_clock_is_also_its_max_boost_clock() -> None:
    for name in ("A100 SXM 40GB", "A100 SXM 80GB", "A100 PCIe 40GB", "A100 PCIe 80GB"):
        spec = catalog.gpu_by_name(name)
        assert spec is not None
        assert spec.peak_clock_mhz == spec.max_clock_mhz == 1410, name
        # 432 tensor cores x 256 dense FP16 FMA/clk x 2 x 1.41 GHz = 311.9e12: the 312 TFLOP/s peak.
        assert spec.peak_flops("bf16") == pytest.approx(432 * 256 * 2 * 1.41e9, rel=1e-3)


def test_h100_80gb_memory_is_81559_mib_as_the_gpu_reports_not_80_decimal_gb() -> None:
    h100 = catalog.gpu_by_name("H100 SXM")
    assert h100 is not None
    assert h100.memory_mib == 81559
    # The old figure, 80 GB read as decimal: 80e9 B / 2**20 B/MiB = 76,293.9 MiB, 5,265 MiB (6.5 %) short.
    assert h100.memory_mib - round(80e9 / 2**20) == 81559 - 76294


def test_a100_memory_is_the_power_of_two_figure_nvidia_smi_reports() -> None:
    specs = {spec.name: spec for spec in catalog.GPU_SPECS}
    # nvidia-smi shows 81920MiB (= 80 x 1024) on A100 80GB and 40960MiB (= 40 x 1024) on A100 40GB.
    assert specs["A100 SXM 80GB"].memory_mib == specs["A100 PCIe 80GB"].memory_mib == 80 * 1024
    assert specs["A100 SXM 40GB"].memory_mib == specs["A100 PCIe 40GB"].memory_mib == 40 * 1024


def test_every_memory_figure_is_a_reported_mib_reading_with_its_source() -> None:
    for spec in catalog.GPU_SPECS:
        if spec.memory_mib is None:
            continue
        # Every figure is a MiB reading (tens of thousands), never a GB figure left in the field.
        assert spec.memory_mib > 1024, spec.name
        assert "MiB as nvidia-smi reports" in spec.source, spec.name
    assert catalog.gpu_by_name("B200").memory_mib is None  # type: ignore[union-attr]


def test_no_catalog_row_has_a_peak_clock_above_its_max_clock() -> None:
    for spec in catalog.GPU_SPECS:
        if spec.peak_clock_mhz is not None and spec.max_clock_mhz is not None:
            assert spec.peak_clock_mhz <= spec.max_clock_mhz, spec.name


# Migration 0004 freezes this release's corrected values; its row logic is pure and tested here.
_M0004 = importlib.import_module("jobs.migrations.0004_gpu_clocks")


def test_migration_0004_froze_the_catalog_values_of_this_release() -> None:
    for name, (peak, max_clock, mib) in _M0004.CORRECTED.items():
        spec = catalog.gpu_by_name(name)
        assert spec is not None
        assert (spec.peak_clock_mhz, spec.max_clock_mhz, spec.memory_mib) == (peak, max_clock, mib), name
    with_clocks = {s.name for s in catalog.GPU_SPECS if s.max_clock_mhz or s.memory_mib or s.peak_clock_mhz}
    assert with_clocks == set(_M0004.CORRECTED)


def test_migration_0004_corrects_a_seeded_h100_row() -> None:
    # 0002 seeded boost 1830 (renamed to peak) and memory_gb 80: both are the known-wrong seeds.
    fields = _M0004.corrected_fields("H100 SXM", 1830, 80.0)
    assert fields == {"peak_clock_mhz": 1830, "max_clock_mhz": 1980, "memory_mib": 81559}


def test_migration_0004_fills_rows_a_fresh_database_seeded_without_clocks() -> None:
    # On a fresh database 0002 seeds through today's catalog, which has no boost_clock_mhz / memory_gb.
    fields = _M0004.corrected_fields("A100 SXM 40GB", None, None)
    assert fields == {"peak_clock_mhz": 1410, "max_clock_mhz": 1410, "memory_mib": 40960}


def test_migration_0004_keeps_an_admins_edits() -> None:
    # An admin wrote 79.0 GB: kept, converted as the code did before: 79e9 / 2**20 = 75,340.3 -> 75,340 MiB.
    edited = _M0004.corrected_fields("H100 SXM", 1755, 79.0)
    assert edited == {"peak_clock_mhz": 1755, "max_clock_mhz": 1980, "memory_mib": 75340}
    # A GPU the catalog does not know: its one clock served both purposes, so it keeps doing so.
    custom = _M0004.corrected_fields("RTX 6000 Ada", 2505, 48.0)
    assert custom == {"peak_clock_mhz": 2505, "max_clock_mhz": 2505, "memory_mib": round(48e9 / 2**20)}


def test_migration_0004_reverses_to_the_seeded_decimal_gb() -> None:
    assert _M0004.restored_memory_gb("H100 SXM", 81559) == 80.0
    assert _M0004.restored_memory_gb("H100 SXM", None) is None
    # Not the catalog figure: MiB back to decimal GB, 75,340 x 2**20 / 1e9 = 79.0 GB (to 3 decimals).
    assert _M0004.restored_memory_gb("H100 SXM", 75340) == pytest.approx(79.0, abs=1e-3)


def test_the_simulator_takes_every_figure_the_catalog_has_from_the_catalog() -> None:
    from jobs.simulate.gpus import GPU_MODELS

    for name, model in GPU_MODELS.items():
        spec = catalog.match_gpu_name(name)
        assert spec is not None, name
        assert model.peak_bf16_tflops == spec.peak_tflops["bf16"], name
        assert model.tdp_w == spec.tdp_w, name
        if spec.memory_mib is not None:
            assert model.fb_total_mib == spec.memory_mib, name
        if spec.max_clock_mhz is not None:
            assert model.max_sm_clock_mhz == spec.max_clock_mhz, name


def test_the_simulator_refuses_a_second_value_for_a_fact_the_catalog_holds() -> None:
    from jobs.simulate.gpus import _from_catalog

    kw = {"fb_reserved_mib": 1, "idle_sm_clock_mhz": 1, "mem_clock_mhz": 1, "idle_w": 1.0, "pcie_gbps": 1.0}
    with pytest.raises(ValueError, match="catalog has the memory"):
        _from_catalog("NVIDIA H100 80GB HBM3", nvlink_gbps=0, approx_fb_total_mib=80000, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="matches no row"):
        _from_catalog("NVIDIA Quantum 9000", nvlink_gbps=0, **kw)  # type: ignore[arg-type]


def test_the_rules_harness_reads_the_gpu_facts_from_the_catalog_row() -> None:
    from benchmarks.diagnosis_inputs import input_from_sim
    from jobs.simulate import SimSpec, simulate

    res = simulate(SimSpec(scenario="healthy", gpus=1, duration_s=600, gpu_model="NVIDIA A100-SXM4-40GB"))
    spec = catalog.match_gpu_name("NVIDIA A100-SXM4-40GB")
    assert spec is not None
    inp = input_from_sim(res)
    assert (inp.gpu_memory_mib, inp.max_clock_mhz, inp.tdp_w) == (
        spec.memory_mib,
        spec.max_clock_mhz,
        spec.tdp_w,
    )
    unknown = input_from_sim(res, catalog=False)
    assert (unknown.gpu_memory_mib, unknown.max_clock_mhz, unknown.tdp_w) == (None, None, None)
