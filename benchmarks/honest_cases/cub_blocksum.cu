// One partial sum per block of 512 floats, with CUB's block-wide load and reduction. Including CUB compiles its
// never-launched cub::...::detail::EmptyKernel<void> into the build: the sass gate judges block_sum only (#41).
#include <cub/cub.cuh>

constexpr int THREADS = 128, ITEMS = 4;

__global__ void block_sum(const float* x, float* y, int n) {
    using Load = cub::BlockLoad<float, THREADS, ITEMS, cub::BLOCK_LOAD_DIRECT>;
    using Reduce = cub::BlockReduce<float, THREADS>;
    __shared__ typename Reduce::TempStorage scratch;
    float v[ITEMS];
    int base = blockIdx.x * THREADS * ITEMS;
    Load().Load(x + base, v, n - base, 0.0f);
    float s = 0.0f;
    for (int i = 0; i < ITEMS; ++i) s += v[i];
    float total = Reduce(scratch).Sum(s);
    if (threadIdx.x == 0) y[blockIdx.x] = total;
}

extern "C" void solve(const float* x, float* y, int n) {
    block_sum<<<(n + THREADS * ITEMS - 1) / (THREADS * ITEMS), THREADS>>>(x, y, n);
}
