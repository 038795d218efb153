"""What a GPU kernel's name says about the math units it runs on: tensor cores, CUDA cores (SIMT), or neither.

A trace carries no hardware counter for tensor-core use, only kernel names. Vendor libraries encode the
instruction family, tile and data types in those names, so the name is good evidence when it says so and
no evidence when it does not. `math_class` reads the parts below; anything it cannot place is OTHER, which
the tensor-core statistics count as neither (element-wise, reductions, NCCL, copies, Triton pointwise...).

Name parts (cuBLAS/cuBLASLt, cuDNN, CUTLASS, xmma, FlashAttention, ROCm Tensile):

* Tensor-core instruction families: ``hmma`` (half-precision MMA, Volta+), ``imma`` (integer MMA, Turing+),
  ``wgmma``/``gmma`` (Hopper warpgroup MMA), ``wmma`` (CUDA C++'s warp matrix API, ``nvcuda::wmma``,
  and CUTLASS ``cutlass_75_wmma_tensorop_...``), ``tensorop`` (CUTLASS ``cutlass_80_tensorop_...``,
  ``MmaTensorOp``), ``tensor16x8x8`` (xmma's MMA shape suffix).
* ``xmma`` (NVIDIA's GEMM/convolution kernel library behind cuBLAS/cuDNN) with no SIMT marker: its FP32
  FFMA variants say ``ffma``/``f32f32_f32f32`` (SIMT, checked first); the others run on tensor cores.
* cuBLAS/cuDNN/CUTLASS shape codes ``<p><M><N><K>`` glued to ``gemm``/``cudnn``/``fprop``/``dgrad``/
  ``wgrad``: ``h884`` (Volta HMMA.884, fp16), ``s884`` (fp16 inputs, fp32 accumulate), ``h1688``/``s1688``
  (Turing/Ampere m16n8k8; ``s1688`` on Ampere is TF32), ``h16816``/``s16816`` (Ampere m16n8k16), ``i8816``
  (int8 IMMA), ``c1688`` (complex TF32).
* Data-type fields of xmma/cuBLASLt/CUTLASS GEMM and convolution kernels: ``bf16``, ``tf32``, ``f16``/
  ``fp16``, ``fp8``, ``e4m3``/``e5m2`` (FP8), ``i8`` -- these only run on tensor cores when the kernel is a
  matmul, so they count only in GEMM/convolution names (``fbgemm_gpu::_float_to_hfp8`` is a cast kernel).
* Fused attention: FlashAttention's ``flash_fwd_kernel``/``flash_fwd_splitkv_kernel``/
  ``flash_bwd_dq_dk_dv_*`` (CUTLASS MMA; not its ``flash_bwd_dot_do_o``/``convert_dq``/``combine``
  helpers, which are element-wise), FlashAttention-3's ``compute_attn_ws``/``CollectiveMainloop*``
  (wgmma), ``fmha`` (xformers / cuDNN fused MHA); ``nvjet`` (cuBLASLt's Hopper JIT GEMMs, wgmma-based).
* Not encoded: Triton kernels (``triton_tem_fused_mm_0`` is a matmul template whose name does not say
  the dtype) and NCCL kernels (``ncclDevKernel_AllReduce_Sum_bf16_...`` moves data, the dtype is the
  payload's) are OTHER.
* AMD Tensile (rocBLAS/hipBLASLt) ``Cijk_..._MI16x16x1_``: the ``MI`` field names the MFMA matrix-core
  instruction; a Tensile kernel without it runs on the vector ALUs.
* SIMT (CUDA cores): ``sgemm``/``dgemm``/``cgemm``/``gcgemm``/``zgemm`` (single/double/complex BLAS
  precision prefixes: cuBLAS' FP32/FP64 paths), ``scudnn``/``dcudnn`` (cuDNN single/double precision),
  ``simt`` (CUTLASS ``cutlass_80_simt_sgemm``), ``ffma`` (xmma kernels built on the FFMA instruction, e.g.
  ``sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize..._ffma``: FP32 in, FP32 math, no tensor cores), an
  xmma ``f32f32_f32f32`` type field (FP32 inputs that are not TF32), ``gemv``/``gemmSN``/``gemmk1``
  (cuBLAS matrix-vector and small-N/K=1 paths), ``implicit_convolve_sgemm``.

Explicit instruction markers win over data-type fields, and a SIMT marker wins over a bare family name such
as ``xmma_gemm`` (the old allowlist counted every ``xmma_gemm`` as tensor-core time, so FFMA GEMMs hid an
idle tensor pipe). FP64 GEMMs (``dgemm``) are SIMT here: on A100/H100 cuBLAS may run them on FP64 tensor
cores (DMMA), but the name does not say so, and a bf16/fp16 job should not be doing FP64 matmuls anyway.
"""

from __future__ import annotations

import re
from enum import StrEnum


class MathClass(StrEnum):
    """Which math units a kernel name says it uses."""

    TENSOR = "tensor"
    SIMT = "simt"
    OTHER = "other"


_TENSOR_INSTRUCTION_RE = re.compile(
    r"hmma|imma|wgmma|gmma|wmma|tensorop|tensor\d+x\d+x\d+|"
    r"(?<![a-z0-9])[hsic](?:884|1688|16816|32816|8816)(?:gemm|cudnn|fprop|dgrad|wgrad|conv)",
    re.IGNORECASE,
)
# FlashAttention's matmul kernels only: its backward pre/post-processing (flash_bwd_dot_do_o_kernel,
# flash_bwd_convert_dq_kernel) and the split-KV combine are element-wise/reduction kernels.
_TENSOR_FUSED_RE = re.compile(
    r"flash_fwd_kernel|flash_fwd_splitkv_kernel|flash_bwd_dq_dk_dv|flash_bwd_kernel|compute_attn_ws|"
    r"CollectiveMainloop|fmha|nvjet",
    re.IGNORECASE,
)
_AMD_MFMA_RE = re.compile(r"^Cijk_.*_MI\d+x\d+x\d+")
_AMD_TENSILE_RE = re.compile(r"^Cijk_")
_SIMT_RE = re.compile(
    r"sgemm|dgemm|cgemm|zgemm|scudnn|dcudnn|simt|ffma|f32f32_f32f32|gemv|gemmSN|gemmk1|"
    r"dgrad_engine|wgrad_alg\d+_engine",
    re.IGNORECASE,
)
# "conv" but not "convert" (convertFP32ToFP16 is a cast kernel).
_MATMUL_RE = re.compile(r"gemm|xmma|cutlass|cudnn|conv(?!ert)|fprop|dgrad|wgrad|matmul|mma", re.IGNORECASE)
_XMMA_RE = re.compile(r"xmma", re.IGNORECASE)
_NOT_MATMUL_RE = re.compile(r"fbgemm|elementwise|reduce_kernel|quantize|dequant|_to_float|float_to_", re.I)
_TENSOR_DTYPE_RE = re.compile(r"bf16|tf32|fp16|f16f16|e4m3|e5m2|fp8|i8i8|bfloat16|half", re.IGNORECASE)


def math_class(name: str) -> MathClass:
    """The math units a kernel's name says it runs on (see the module docstring for each name part).

    >>> math_class("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma")
    <MathClass.SIMT: 'simt'>
    >>> math_class("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn")
    <MathClass.TENSOR: 'tensor'>
    """
    if not name:
        return MathClass.OTHER
    if name.startswith(("nccl", "Memcpy", "Memset")):
        return MathClass.OTHER
    if _AMD_TENSILE_RE.match(name):
        return MathClass.TENSOR if _AMD_MFMA_RE.match(name) else MathClass.SIMT
    if _TENSOR_INSTRUCTION_RE.search(name):
        return MathClass.TENSOR
    if _TENSOR_FUSED_RE.search(name):
        return MathClass.TENSOR
    if _SIMT_RE.search(name) and not _NOT_MATMUL_RE.search(name):
        return MathClass.SIMT
    if _XMMA_RE.search(name) and not _NOT_MATMUL_RE.search(name):
        return MathClass.TENSOR
    if _MATMUL_RE.search(name) and not _NOT_MATMUL_RE.search(name) and _TENSOR_DTYPE_RE.search(name):
        return MathClass.TENSOR
    return MathClass.OTHER


def is_tensor_core_kernel(name: str) -> bool:
    """True when the kernel name says it runs on tensor cores (or AMD matrix cores)."""
    return math_class(name) is MathClass.TENSOR
