"""GPU catalog and seed prices from ``reference/gpus.md``, and matching of reported device names.

Pure data (no Django): a data migration loads ``GPU_SPECS`` and ``PRICE_SEEDS`` into the database, where
admins can edit them. All tensor peaks are DENSE TFLOP/s; a dtype the GPU does not support is absent from
``peak_tflops`` rather than 0, so MFU can never be computed against a made-up peak.

Device names are matched by whole tokens, never substrings: ``"l4" in "l40s"`` would send an L40S to the
L4 row and report an MFU three times too high. An unknown name returns None; there is no fallback GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from types import MappingProxyType
from typing import Any, Literal

#: The service's one dtype table: every dtype a job may be registered with, as canonical keys in display
#: order (widest first). The API's serializer, the KPIs (FP8's own target), the rules (tensor-core dtypes)
#: and the pages all read it; spellings map onto it through `normalise_dtype`, so a Lightning precision
#: string such as "bf16-mixed" is accepted everywhere and stored as "bf16" (the matmuls of bf16 mixed
#: precision run in BF16, so the BF16 dense peak is the one its MFU is a share of).
DTYPES: tuple[str, ...] = ("fp64", "fp64_tensor", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
#: Dtypes a catalog row may give a dense peak for: FP32 has none (its matmuls run as TF32 on tensor cores
#: or on the CUDA cores at the vector rate), so an FP32 job's MFU is unknown rather than against a guess.
DTYPE_KEYS: tuple[str, ...] = tuple(d for d in DTYPES if d != "fp32")
#: Dtypes whose matmuls run on tensor cores (NVIDIA CUDA C++ Programming Guide, "Warp Matrix Functions":
#: tf32, bf16, fp16, fp8 and int8 element types; FP64 tensor MMA exists but is listed apart as fp64_tensor).
TENSOR_CORE_DTYPES: frozenset[str] = frozenset({"tf32", "bf16", "fp16", "fp8", "int8"})
#: FP8 has a dense peak twice BF16's on Hopper, so its MFU target is separate (settings.TARGET_MFU_FP8).
FP8 = "fp8"
PRICE_TIERS: tuple[str, ...] = ("on_demand", "reserved", "spot", "on_prem")
PriceTier = Literal["on_demand", "reserved", "spot", "on_prem"]

_PEAK_SOURCES = (
    "reference/gpus.md: Lightning fabric/utilities/throughput.py; composer callbacks/speed_monitor.py; "
    "torchtitan tools/utils.py; stas00/ml-engineering compute/accelerator/README.md"
)
_MAMF_SOURCE = "measured best BF16 matmul (ml-engineering MAMF)"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model (or, for MI250X, one GCD: the unit the driver reports as a device).

    ``sm_count`` holds compute units for AMD parts. ``single_source`` marks rows that rest on one source and
    should be shown as such in the UI. ``peak_clock_mhz`` is the SM clock the dense peaks assume (the tensor
    cross-check scales by SM clock / it); ``max_clock_mhz`` is the maximum boost clock (what throttling is
    judged against). ``memory_mib`` is the capacity as the GPU reports it, in MiB. None means unknown.
    """

    name: str
    vendor: str
    aliases: tuple[str, ...]
    peak_tflops: MappingProxyType[str, float] = field(hash=False)
    memory_mib: int | None = None
    bandwidth_tbps: float | None = None
    sm_count: int | None = None
    tdp_w: float | None = None
    peak_clock_mhz: float | None = None
    max_clock_mhz: float | None = None
    mamf_bf16_tflops: float | None = None
    single_source: bool = False
    source: str = _PEAK_SOURCES

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak in FLOP/s for ``dtype`` (any alias), or None when the GPU has no such peak."""
        return peak_flops(self.peak_tflops, dtype)

    def __reduce__(self) -> tuple[Any, ...]:
        # mappingproxy cannot be pickled; rebuild from plain fields so specs survive Celery, cache, deepcopy.
        return (_spec_from_dict, (self.to_dict(),))

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable fields for the data migration that fills the GpuModel table."""
        return {
            "name": self.name,
            "vendor": self.vendor,
            "aliases": list(self.aliases),
            "peak_tflops": dict(self.peak_tflops),
            "memory_mib": self.memory_mib,
            "bandwidth_tbps": self.bandwidth_tbps,
            "sm_count": self.sm_count,
            "tdp_w": self.tdp_w,
            "peak_clock_mhz": self.peak_clock_mhz,
            "max_clock_mhz": self.max_clock_mhz,
            "mamf_bf16_tflops": self.mamf_bf16_tflops,
            "single_source": self.single_source,
            "source": self.source,
        }


def _spec_from_dict(data: dict[str, Any]) -> GpuSpec:
    fields = dict(data)
    fields["aliases"] = tuple(fields["aliases"])
    fields["peak_tflops"] = MappingProxyType(dict(fields["peak_tflops"]))
    return GpuSpec(**fields)


def _spec(name: str, vendor: str, aliases: tuple[str, ...], peaks: dict[str, float], **kw: Any) -> GpuSpec:
    unknown = set(peaks) - set(DTYPE_KEYS)
    if unknown:
        raise ValueError(f"{name}: unknown dtype keys {sorted(unknown)}")
    return GpuSpec(name=name, vendor=vendor, aliases=aliases, peak_tflops=MappingProxyType(dict(peaks)), **kw)


_A100 = {"fp64": 9.7, "fp64_tensor": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "int8": 624.0}
_A10 = {"tf32": 62.5, "bf16": 125.0, "fp16": 125.0, "int8": 250.0}
_HOPPER_SXM = {
    "fp64": 34.0,
    "fp64_tensor": 67.0,
    "tf32": 494.5,
    "bf16": 989.5,
    "fp16": 989.5,
    "fp8": 1979.0,
    "int8": 1979.0,
}
# Clocks (reference/gpus.md, "Clocks behind the peaks"). The quoted dense peak of a part assumes one SM
# clock: the tensor cross-check scales by SM clock / that clock. The max boost clock can be higher (H100
# SXM: 1980 vs 1830 MHz); throttling is judged against it, since a GPU at the peak's clock is not slowed.
H100_SXM_PEAK_CLOCK_MHZ = 1830  # 528 tensor cores x 512 FMA/clk x 2 FLOP x 1.83 GHz = 989.4 TFLOP/s
H100_SXM_MAX_CLOCK_MHZ = 1980  # max boost; what DCGM_FI_DEV_MAX_SM_CLOCK reports on a healthy H100 SXM
# A100: the peaks assume 1410 MHz (reference/gpus.md), which is also its max boost: CUDA deviceQuery on an
# A100-SXM4-40GB prints "GPU Max Clock rate: 1410 MHz" (Paderborn PC2 wiki, "NVIDIA A100 40GB with
# NVLINK"). The 80 GB and PCIe parts are the same GA100 chip; NVIDIA's Ampere (GA100) whitepaper lists a
# single A100 boost clock, 1410 MHz.
_A100_CLOCK_MHZ = 1410

# Memory capacity in MiB as the GPU reports it (nvidia-smi memory.total = DCGM FB_USED + FB_FREE + the
# driver's reservation), not "80 GB" converted from decimal (80e9 / 2**20 = 76,294 MiB, 7 % short). Values
# read from `nvidia-smi` tables printed on real hosts in public repositories; rows without such a reading
# stay None (unknown) rather than a converted datasheet figure.
H100_80GB_MIB = 81559  # "NVIDIA H100 80GB HBM3 ... / 81559MiB"
_A100_80GB_MIB = 81920  # "NVIDIA A100-SXM4-80GB ... / 81920MiB", same on "NVIDIA A100 80GB PCIe"
_A100_40GB_MIB = 40960  # "NVIDIA A100-SXM4-40GB ... / 40960MiB", same on "NVIDIA A100-PCIE-40GB"
_MEMORY_SOURCE = "in MiB as nvidia-smi reports the frame buffer (public nvidia-smi output)"
_A100_SOURCE = (
    _PEAK_SOURCES + "; peaks assume 1410 MHz, also the max boost (CUDA deviceQuery); memory " + _MEMORY_SOURCE
)

_MI300 = {"fp64": 81.7, "fp64_tensor": 163.4, "tf32": 653.7, "bf16": 1307.0, "fp16": 1307.0}

GPU_SPECS: tuple[GpuSpec, ...] = (
    # V100 has no BF16 and no FP64 tensor cores: the table's single FP64 figure is the vector rate.
    _spec("V100 SXM2", "NVIDIA", ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
          {"fp64": 7.8, "fp16": 125.0}, bandwidth_tbps=0.9, sm_count=80, tdp_w=300),
    _spec("V100 PCIe", "NVIDIA", ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"),
          {"fp64": 7.0, "fp16": 112.0}, bandwidth_tbps=0.9, sm_count=80, tdp_w=250),
    _spec("A100 SXM 40GB", "NVIDIA", ("NVIDIA A100-SXM4-40GB",), _A100, memory_mib=_A100_40GB_MIB,
          bandwidth_tbps=1.555, sm_count=108, tdp_w=400, peak_clock_mhz=_A100_CLOCK_MHZ,
          max_clock_mhz=_A100_CLOCK_MHZ, mamf_bf16_tflops=271.0, source=_A100_SOURCE),
    _spec("A100 SXM 80GB", "NVIDIA", ("NVIDIA A100-SXM4-80GB", "A100 80GB"), _A100, memory_mib=_A100_80GB_MIB,
          bandwidth_tbps=2.039, sm_count=108, tdp_w=400, peak_clock_mhz=_A100_CLOCK_MHZ,
          max_clock_mhz=_A100_CLOCK_MHZ, mamf_bf16_tflops=271.0, source=_A100_SOURCE),
    _spec("A100 PCIe 40GB", "NVIDIA", ("NVIDIA A100-PCIE-40GB",), _A100, memory_mib=_A100_40GB_MIB,
          bandwidth_tbps=1.555, sm_count=108, tdp_w=250, peak_clock_mhz=_A100_CLOCK_MHZ,
          max_clock_mhz=_A100_CLOCK_MHZ, source=_A100_SOURCE),
    _spec("A100 PCIe 80GB", "NVIDIA", ("NVIDIA A100 80GB PCIe",), _A100, memory_mib=_A100_80GB_MIB,
          bandwidth_tbps=1.94, sm_count=108, tdp_w=300, peak_clock_mhz=_A100_CLOCK_MHZ,
          max_clock_mhz=_A100_CLOCK_MHZ, source=_A100_SOURCE),
    _spec("A10", "NVIDIA", ("NVIDIA A10",), _A10, bandwidth_tbps=0.6, sm_count=72, tdp_w=150),
    _spec("A10G", "NVIDIA", ("NVIDIA A10G",), _A10, bandwidth_tbps=0.6, sm_count=80, tdp_w=150),
    _spec("L4", "NVIDIA", ("NVIDIA L4",), {"tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.0,
          "int8": 242.0}, bandwidth_tbps=0.3, sm_count=58, tdp_w=72, single_source=True,
          source=_PEAK_SOURCES + "; FP8 figure rests on one source (?)"),
    _spec("L40S", "NVIDIA", ("NVIDIA L40S",), {"tf32": 183.0, "bf16": 362.0, "fp16": 362.0, "fp8": 733.0,
          "int8": 733.0}, bandwidth_tbps=0.864, sm_count=142, tdp_w=350),
    _spec("H100 SXM", "NVIDIA", ("NVIDIA H100 80GB HBM3", "H100 SXM5"), _HOPPER_SXM,
          memory_mib=H100_80GB_MIB, bandwidth_tbps=3.35, sm_count=132, tdp_w=700,
          peak_clock_mhz=H100_SXM_PEAK_CLOCK_MHZ, max_clock_mhz=H100_SXM_MAX_CLOCK_MHZ,
          mamf_bf16_tflops=794.5,
          source=_PEAK_SOURCES + "; peaks assume 1830 MHz, max boost 1980 MHz (reference/gpus.md); memory "
          + _MEMORY_SOURCE + "; MAMF: " + _MAMF_SOURCE),
    _spec("H100 PCIe", "NVIDIA", ("NVIDIA H100 PCIe",), {"fp64": 25.6, "fp64_tensor": 51.0, "tf32": 378.0,
          "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "int8": 1513.0}, bandwidth_tbps=2.0, sm_count=114,
          tdp_w=350),
    _spec("H100 NVL", "NVIDIA", ("NVIDIA H100 NVL",), {"fp64": 30.0, "fp64_tensor": 60.0, "tf32": 417.5,
          "bf16": 835.5, "fp16": 835.5, "fp8": 1671.0, "int8": 1670.5}, bandwidth_tbps=3.9, sm_count=132,
          tdp_w=400),
    _spec("H200 SXM", "NVIDIA", ("NVIDIA H200",), _HOPPER_SXM, bandwidth_tbps=4.8, sm_count=132, tdp_w=700),
    _spec("H200 NVL", "NVIDIA", ("NVIDIA H200 NVL",), {"fp64": 30.0, "fp64_tensor": 60.0, "tf32": 420.0,
          "bf16": 840.0, "fp16": 840.0, "fp8": 1680.0, "int8": 1680.0}, bandwidth_tbps=4.8, sm_count=132,
          tdp_w=600),
    # The table gives one FP64 figure for Blackwell: vector and tensor FP64 run at the same rate there.
    _spec("B200", "NVIDIA", ("NVIDIA B200",), {"fp64": 40.0, "fp64_tensor": 40.0, "tf32": 1125.0,
          "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "int8": 4500.0}, bandwidth_tbps=8.0, sm_count=148,
          tdp_w=1000, mamf_bf16_tflops=1745.0),
    _spec("GB200", "NVIDIA", ("NVIDIA GB200",), {"fp64": 45.0, "fp64_tensor": 45.0, "tf32": 1250.0,
          "bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0, "int8": 5000.0}, bandwidth_tbps=8.0, sm_count=148,
          tdp_w=1200, source=_PEAK_SOURCES + "; per GPU of a GB200 superchip"),
    _spec("MI250X", "AMD", ("AMD Instinct MI250X / MI250",), {"fp64": 24.0, "fp64_tensor": 48.0,
          "bf16": 191.5, "fp16": 191.5, "int8": 191.5}, bandwidth_tbps=1.64, sm_count=110, tdp_w=280,
          source=_PEAK_SOURCES + "; per GCD: the driver reports each of the two GCDs as a device"),
    _spec("MI300X", "AMD", ("AMD Instinct MI300X",), {**_MI300, "fp8": 2615.0, "int8": 2600.0},
          bandwidth_tbps=5.3, sm_count=304, tdp_w=750, mamf_bf16_tflops=668.0),
    _spec("MI325X", "AMD", ("AMD Instinct MI325X",), {**_MI300, "fp8": 2610.0, "int8": 2600.0},
          bandwidth_tbps=6.0, sm_count=304, tdp_w=1000),
    _spec("TPU v4", "Google", ("TPU v4",), {"bf16": 275.0}, bandwidth_tbps=1.2,
          source=_PEAK_SOURCES + "; listed for published comparisons (PaLM)"),
)  # fmt: skip

_BY_NAME: dict[str, GpuSpec] = {spec.name: spec for spec in GPU_SPECS}


def gpu_by_name(name: str) -> GpuSpec | None:
    """The spec with exactly this canonical name, or None."""
    return _BY_NAME.get(name)


# --------------------------------------------------------------------------------------- name matching

# Vendor words and brand names carry no information about which row applies.
_NOISE = frozenset(
    {"nvidia", "tesla", "amd", "instinct", "google", "cloud", "hbm2", "hbm2e", "hbm3", "hbm3e"}
)
_FORM_FACTORS = {
    "sxm": "sxm", "sxm2": "sxm", "sxm4": "sxm", "sxm5": "sxm", "hgx": "sxm",
    "pcie": "pcie", "pci": "pcie",
    "nvl": "nvl",
}  # fmt: skip
# family token -> {(form factor or None, memory GB or None): canonical name}. A None key is the row used
# when the name does not say; H100/H200 report their SXM parts without "SXM" (e.g. "NVIDIA H200").
_FAMILIES: dict[str, dict[tuple[str | None, int | None], str]] = {
    "v100": {(None, None): "V100 SXM2", ("sxm", None): "V100 SXM2", ("pcie", None): "V100 PCIe"},
    # A100 peaks do not depend on the variant; without a memory size the 80 GB part (today's common
    # training part) is the closer guess for bandwidth and TDP.
    "a100": {
        (None, None): "A100 SXM 80GB", (None, 40): "A100 SXM 40GB", (None, 80): "A100 SXM 80GB",
        ("sxm", None): "A100 SXM 80GB", ("sxm", 40): "A100 SXM 40GB", ("sxm", 80): "A100 SXM 80GB",
        ("pcie", None): "A100 PCIe 80GB", ("pcie", 40): "A100 PCIe 40GB", ("pcie", 80): "A100 PCIe 80GB",
    },
    "a10": {(None, None): "A10"},
    "a10g": {(None, None): "A10G"},
    "l4": {(None, None): "L4"},
    "l40s": {(None, None): "L40S"},
    "h100": {(None, None): "H100 SXM", ("sxm", None): "H100 SXM", ("pcie", None): "H100 PCIe",
             ("nvl", None): "H100 NVL"},
    "h200": {(None, None): "H200 SXM", ("sxm", None): "H200 SXM", ("nvl", None): "H200 NVL"},
    "b200": {(None, None): "B200", ("sxm", None): "B200"},
    "gb200": {(None, None): "GB200"},
    "mi250x": {(None, None): "MI250X"},
    "mi300x": {(None, None): "MI300X"},
    "mi325x": {(None, None): "MI325X"},
    "tpuv4": {(None, None): "TPU v4"},
}  # fmt: skip
_MEMORY_TOKEN = re.compile(r"^(\d+)(?:gb|g)$")


def _tokens(name: str) -> list[str]:
    text = name.lower().strip()
    # Separators seen in dcgm-exporter, nvidia-smi, Kubernetes labels and GKE accelerator names.
    text = re.sub(r"[\s\-_/,;:()\[\]]+", " ", text)
    # "80 GB" -> "80gb"; "TPU v4" -> "tpuv4" so that a bare "v4" never matches.
    text = re.sub(r"\b(\d+)\s+gb\b", r"\1gb", text)
    text = re.sub(r"\btpu\s+v(\d)\b", r"tpuv\1", text)
    return [token for token in text.split() if token and token not in _NOISE]


def match_gpu_name(name: str | None) -> GpuSpec | None:
    """The catalog row for a reported device name (dcgm-exporter modelName, torch, nvidia-smi, k8s label).

    Matches whole tokens after normalising case, separators, vendor words and memory sizes. Returns None
    for an unknown or ambiguous name and for MIG slices (a slice has a fraction of the GPU's peak).
    """
    if not name or not isinstance(name, str):
        return None
    exact = _BY_NAME.get(name.strip())
    if exact is not None:
        return exact
    tokens = _tokens(name)
    if "mig" in tokens:
        return None
    families = {token for token in tokens if token in _FAMILIES}
    if len(families) != 1:
        return None
    family = _FAMILIES[families.pop()]
    forms = {_FORM_FACTORS[token] for token in tokens if token in _FORM_FACTORS}
    memories = {int(m.group(1)) for token in tokens if (m := _MEMORY_TOKEN.match(token))}
    if len(forms) > 1 or len(memories) > 1:
        return None
    form = next(iter(forms), None)
    memory = next(iter(memories), None)
    # A memory size only selects a row where the family has sizes; otherwise it is just noise ("80GB").
    for key in ((form, memory), (form, None)):
        canonical = family.get(key)
        if canonical is not None:
            return _BY_NAME[canonical]
    return None


# ------------------------------------------------------------------------------------------ MIG slices

#: Compute slices of a GPU in MIG mode (A100 / H100 / H200 / B200: "Max Number of Instances" 7, NVIDIA
#: MIG user guide, "Supported GPUs"); a profile `<n>g.<mem>gb` holds n of them ("Fraction of SMs" n/7 in
#: the guide's "Supported MIG Profiles" tables).
MIG_COMPUTE_SLICES = 7
#: SMs per compute slice where a reading of them exists. A100: 14 (a 1g/2g/3g slice of an A100 80GB reports
#: 14/28/42 multiprocessors, NJIT ARCS "MIG Profile Comparison"; 7 x 14 = 98 of the 108 SMs are usable in
#: MIG mode). H100 / H200 (GH100): 16 (gpu-feature-discovery labels a H100 NVL 1g.12gb slice
#: `nvidia.com/gpu.multiprocessors: 16`, NVIDIA/dcgm-exporter issue #397), 7 x 16 = 112 of 132. Larger
#: H100 profiles are taken as n x 16: no reading of their SM counts is in reference/, so that is an
#: approximation (it can be low if NVIDIA gives a 3g/4g/7g profile extra SMs).
MIG_SMS_PER_SLICE: MappingProxyType[str, int] = MappingProxyType(
    {
        "A100 SXM 40GB": 14,
        "A100 SXM 80GB": 14,
        "A100 PCIe 40GB": 14,
        "A100 PCIe 80GB": 14,
        "H100 SXM": 16,
        "H100 PCIe": 16,
        "H100 NVL": 16,
        "H200 SXM": 16,
        "H200 NVL": 16,
    }
)
_MIG_PROFILE = re.compile(r"(?:^|[\s.\-_])(?:(\d+)c\.)?(\d+)g\.(\d+)gb(?:\+me)?$", re.IGNORECASE)


@dataclass(frozen=True)
class MigSlice:
    """A MIG profile on a GPU: the share of the GPU it is billed for (its compute slices / 7) and the share
    of the GPU's dense peak it can reach (its SMs / the GPU's SMs), with where that share comes from.

    The two differ: a 1g slice of an H100 holds 1/7 of the compute slices (what the GPU's price is split
    by) but 16 of 132 SMs (what bounds its FLOP/s), because 20 SMs are not usable in MIG mode.
    """

    profile: str
    compute_slices: int
    cost_fraction: float
    peak_fraction: float
    source: str


def mig_profile(name: str | None) -> str | None:
    """The MIG profile in a device or resource name ("3g.40gb" from "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb",
    "nvidia.com/mig-1g.10gb", "MIG 1c.3g.40gb"), or None."""
    if not name or not isinstance(name, str):
        return None
    match = _MIG_PROFILE.search(name.strip())
    if match is None:
        return None
    ci, gi, mem = match.groups()
    return f"{ci}c.{gi}g.{mem}gb" if ci else f"{gi}g.{mem}gb"


def mig_slice(spec: GpuSpec | None, profile: str) -> MigSlice | None:
    """The slice `profile` ("3g.40gb"; "1c.3g.40gb" = one compute instance of a 3g GPU instance) of `spec`.

    Peak share = n x SMs per slice / the GPU's SMs where both are known (MIG_SMS_PER_SLICE), else n / 7 (the
    guide's "Fraction of SMs", which counts only the SMs usable in MIG mode, so it reads high by up to
    20/132 on an H100). A compute instance `<c>c.` of a larger GPU instance holds c of its slices' SMs;
    it is still billed for the GPU instance's share split among its compute instances by the caller.
    None when the profile is not MIG or holds more slices than the GPU has.
    """
    match = _MIG_PROFILE.search(profile or "")
    if match is None:
        return None
    ci, gi = match.group(1), int(match.group(2))
    compute = int(ci) if ci else gi
    if not 0 < gi <= MIG_COMPUTE_SLICES or not 0 < compute <= gi:
        return None
    per_slice = MIG_SMS_PER_SLICE.get(spec.name) if spec is not None else None
    if per_slice is not None and spec is not None and spec.sm_count:
        peak = min(compute * per_slice / spec.sm_count, 1.0)
        source = f"{compute} x {per_slice} SMs of {spec.sm_count} (catalog MIG_SMS_PER_SLICE)"
    else:
        peak = compute / MIG_COMPUTE_SLICES
        source = f"{compute}/{MIG_COMPUTE_SLICES} compute slices (approximation: SMs per slice unknown)"
    return MigSlice(mig_profile(profile) or profile, compute, gi / MIG_COMPUTE_SLICES, peak, source)


def match_mig_name(name: str | None) -> tuple[GpuSpec, MigSlice] | None:
    """The parent GPU and the slice of a MIG device name ("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"); None when
    the name is not a MIG name or its parent GPU is unknown. `match_gpu_name` refuses these names, so a
    slice is never mistaken for a whole GPU."""
    profile = mig_profile(name)
    if profile is None or name is None:
        return None
    parent_name = re.split(r"[\s\-_]mig[\s\-_]", name, flags=re.IGNORECASE)[0]
    spec = match_gpu_name(parent_name)
    if spec is None:
        return None
    piece = mig_slice(spec, profile)
    return (spec, piece) if piece is not None else None


# ---------------------------------------------------------------------------------------------- dtypes

_DTYPE_ALIASES: dict[str, str] = {
    **dict.fromkeys(("bf16", "bfloat16", "bf16-mixed", "bf16-true", "amp-bf16", "brain-float16"), "bf16"),
    **dict.fromkeys(("fp16", "float16", "half", "16", "16-mixed", "16-true", "amp-fp16", "f16"), "fp16"),
    **dict.fromkeys(("tf32", "tensorfloat32", "tensor-float32"), "tf32"),
    **dict.fromkeys(("fp32", "float32", "float", "32", "32-true", "f32", "single"), "fp32"),
    **dict.fromkeys(
        ("fp8", "float8", "e4m3", "e5m2", "fp8-e4m3", "fp8-e5m2", "float8-e4m3fn", "float8-e5m2", "amp-fp8"),
        "fp8",
    ),
    **dict.fromkeys(("int8", "i8", "s8"), "int8"),
    **dict.fromkeys(("fp64", "float64", "double", "64", "64-true", "f64"), "fp64"),
    **dict.fromkeys(("fp64-tensor", "fp64tensor"), "fp64_tensor"),
}


def normalise_dtype(dtype: str | None) -> str | None:
    """Canonical dtype key (one of `DTYPES`) or None when unknown.

    Accepts torch names ("torch.bfloat16"), Lightning precision strings ("bf16-mixed") and common aliases
    ("half", "float16").
    """
    if not isinstance(dtype, str):
        return None
    key = dtype.strip().lower().replace("_", "-")
    key = key.removeprefix("torch.")
    return _DTYPE_ALIASES.get(key)


def peak_flops(peak_tflops: Mapping[str, Any], dtype: str | None) -> float | None:
    """The one dense-peak lookup: FLOP/s for ``dtype`` (any alias) from a row's peak TFLOP/s per dtype key.

    Used by ``GpuSpec`` and by the database's ``GpuModel`` rows (seeded from ``GPU_SPECS``), so a job
    registered as "bf16-mixed" or "torch.bfloat16" finds the BF16 peak wherever the row comes from. None
    when the dtype is unknown or the row has no positive figure for it (never a made-up peak).
    """
    key = normalise_dtype(dtype)
    if key is None:
        return None
    value = peak_tflops.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None
    return float(value) * 1e12  # the table is in TFLOP/s


# ---------------------------------------------------------------------------------------------- prices


@dataclass(frozen=True)
class PriceSeed:
    """One dated price for the price book: USD per GPU-hour for a GPU model and pricing tier."""

    gpu: str
    tier: PriceTier
    usd_per_gpu_hour: float
    effective_from: date
    source: str
    provider: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain fields for the data migration."""
        return {
            "gpu": self.gpu,
            "tier": self.tier,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "effective_from": self.effective_from.isoformat(),
            "source": self.source,
            "provider": self.provider,
        }


_AWS = "AWS EC2 pricing as collected in tsaol/aws-gpu data/*_instances.js (2026-01), via reference/gpus.md"
_HYPERSCALERS = "datareceipts gpu-pricing hyperscalers.json (2026-11), via reference/gpus.md"
_NEOCLOUDS = "api-evangelist coreweave / lambda-labs pricing (2026-09), via reference/gpus.md"
_SILYBENCH = "tgarg01/silybench-data gpu_prices.csv (2026-09), via reference/gpus.md"
_RUNPOD_A100 = "RunPod A100 80GB, {} end of the quoted 1.39-1.79 range; " + _SILYBENCH
_D_AWS = date(2026, 1, 1)
_D_HYPER = date(2026, 11, 1)
_D_NEO = date(2026, 9, 1)

# The default price book: one price per GPU and tier, AWS where AWS has one, so that "the price in effect"
# is never ambiguous. Other providers' figures are in MARKET_PRICES for reference.
PRICE_SEEDS: tuple[PriceSeed, ...] = (
    PriceSeed("H100 SXM", "on_demand", 6.88, _D_AWS, f"AWS p5.48xlarge us-east-1 on-demand; {_AWS}", "AWS"),
    PriceSeed("H100 SXM", "reserved", 4.92, _D_AWS, f"AWS p5.48xlarge capacity block; {_AWS}", "AWS"),
    # AWS has no spot figure in the table; GCP's is the hyperscaler spot price for the same part.
    PriceSeed("H100 SXM", "spot", 6.57, _D_HYPER, f"GCP a3-highgpu spot; {_HYPERSCALERS}", "GCP"),
    PriceSeed("H200 SXM", "on_demand", 7.91, _D_AWS, f"AWS p5en.48xlarge on-demand; {_AWS}", "AWS"),
    PriceSeed("H200 SXM", "reserved", 5.41, _D_AWS, f"AWS p5en.48xlarge capacity block; {_AWS}", "AWS"),
    PriceSeed("B200", "on_demand", 14.24, _D_AWS, f"AWS p6-b200 on-demand; {_AWS}", "AWS"),
    PriceSeed("A100 SXM 40GB", "on_demand", 2.74, _D_AWS, f"AWS p4d.24xlarge on-demand; {_AWS}", "AWS"),
    PriceSeed("A100 SXM 40GB", "reserved", 1.74, _D_AWS, f"AWS p4d.24xlarge reserved; {_AWS}", "AWS"),
    PriceSeed("A100 SXM 80GB", "on_demand", 3.43, _D_AWS, f"AWS p4de.24xlarge on-demand; {_AWS}", "AWS"),
    PriceSeed("A100 SXM 80GB", "reserved", 2.18, _D_AWS, f"AWS p4de.24xlarge reserved; {_AWS}", "AWS"),
)

# Every other figure in the gpus.md price table, for a "market prices" view and for admins to pick from.
MARKET_PRICES: tuple[PriceSeed, ...] = (
    PriceSeed("H100 SXM", "on_demand", 12.29, _D_HYPER, f"Azure ND96isr H100 v5; {_HYPERSCALERS}", "Azure"),
    PriceSeed("H100 SXM", "on_demand", 10.98, _D_HYPER, f"GCP a3-highgpu on-demand; {_HYPERSCALERS}", "GCP"),
    PriceSeed("H100 SXM", "on_demand", 6.16, _D_NEO, f"CoreWeave HGX H100; {_NEOCLOUDS}", "CoreWeave"),
    PriceSeed("H100 SXM", "spot", 2.46, _D_NEO, f"CoreWeave HGX H100 spot; {_NEOCLOUDS}", "CoreWeave"),
    PriceSeed("H100 SXM", "on_demand", 3.99, _D_NEO, f"Lambda 8x H100 SXM; {_NEOCLOUDS}", "Lambda"),
    PriceSeed("H100 SXM", "on_demand", 2.69, _D_NEO, f"RunPod H100 community; {_SILYBENCH}", "RunPod"),
    PriceSeed("H100 SXM", "on_demand", 3.99, _D_NEO, f"RunPod H100 secure; {_SILYBENCH}", "RunPod"),
    PriceSeed("B200", "on_demand", 8.60, _D_NEO, f"CoreWeave B200; {_NEOCLOUDS}", "CoreWeave"),
    PriceSeed("B200", "on_demand", 6.69, _D_NEO, f"Lambda B200; {_NEOCLOUDS}", "Lambda"),
    PriceSeed("A100 SXM 80GB", "on_demand", 2.79, _D_NEO, f"Lambda A100 80GB; {_NEOCLOUDS}", "Lambda"),
    PriceSeed("A100 SXM 80GB", "on_demand", 1.39, _D_NEO, _RUNPOD_A100.format("low"), "RunPod"),
    PriceSeed("A100 SXM 80GB", "on_demand", 1.79, _D_NEO, _RUNPOD_A100.format("high"), "RunPod"),
)  # fmt: skip
