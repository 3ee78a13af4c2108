"""Kernel name → class and library, checked against real kernel names.

The names come from the project's H200 runs (examples/runs, tests/data) and the eighteen
third-party traces in ../shared/external-traces (NVIDIA V100 → B200, AMD MI210 → MI300X,
PyTorch 1.9 → 2.9). Every table row below is the start of a name that occurs in the trace it
names; the test checks that, then classifies every full name with that start.
"""

from __future__ import annotations

import functools
import gzip
import re
from pathlib import Path

import orjson
import pytest

from kerneltriage.analysis.kernel_classes import (
    KernelClass,
    _table,
    classify_kernel,
    demangle_lite,
    known_kinds,
)
from kerneltriage.resources import load_yaml
from tests.helpers import DATA, EXTERNAL, corpus

ROOT = Path(__file__).resolve().parents[2]
OWN_RUNS = {
    **{p.name: p for p in sorted((ROOT / "examples" / "runs").iterdir()) if p.is_dir()},
    "tests-data-gpt-naive-h200": ROOT / "tests" / "data" / "gpt-naive-h200",
}
EXTERNAL_FOLDERS = (
    "hta-alexnet-a100",
    "hta-cnn-ddp-a100",
    "hta-cnn-v100",
    "hta-compiled-2rank-v100",
    "hta-dlrm-2rank-a100",
    "hta-dlrm-compiled-a100-80g",
    "hta-minitoy-mi250-rocm62",
    "hta-recsys-8rank-a100",
    "kineto-resnet50-v100-pt19",
    "tracelens-compile-mi300x",
    "tracelens-gpu-only-mi210",
    "tracelens-moe-8rank-b200",
    "tracelens-qwen05b-h100",
    "tracelens-qwen05b-mi300x",
    "tracelens-resnet-ckpt-8rank-mi300x",
    "tracelens-sglang-qwen3-8b-mi300x",
    "tracelens-timesformer-h100",
    "tracelens-vllm-graph-capture-mi300x",
)
ACTIVITY = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy"}
ACTIVITY |= {"gpu_memset": "memset", "Memset": "memset"}


def _folder(name: str) -> Path:
    return OWN_RUNS[name] if name in OWN_RUNS else EXTERNAL / name


@functools.cache
def trace_names(folder: str) -> dict[str, str]:
    """name → activity for every GPU activity of every trace in a folder, plus kernel names
    seen only in CPU-side launch records (args.kernel of cudaLaunchKernel / hipModuleLaunchKernel:
    the CUDA-graph capture of vllm-graph-capture-mi300x launches Inductor kernels only there)."""
    paths = sorted(_folder(folder).glob("*.json.gz"))
    assert paths, f"no trace in {_folder(folder)}"
    names: dict[str, str] = {}
    for path in paths:
        data = orjson.loads(gzip.decompress(path.read_bytes()))
        events = data["traceEvents"] if isinstance(data, dict) else data
        for e in events:
            activity = ACTIVITY.get(e.get("cat")) if isinstance(e, dict) else None
            if activity and e.get("ph") == "X":
                names[e["name"]] = activity
            elif isinstance(e, dict) and isinstance(e.get("args"), dict):
                launched = e["args"].get("kernel")
                if isinstance(launched, str):
                    names.setdefault(launched, "kernel")
    return names


# Libraries whose kernels are tuned library code users do not rewrite (expert judgement).
VENDOR = {
    "cuBLAS", "cuDNN", "CUTLASS", "FlashAttention", "TensorRT-LLM", "AOTriton", "CK", "aiter",
    "hipBLASLt", "rocBLAS", "MIOpen", "rocPRIM", "CUB", "NCCL", "FBGEMM", "Apex", "vLLM",
    "SGLang", "triton_kernels",
}  # fmt: skip

# (trace folder, start of a real kernel name, expected kind, expected library)
TABLE = [
    # NVIDIA cuBLAS / cuBLASLt: nvjet (Hopper, Blackwell), xmma, sm80-era SASS names, helpers
    ("gpt-builtin-h200", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm", "cuBLAS"),
    ("tracelens-moe-8rank-b200", "nvjet_tst_144x128_64x6_2x1_v_bz_bias_TNN", "gemm", "cuBLAS"),
    ("tracelens-qwen05b-h100", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm", "cuBLAS"),
    ("hta-alexnet-a100", "ampere_sgemm_32x32_sliced1x4_tn", "gemm", "cuBLAS"),
    ("hta-alexnet-a100", "ampere_gcgemm_64x64_nt", "gemm", "cuBLAS"),
    ("hta-cnn-v100", "volta_sgemm_64x64_nn", "gemm", "cuBLAS"),
    ("hta-recsys-8rank-a100", "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>", "gemm", "cuBLAS"),
    ("tracelens-timesformer-h100", "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128", "gemm", "cuBLAS"),
    ("hta-cnn-ddp-a100", "void cublasLt::splitKreduce_kernel<32, 16, int, float", "gemm", "cuBLAS"),
    ("tracelens-timesformer-h100", "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, __nv_bfloat16", "gemm", "cuBLAS"),
    ("hta-alexnet-a100", "void epilogue::impl::globalKernel<float, float, float, true, true>", "gemm", "cuBLAS"),
    ("hta-dlrm-2rank-a100", "void gemmk1_kernel<float, 256, 5", "gemm", "cuBLAS"),
    ("hta-compiled-2rank-v100", "void magma_sgemmEx_kernel<float", "gemm", "cuBLAS"),
    ("kineto-resnet50-v100-pt19", "void splitKreduce_kernel<float, float, float, float>", "gemm", "cuBLAS"),
    # NVIDIA cuDNN: convolutions and their helpers, batch norm, layout transforms, SDPA
    ("hta-cnn-ddp-a100", "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16", "convolution", "cuDNN"),
    ("hta-cnn-ddp-a100", "sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc", "convolution", "cuDNN"),
    ("kineto-resnet50-v100-pt19", "volta_scudnn_128x64_relu_interior_nn_v1", "convolution", "cuDNN"),
    ("hta-cnn-v100", "cudnn_infer_volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "convolution", "cuDNN"),
    ("kineto-resnet50-v100-pt19", "void implicit_convolve_sgemm<float, float, 1024, 6, 7", "convolution", "cuDNN"),
    ("kineto-resnet50-v100-pt19", "void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7", "convolution", "cuDNN"),
    ("hta-cnn-v100", "void cudnn::detail::dgrad_engine<float, 512, 6, 5", "convolution", "cuDNN"),
    ("hta-cnn-v100", "void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>", "convolution", "cuDNN"),
    ("hta-alexnet-a100", "void fft2d_r2c_32x32<float, false, 0u, false>", "convolution", "cuDNN"),
    ("hta-cnn-ddp-a100", "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolution", "convolution", "cuDNN"),
    ("kineto-resnet50-v100-pt19", "cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)", "convolution", "cuDNN"),
    ("hta-cnn-ddp-a100", "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128", "norm", "cuDNN"),
    ("kineto-resnet50-v100-pt19", "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512", "norm", "cuDNN"),
    ("hta-cnn-ddp-a100", "void cudnn::ops::nchwToNhwcKernel<float", "copy", "cuDNN"),
    ("kineto-resnet50-v100-pt19", "void nhwcToNchwKernel<float, float, float, true, false", "copy", "cuDNN"),
    ("gpt-sdpa-h200", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", "attention", "cuDNN"),
    ("gpt-sdpa-h200", "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention", "cuDNN"),
    ("gpt-sdpa-h200", "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>", "attention", "cuDNN"),
    # attention libraries
    ("tracelens-qwen05b-h100", "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64", "attention", "FlashAttention"),
    ("tracelens-moe-8rank-b200", "fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", "attention", "TensorRT-LLM"),
    ("tracelens-compile-mi300x", "attn_fwd", "attention", "AOTriton"),
    ("tracelens-qwen05b-mi300x", "attn_fwd", "attention", "AOTriton"),
    ("tracelens-sglang-qwen3-8b-mi300x", "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernel", "attention", "CK"),
    ("gpt-builtin-h200", "_attn_fwd_kernel", "attention", "Triton"),
    ("gpt-builtin-h200", "_attn_bwd_dkdv_kernel", "attention", "Triton"),
    # AMD: hipBLASLt (UserArgs) vs rocBLAS Tensile, MIOpen, CK, aiter, rocPRIM, RCCL
    ("tracelens-sglang-qwen3-8b-mi300x", "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x256x32_MI16x16x1", "gemm", "hipBLASLt"),
    ("hta-minitoy-mi250-rocm62", "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32", "gemm", "hipBLASLt"),
    ("tracelens-resnet-ckpt-8rank-mi300x", "Cijk_Ailk_Bljk_BBS_BH_MT64x64x64_MI16x16x16x1_SN_1LDSB0", "gemm", "rocBLAS"),
    ("tracelens-gpu-only-mi210", "igemm_fwd_gtcx2_nhwc_bf16_bx0_ex1_bt128x128x32", "convolution", "MIOpen"),
    ("tracelens-resnet-ckpt-8rank-mi300x", "igemm_wrw_gtcx3_nhwc_bf16", "convolution", "MIOpen"),
    ("tracelens-resnet-ckpt-8rank-mi300x", "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3", "convolution", "CK"),
    ("tracelens-resnet-ckpt-8rank-mi300x", "_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weight", "convolution", "CK"),
    ("tracelens-gpu-only-mi210", "batched_transpose_16x64_pack_1x4_ediv_1x2_half", "copy", "MIOpen"),
    ("tracelens-resnet-ckpt-8rank-mi300x", "transpose_NCHW2CNHW_V2_2D_WG_off64", "copy", "MIOpen"),
    ("tracelens-gpu-only-mi210", "SubTensorOpWithScalar1d", "elementwise", "MIOpen"),
    ("tracelens-vllm-graph-capture-mi300x", "_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwd", "norm", "CK"),
    ("tracelens-sglang-qwen3-8b-mi300x", "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256", "norm", "aiter"),
    ("tracelens-sglang-qwen3-8b-mi300x", "_ZN7sgl_hip10activation18act_and_mul_kernel", "elementwise", "SGLang"),
    ("tracelens-sglang-qwen3-8b-mi300x", "void rocprim::ROCPRIM_400200_NS::detail::trampoline_kernel<rocprim::ROCPRIM_400200_NS::detail::wrapped_scan_config", "scan", "rocPRIM"),
    ("tracelens-resnet-ckpt-8rank-mi300x", "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "communication", "NCCL"),
    # FBGEMM (table-batched embeddings, sparse ops)
    ("hta-dlrm-2rank-a100", "void split_embedding_codegen_forward_unweighted_kernel<c10::Half", "embedding", "FBGEMM"),
    ("hta-dlrm-2rank-a100", "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<c10::Half", "embedding", "FBGEMM"),
    ("hta-recsys-8rank-a100", "void split_embedding_codegen_grad_indice_weights_kernel<float", "embedding", "FBGEMM"),
    ("hta-dlrm-2rank-a100", "void bounds_check_indices_kernel<long, false>", "embedding", "FBGEMM"),
    ("hta-dlrm-2rank-a100", "void permute_pooled_embs_kernel<float>", "copy", "FBGEMM"),
    ("hta-recsys-8rank-a100", "void recat_copy_async_kernel<float>", "copy", "FBGEMM"),
    ("hta-dlrm-compiled-a100-80g", "void fbgemm_gpu::_block_bucketize_sparse_features_cuda_kernel1<int, int>", "index", "FBGEMM"),
    ("hta-dlrm-2rank-a100", "void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8_gpu", "quantize", "FBGEMM"),
    ("hta-dlrm-2rank-a100", "void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel<float>", "quantize", "FBGEMM"),
    # communication
    ("gpt-ddp-2gpu-h200", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication", "NCCL"),
    ("hta-cnn-ddp-a100", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "communication", "NCCL"),
    ("hta-recsys-8rank-a100", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "communication", "NCCL"),
    ("tracelens-moe-8rank-b200", "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>", "communication", "PyTorch"),
    # compilers
    ("tracelens-compile-mi300x", "triton_poi_fused__unsafe_view_mul_silu_2", "elementwise", "Inductor"),
    ("tracelens-compile-mi300x", "triton_red_fused_add_mean_mul_pow_rsqrt_0", "reduction", "Inductor"),
    ("tracelens-vllm-graph-capture-mi300x", "triton_poi_fused_constant_pad_nd_moe_forward_0", "elementwise", "Inductor"),
    ("hta-dlrm-compiled-a100-80g", "triton__0d1d2d3d", "compiler-generated", "Inductor"),
    # PyTorch native (ATen)
    ("gpt-builtin-h200", "void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl", "elementwise", "PyTorch"),
    ("gpt-naive-h200", "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>", "elementwise", "PyTorch"),
    ("tests-data-gpt-naive-h200", "void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<unsigned int, 4", "elementwise", "PyTorch"),
    ("hta-dlrm-2rank-a100", "void (anonymous namespace)::elementwise_kernel_with_index<int, at::native::arange_cuda_out", "elementwise", "PyTorch"),
    ("tracelens-qwen05b-mi300x", "void at::native::elementwise_kernel_manual_unroll<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float", "elementwise", "PyTorch"),
    ("tracelens-timesformer-h100", "void at::native::(anonymous namespace)::upsample_nearest1d_out_frame<c10::BFloat16", "elementwise", "PyTorch"),
    ("gpt-builtin-h200", "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor", "reduction", "PyTorch"),
    ("hta-compiled-2rank-v100", "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::WelfordOps<float", "reduction", "PyTorch"),
    ("gpt-ddp-2gpu-h200", "void (anonymous namespace)::softmax_warp_forward<float, float, float, 11, false, false>", "softmax", "PyTorch"),
    ("gpt-builtin-h200", "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>", "softmax", "PyTorch"),
    ("tracelens-timesformer-h100", "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16", "softmax", "PyTorch"),
    ("tracelens-timesformer-h100", "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "norm", "PyTorch"),
    ("hta-dlrm-2rank-a100", "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>", "norm", "PyTorch"),
    ("tracelens-gpu-only-mi210", "void at::native::batch_norm_collect_statistics_kernel<at::native::Var", "norm", "PyTorch"),
    ("tracelens-gpu-only-mi210", "void at::native::(anonymous namespace)::unrolled_elementwise_kernel_for_multi_outputs<3, at::native::(anonymous namespace)::batch_norm_update_stats_and_invert", "norm", "PyTorch"),
    ("hta-alexnet-a100", "void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>", "pooling", "PyTorch"),
    ("hta-alexnet-a100", "void at::native::(anonymous namespace)::adaptive_average_pool<float>", "pooling", "PyTorch"),
    ("tracelens-qwen05b-h100", "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, unsigned int, 4, 64, 64>", "copy", "PyTorch"),
    ("tracelens-moe-8rank-b200", "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda", "copy", "PyTorch"),
    ("gpt-builtin-h200", "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda", "copy", "PyTorch"),
    ("tracelens-qwen05b-h100", "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16", "index", "PyTorch"),
    ("tracelens-moe-8rank-b200", "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl", "index", "PyTorch"),
    ("hta-dlrm-2rank-a100", "void compute_cuda_kernel<long>(long*, long*, long*, long, long)", "index", "PyTorch"),
    ("gpt-builtin-h200", "void at::native::(anonymous namespace)::krn_partials_per_segment<long>", "embedding", "PyTorch"),
    ("gpt-builtin-h200", "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>", "loss", "PyTorch"),
    ("kineto-resnet50-v100-pt19", "void cunn_ClassNLLCriterion_updateOutput_kernel<float, float>", "loss", "PyTorch"),
    ("gpt-builtin-h200", "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>", "optimizer", "PyTorch"),
    ("hta-recsys-8rank-a100", "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>", "optimizer", "Apex"),
    ("gpt-builtin-h200", "void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortOnesweepKernel", "sort", "CUB"),
    ("hta-recsys-8rank-a100", "void at::native::(anonymous namespace)::searchsorted_cuda_kernel<float, long>", "sort", "PyTorch"),
    ("hta-dlrm-2rank-a100", "void cub::DeviceScanKernel<cub::AgentScanPolicy<128, 15, int", "scan", "CUB"),
    ("hta-dlrm-2rank-a100", "void cub::DeviceReduceByKeyKernel", "reduction", "CUB"),
    # vLLM, SGLang, TensorRT-LLM, triton_kernels, user Triton
    ("tracelens-moe-8rank-b200", "void vllm::rms_norm_kernel<c10::BFloat16, 8, 2>", "norm", "vLLM"),
    ("tracelens-moe-8rank-b200", "std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::fused_add_rms_norm_kernel", "norm", "vLLM"),
    ("tracelens-moe-8rank-b200", "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char", "copy", "vLLM"),
    ("tracelens-moe-8rank-b200", "void vllm::scaled_fp8_quant_kernel_strided", "quantize", "vLLM"),
    ("tracelens-moe-8rank-b200", "void vllm::rotary_embedding_kernel<c10::BFloat16, true>", "elementwise", "vLLM"),
    ("tracelens-moe-8rank-b200", "bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32", "gemm", "TensorRT-LLM"),
    ("tracelens-moe-8rank-b200", "void moe::dev::routing::routingIndicesHistogramKernel", "moe", "TensorRT-LLM"),
    ("tracelens-moe-8rank-b200", "void moe::dev::finalize::finalizeKernelVecLoad", "moe", "TensorRT-LLM"),
    ("tracelens-moe-8rank-b200", "void tensorrt_llm::kernels::quantize_with_block_size", "quantize", "TensorRT-LLM"),
    ("tracelens-vllm-graph-capture-mi300x", "_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1_swiglu", "gemm", "triton_kernels"),
    ("tracelens-vllm-graph-capture-mi300x", "_topk_forward", "moe", "triton_kernels"),
    ("tracelens-vllm-graph-capture-mi300x", "_combined_routing_compute", "moe", "triton_kernels"),
    ("tracelens-sglang-qwen3-8b-mi300x", "void rotary_embedding_kernel<c10::BFloat16, true>", "elementwise", "SGLang"),
    ("tracelens-sglang-qwen3-8b-mi300x", "void (anonymous namespace)::store_kvcache<2048l", "copy", "SGLang"),
    ("tracelens-sglang-qwen3-8b-mi300x", "compute_position_kernel", "triton", "Triton"),
    ("tracelens-sglang-qwen3-8b-mi300x", "create_flashinfer_kv_indices_triton", "index", "Triton"),
    ("gpt-builtin-h200", "_norm_fwd_kernel", "norm", "Triton"),
    ("gpt-builtin-h200", "_sum_partials_kernel", "reduction", "Triton"),
    # cuDNN's NHWC depthwise kernels, inside ops (eager) and replayed by a CUDA graph
    ("convnext-t-h200", "conv2d_c1_k1_nhwc_specialized", "convolution", "cuDNN"),
    ("convnext-t-h200", "dgrad2d_c1_k1_nhwc_specialized", "convolution", "cuDNN"),
    ("convnext-t-cudagraphs-h200", "wgrad2d_c1_k1_nhwc", "convolution", "cuDNN"),
    # memory activities
    ("tracelens-qwen05b-h100", "Memcpy DtoH (Device -> Pinned)", "memcpy", None),
    ("hta-dlrm-2rank-a100", "Memcpy HtoD (Pinned -> Device)", "memcpy", None),
    ("hta-alexnet-a100", "Memset (Device)", "memset", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("folder", "start", "kind", "library"),
    [pytest.param(*row, marks=corpus) if row[0] in EXTERNAL_FOLDERS else row for row in TABLE],
    ids=lambda v: str(v)[:60],
)
def test_real_names_get_the_expected_class(folder, start, kind, library):
    matches = {n: a for n, a in trace_names(folder).items() if n.startswith(start)}
    assert matches, f"{start!r} is not the start of any kernel name in {folder}"
    for name, activity in matches.items():
        kc = classify_kernel(name, activity)
        assert (kc.kind, kc.library) == (kind, library), name
        assert kc.vendor_library is (library in VENDOR), name


@corpus
def test_table_covers_every_library_and_kind_that_occurs():
    seen_kinds = {row[2] for row in TABLE}
    seen_libraries = {row[3] for row in TABLE}
    corpus = {n: a for f in (*EXTERNAL_FOLDERS, *OWN_RUNS) for n, a in trace_names(f).items()}
    occurring = {classify_kernel(n, a) for n, a in corpus.items()}
    assert {kc.kind for kc in occurring} <= seen_kinds
    assert {kc.library for kc in occurring} <= seen_libraries
    assert len(TABLE) >= 60


# Per-trace allowance of names left `unknown`: none, on every trace.
UNKNOWN_ALLOWANCE = {folder: 0 for folder in (*EXTERNAL_FOLDERS, *OWN_RUNS)}
GEMM_NAME = re.compile(r"(?i)(?<!fb)gemm|gemv|^Cijk_|^nvjet_|xmma_gemm")
# Implicit-GEMM convolutions name GEMM too: cuDNN xmma fprop / dgrad / wgrad, MIOpen igemm,
# CK grouped conv and conv backward-weight (kernel_batched_gemm_xdlops_bwd_weight).
CONV_MARK = re.compile(r"(?i)conv|fprop|dgrad|wgrad|bwd_weight|cudnn|^igemm_(fwd|bwd|wrw)_")
COMM_NAME = re.compile(r"(?i)nccl|rccl")
LIBRARY_NAME = re.compile(r"(?i)fbgemm|cutlass|flash|fmha")


@pytest.mark.parametrize("folder", (*(pytest.param(f, marks=corpus) for f in EXTERNAL_FOLDERS), *OWN_RUNS))
def test_every_name_of_every_trace_gets_a_sensible_class(folder):
    names = trace_names(folder)
    classes = {name: classify_kernel(name, activity) for name, activity in names.items()}
    unknown = sorted(n for n, kc in classes.items() if kc.kind == "unknown")
    if unknown:
        print(f"{folder}: unknown kernel names:", *unknown, sep="\n  ")
    assert len(unknown) <= UNKNOWN_ALLOWANCE[folder], unknown
    for name, kc in classes.items():
        if GEMM_NAME.search(name):
            assert kc.kind == "gemm" or (kc.kind == "convolution" and CONV_MARK.search(name)), name
        if COMM_NAME.search(name):
            assert kc.kind == "communication", name
        if LIBRARY_NAME.search(name):
            assert kc.kind not in ("elementwise", "reduction"), name
        assert kc.kind in known_kinds()
        if kc.kind in ("memcpy", "memset"):
            assert names[name] == kc.kind


@corpus
def test_mangled_names_classify_like_their_demangled_spelling():
    # Real names as Kineto shows them on ROCm (mangled) ...
    lite = {
        "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib": "aiter::add_rmsnorm_quant_kernel",
        "_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16": "sgl_hip::activation::act_and_mul_kernel",
        "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_28Gr": "ck::tensor_operation::device::(anonymous namespace)::kernel_grouped_conv_fwd_xdl_cshuffle_v3",
    }  # fmt: skip
    for mangled, nested in lite.items():
        assert demangle_lite(mangled) == nested
    assert demangle_lite("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") is None
    # ... and the Itanium manglings (as Nsight Compute prints them) of two real CUDA kernel
    # names of the traces; `c++filt` turns each back into the demangled name beside it.
    pairs = [
        (
            "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_",
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
        ),
        (
            "_ZN7cutlass6KernelI52cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4EEvNT_6ParamsE",
            "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4::Params)",
        ),
    ]
    for mangled, demangled in pairs:
        assert any(demangled in trace_names(f) for f in (*EXTERNAL_FOLDERS, *OWN_RUNS)), demangled
        assert classify_kernel(mangled) == classify_kernel(demangled) != KernelClass("unknown", None, False)


NSYS = ROOT / "tests" / "data" / "nsys"
NCU_CSVS = sorted((ROOT / "tests" / "data" / "gpt-naive-h200").glob("ncu_*_raw.csv.gz"))
# TensorIterator kernels whose base name alone cannot tell a copy from arithmetic (the functor
# that says "direct_copy_kernel_cuda" is in the template arguments the short name drops).
GENERIC_BASE = {"elementwise_kernel", "unrolled_elementwise_kernel", "vectorized_elementwise_kernel"}


def test_nsight_systems_spellings_classify_alike():
    """Nsight Systems stores each kernel three ways: demangled (<unnamed>, (int)4 …), mangled
    (nvcc's _GLOBAL__N__<hash>_<file>_cu_<hash> namespaces) and short (base name only)."""
    import sqlite3

    query = (
        "SELECT DISTINCT d.value, m.value, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds d ON d.id = k.demangledName JOIN StringIds m ON m.id = k.mangledName "
        "JOIN StringIds s ON s.id = k.shortName"
    )
    rows = []
    for path in sorted(NSYS.glob("*.sqlite")):
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            rows += db.execute(query).fetchall()
    assert len(rows) >= 50
    for demangled, mangled, short in rows:
        full = classify_kernel(demangled)
        assert full.kind != "unknown" and full.library is not None, demangled
        assert classify_kernel(mangled) == full, (demangled, mangled)
        brief = classify_kernel(short)
        assert brief.library == full.library, (short, demangled)
        assert brief.kind == full.kind or (short in GENERIC_BASE and brief.kind == "elementwise"), short


def test_nsight_compute_spellings_are_classified():
    """Nsight Compute demangles ATen names its own way (at::<unnamed>::, [lambda() (instance 3)])."""
    import csv
    import io

    names = set()
    for path in NCU_CSVS:
        rows = csv.reader(io.StringIO(gzip.decompress(path.read_bytes()).decode()))
        column = next(rows).index("Kernel Name")
        names |= {row[column] for row in rows if len(row) > column and row[column]}
    assert len(names) >= 30
    kineto = {classify_kernel(n) for n in trace_names("tests-data-gpt-naive-h200")}
    for name in names:
        kc = classify_kernel(name)
        assert kc.kind != "unknown" and kc.library in ("PyTorch", "cuBLAS"), name
    # the same run seen by both tools yields the same classes
    assert {classify_kernel(n) for n in names} <= kineto


def test_activity_spellings_and_unknown_names():
    assert classify_kernel("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy").kind == "memcpy"
    assert classify_kernel("Memset (Device)", "Memset").kind == "memset"
    # a memcpy activity is a memcpy whatever its name; a kernel named like nothing is unknown
    assert classify_kernel("anything", "memcpy") == KernelClass("memcpy", None, False)
    assert classify_kernel("Some Unrecognized Kernel(int)") == KernelClass("unknown", None, False)
    # an unrecognized ATen kernel still names its library
    assert classify_kernel("void at::native::frobnicate<float>(float*)") == KernelClass(
        "unknown", "PyTorch", False
    )


def test_classification_is_memoized():
    name = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
    classify_kernel(name)
    before = classify_kernel.cache_info().hits
    assert classify_kernel(name).kind == "gemm"
    assert classify_kernel.cache_info().hits == before + 1


def test_table_data_is_declared_and_sourced():
    raw = load_yaml("kernel_classes.yaml")
    assert raw["schema"] == "kerneltriage.kernel_classes/1"
    assert known_kinds() == tuple(raw["kinds"])
    assert {"gemm", "attention", "convolution", "elementwise", "communication", "unknown"} <= set(
        known_kinds()
    )
    for entry in raw["kernels"]:
        assert entry["kind"] in known_kinds()
        assert entry.get("source") or entry.get("note"), entry
    declared = {lib["library"] for lib in raw["libraries"]}
    assert {e["library"] for e in raw["kernels"] if "library" in e} <= declared
    assert {lib.name for lib in _table().libraries if lib.vendor} == VENDOR | {
        "xFormers", "FlashInfer", "Transformer Engine", "DeepGEMM", "Marlin", "Liger", "cuFFT", "RCCL",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("name", "trait", "has"),
    [
        ("ampere_sgemm_128x64_nn", "fp32_simt", True),
        (
            "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
            "fp32_simt",
            True,
        ),
        (
            "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas",
            "tensor_op",
            False,
        ),
        (
            "sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage3_warpsize2x2x1_tensor16x8x16_execute_kernel",
            "tensor_op",
            True,
        ),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>", "tensor_op", True),
        ("void cudnn::detail::dgrad_engine<float, 128, 6, 7, 3, 3, 5, true>(int)", "fp32_template", True),
        ("cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align2", "unaligned", True),
        ("cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8", "unaligned", False),
        ("void cudnn::engines_precompiled::wgrad_alg0_engine<float>", "backward", True),
        ("dgrad2d_c1_k1_nhwc_specialized_map_reduce", "depthwise", True),
        (
            "void at::native::(anonymous namespace)::conv_depthwise2d_grad_weight_kernel<float>",
            "depthwise",
            True,
        ),
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", "depthwise", False),
        ("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, float>", "half_template", True),
        ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10>", "float_template", True),
    ],
)
def test_traits_read_what_a_name_says_beyond_its_class(name, trait, has):
    from kerneltriage.analysis.kernel_classes import has_trait

    assert has_trait(name, trait) is has


def test_every_trait_is_declared_with_its_source():
    from kerneltriage.analysis.kernel_classes import TRAITS

    traits = load_yaml("kernel_classes.yaml")["traits"]
    assert tuple(traits) == TRAITS
    assert all(t["source"] and t["patterns"] for t in traits.values())


def test_cutlass_grouped_gemms_left_mangled_by_the_profiler_are_gemm():
    # torch._grouped_mm's CUTLASS 3 kernels, as an H100 MoE trace spells them (mangled: CUPTI
    # does not demangle them); their template arguments name cute::Copy_Atom.
    symbols = (DATA / "cutlass_grouped_gemm_symbols.txt").read_text().split()
    assert len(symbols) == 3 and all("Copy_Atom" in s for s in symbols)
    assert {classify_kernel(s) for s in symbols} == {KernelClass("gemm", "CUTLASS", True)}
