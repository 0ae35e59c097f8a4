// fp32 SGEMM through CUTLASS's device-level GEMM (SIMT fp32 FMA, the default for float on sm_80+):
// C[M,N] = A[M,K] @ B[K,N], all row-major. Headers come from the nvidia-cutlass wheel (or $CUTLASS_PATH).
// SIMT, not TF32 tensor cores: the reference's tolerance (examples/gemm/ref.py) rejects TF32's 10-bit mantissa.
#include <cstdio>
#include <cuda_runtime.h>
#include <cutlass/gemm/device/gemm.h>

using RowMajor = cutlass::layout::RowMajor;
using Sgemm = cutlass::gemm::device::Gemm<float, RowMajor,   // A
                                          float, RowMajor,   // B
                                          float, RowMajor,   // C
                                          float,             // accumulator
                                          cutlass::arch::OpClassSimt, cutlass::arch::Sm80>;

extern "C" void solve(const float* A, const float* B, float* C, int M, int N, int K) {
    Sgemm gemm;
    Sgemm::Arguments args({M, N, K}, {A, K}, {B, N}, {C, N}, {C, N}, {1.0f, 0.0f});
    cutlass::Status status = gemm(args);  // launches on the default stream
    if (status != cutlass::Status::kSuccess) {
        std::fprintf(stderr, "gemm_cutlass: %s\n", cutlassGetStatusString(status));  // output stays NaN: fails
    }
}
