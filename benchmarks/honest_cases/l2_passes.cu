// A gather that reads its whole input P times per call: y[i] = sum over p < P of x[(i + 4099 p) mod N]. With
// N = 524288 one input set and its output are 4 MiB, so the timing's 8 rotating sets (32 MiB) stay in the
// H100/H200's 50 MiB L2 while the side-stream probe, which no L2 flush precedes, runs its calls; the timed calls
// follow a flush. An honest kernel of >= 0.1 ms whose probe sees a warm L2: its probe/events ratio against the
// 0.8 rule (gates/suspects.host_under_events).
#include <cuda_runtime.h>

__global__ void gather_passes(const float* x, float* y, int N, int P) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float acc = 0.0f;
    long long j = i;
    for (int p = 0; p < P; ++p) {
        acc += x[j];
        j += 4099;
        if (j >= N) j %= N;
    }
    y[i] = acc;
}

extern "C" void solve(const float* x, float* y, int N, int P) {
    gather_passes<<<(N + 255) / 256, 256>>>(x, y, N, P);
}
