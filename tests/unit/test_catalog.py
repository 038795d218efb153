"""GPU catalog, device-name matching, dtypes and seed prices (jobs/catalog.py)."""

from __future__ import annotations

import copy
import json
import pickle
from datetime import date

import pytest

from jobs import catalog

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


def test_variant_specific_facts() -> None:
    specs = {spec.name: spec for spec in catalog.GPU_SPECS}
    assert specs["A100 SXM 40GB"].bandwidth_tbps == 1.555 and specs["A100 SXM 80GB"].bandwidth_tbps == 2.039
    assert specs["A100 PCIe 40GB"].tdp_w == 250 and specs["A100 PCIe 80GB"].tdp_w == 300
    assert specs["A10"].sm_count == 72 and specs["A10G"].sm_count == 80
    assert specs["H100 SXM"].boost_clock_mhz == 1830 and specs["A100 SXM 80GB"].boost_clock_mhz == 1410
    assert specs["B200"].boost_clock_mhz is None
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
