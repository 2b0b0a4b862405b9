"""One launch of each int8 per-token split kernel (int8 query, fp32 query, tensor cores) at B64 H8
T32768 D128, for Nsight Compute.

Run through ``bash .ci/gpu_session.sh ncu``; the configs are the autotuner's H200 winners, fixed so
that no tuning launches reach the profiler.
"""

import torch
import triton
from microscope_kernels.int8_kv_cache import kernel
from microscope_kernels.int8_kv_cache.descriptors import fit_descriptor_blocks
from microscope_kernels.int8_kv_cache.kernel import int8_decode_attention, quantize_kv

# one config each means no autotuning launches
kernel._split_int8_tuned.configs = [triton.Config({"BLOCK_T": 64, "STAGES": 3}, num_warps=4,
                                                  pre_hook=fit_descriptor_blocks)]
kernel._split_int8_dot_tuned.configs = [triton.Config({"BLOCK_T": 128, "STAGES": 3}, num_warps=4,
                                                      pre_hook=fit_descriptor_blocks)]

b, h, t, d = 64, 8, 32768, 128
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
k = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=g)
v = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16, generator=g)
kq, ks = quantize_kv(k, "token")
vq, vs = quantize_kv(v, "token")
del k, v
# the int8-query (dp4a) kernel, the fp32-product one it replaced, the tensor-core one
for products, int8_query in (("fma", True), ("fma", False), ("dot", None)):
    int8_decode_attention(q, kq, ks, vq, vs, "token", products=products, int8_query=int8_query)
torch.cuda.synchronize()
