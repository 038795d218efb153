"""Tensor-core vs SIMT classification of real kernel names (`jobs.profiling.kernel_classes.math_class`).

Names marked [sample] are in ../shared/samples (file in brackets); the others are from public profiler
output (nsys stats tables, torch.profiler key_averages, ncu logs, FlashAttention/CUTLASS sources) found by
code search. Each row says which name part decides.
"""

from __future__ import annotations

import pytest

from jobs.profiling.kernel_classes import MathClass, is_tensor_core_kernel, math_class

T, S, N = MathClass.TENSOR, MathClass.SIMT, MathClass.OTHER  # N: neither

KERNELS: list[tuple[str, MathClass, str]] = [
    # --- SIMT: FP32/FP64 BLAS and cuDNN paths on CUDA cores
    (
        "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_"
        "execute_kernel__5x_cublas",
        S,
        "ffma + f32f32 inputs: FP32 FFMA GEMM (issue #12's hidden case)",
    ),
    (
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_"
        "execute_kernel__5x_cublas",
        S,
        "ffma (public nsys table: fp32 lm_head fallback)",
    ),
    ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8", S, "f32f32_f32f32 type field, no tf32"),
    ("ampere_sgemm_32x32_sliced1x4_tn", S, "sgemm [sample: hta_alexnet_a100]"),
    ("volta_sgemm_128x64_nn", S, "sgemm [sample: hta_v100_2rank_rank1]"),
    ("ampere_gcgemm_64x64_nt", S, "gcgemm: complex FP32 [sample: hta_alexnet_a100]"),
    ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1", S, "scudnn: single precision [sample: alexnet]"),
    ("cudnn_train_volta_scudnn_128x128_stridedB_splitK_interior_nn_v1", S, "scudnn [sample: hta_v100_ns]"),
    (
        "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32_8x5_"
        "nn_align1::Params)",
        S,
        "CUTLASS simt [sample: hta_v100_2rank_rank1]",
    ),
    (
        "void gemmSN_TN_kernel_64addr<float, 128, 16, 2, 4, 8, 9, false, cublasGemvTensorStridedBatched<float"
        " const>, cublasGemvTensorStridedBatched<float> >(cublasGemmSmallNParams<...>)",
        S,
        "gemmSN: cuBLAS small-N FP32 path [sample: tbplugin]",
    ),
    (
        "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 2, 2, false, false, "
        "cublasGemvParams<cublasGemvTensorStridedBatched<float const>, ...>>",
        S,
        "gemv: matrix-vector [sample: hta_v100_2rank_rank1]",
    ),
    (
        "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*)",
        S,
        "legacy FP32 dgrad engine [sample: hta_v100_ns]",
    ),
    ("volta_gcgemm_32x32_nt", S, "cgemm (public kernel list)"),
    # --- tensor cores
    ("ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn", T, "s16816gemm: HMMA m16n8k16, bf16"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x64_32x4_nn_align8", T, "tensorop + s16816gemm"),
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(cutlass_80_tensorop_"
        "s1688gemm_64x64_16x6_nn_align4::Params)",
        T,
        "tensorop s1688gemm (TF32) [sample: hta_v100_2rank_rank1 -- an A100 kernel list]",
    ),
    ("volta_h884gemm_128x32_tn", T, "h884gemm: Volta HMMA.884"),
    ("volta_s884gemm_fp16_128x128_ldg8_f2f_nn", T, "s884gemm: fp16 in, fp32 accumulate"),
    ("turing_fp16_s1688gemm_fp16_128x64_sliced1x2_ldg8_f2f_tn", T, "s1688gemm: Turing HMMA"),
    (
        "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_"
        "warpsize2x2x1_g1_tensor16x8x8_alignc4_execute_kernel_cudnn",
        T,
        "tf32 + tensor16x8x8 [sample: hta_alexnet_a100]",
    ),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_"
        "off_kernel__5x_cublas",
        T,
        "sm90 xmma with bf16 type fields",
    ),
    (
        "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_cgasize1x2x1_stage4_gmmastage2_"
        "warpgroupsize1x1x1_tensor64x128x32",
        T,
        "e4m3 (FP8) + gmma",
    ),
    ("sm90_xmma_gemm_e4m3f32_e4m3f32_f32_tn_n_tilesize128x128x128", T, "e4m3 type field"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN", T, "nvjet: cuBLASLt Hopper [sample: nsysai_h100]"),
    ("nvjet_sm90_hss_320x128", T, "nvjet"),
    (
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, (int)4, (bool)0, "
        "(bool)0, cutlass::bfloat16_t, Flash_kernel_traits<...>>>",
        T,
        "FlashAttention forward [sample: nsysai_h100]",
    ),
    (
        "void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<(int)128>>",
        T,
        "FlashAttention backward matmuls",
    ),
    (
        "void flash::compute_attn_ws<flash::CollectiveMainloopFwdSm90<2, cute::tuple<>>>",
        T,
        "FlashAttention-3",
    ),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", T, "fmha: PyTorch/xformers memory-efficient attention"),
    (
        "Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1_SN_LDSB0_AFC1_AFEM1",
        T,
        "Tensile MI16x16x1: MFMA matrix cores [sample: hta_amd_mi250_minitoy]",
    ),
    # --- neither: not matmuls, or the name does not encode the math units
    ("flash_bwd_dot_do_o_kernel", N, "FlashAttention backward pre-processing: element-wise"),
    ("flash_bwd_convert_dq_kernel", N, "FlashAttention dq conversion: element-wise"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL128", N, "NCCL: bf16 is the payload"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", N, "NCCL [sample: hta_v100_2rank_rank1]"),
    ("triton_poi_fused_add_cos_sin_0", N, "Triton pointwise [sample: hta_triton_cuLaunchKernel]"),
    # --- issue #24: cuBLAS gemv is SIMT; wmma, xmma, CUTLASS tensorop and sm90 gmma are tensor-op
    (
        "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, (int)128, (int)16, (int)4, "
        "(int)4, (bool)0, (bool)0, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<const "
        "__nv_bfloat16>, cublasGemvTensorStridedBatched<const __nv_bfloat16>, "
        "cublasGemvTensorStridedBatched<__nv_bfloat16>, float>>(T13, T5, T5)",
        S,
        "gemv: cuBLAS matrix-vector on CUDA cores, despite bf16 and 'Tensor' in its parameter types",
    ),
    (
        "void cutlass::Kernel<cutlass_75_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_tn_align8>("
        "cutlass_75_wmma_tensorop_f16_s161616gemm_f16_32x32_128x2_tn_align8::Params)",
        T,
        "CUTLASS wmma tensorop (Turing)",
    ),
    (
        "WMMAF16TensorCore(__half*, __half*, float*, float*)",
        T,
        "hand-written nvcuda::wmma kernel (nvprof log)",
    ),
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_"
        "off_kernel__5x_cublas",
        T,
        "xmma without a SIMT marker (H100 cuBLAS bf16)",
    ),
    (
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cute::tuple<int, int, int, int>, "
        "cutlass::gemm::collective::CollectiveMma<cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<2, "
        "cute::tuple<cute::C<1>, cute::C<2>, cute::C<1>>, cutlass::gemm::KernelTmaWarpSpecialized>>>>"
        "(T1::Params)",
        T,
        "CUTLASS 3 sm90 Gmma mainloop (Hopper warpgroup MMA)",
    ),
    ("convertFP32ToFP16(__half *, float *, int)", N, "a cast: 'convert' is not 'conv', '__half' no GEMM"),
    ("triton_tem_fused_mm_0", N, "Triton matmul template: dtype not in the name"),
    ("cutlass_80_splitKreduce_kernel", N, "split-K reduction"),
    (
        "void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8_gpu(at::Tensor const&,"
        " long, long, double)::{lambda(float)#1}, at::detail::Array<char*, 2> >(int, ...)",
        N,
        "fp8 cast, not a matmul [sample: hta_a100_8rank_rank3]",
    ),
    (
        "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float, float, float, float, "
        "cudnnTensorStruct, ...)",
        N,
        "batch norm [sample: hta_a100_nccl_allreduce_rank0]",
    ),
    (
        "void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, false, long,"
        " 2ul, 32ul>(...)",
        N,
        "embedding lookup in half [sample: hta_128rank_sampled_rank0]",
    ),
]


def test_the_table_has_at_least_25_real_names() -> None:
    assert len(KERNELS) >= 25
    assert {c for _, c, _ in KERNELS} == {T, S, N}


@pytest.mark.parametrize(("name", "expected", "why"), KERNELS, ids=[k[0][:60] for k in KERNELS])
def test_kernel_math_class(name: str, expected: MathClass, why: str) -> None:
    assert math_class(name) is expected, why
    assert is_tensor_core_kernel(name) is (expected is T)


def test_empty_and_copy_names_are_other() -> None:
    assert math_class("") is N
    assert math_class("Memcpy DtoH (Device -> Pageable)") is N
