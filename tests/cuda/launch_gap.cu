/*
 * tests/cuda/launch_gap.cu -- what a grid collective's per-launch words cost
 * between two kernels on one stream (session 27; docs/results.md).
 *
 * Times 2000 back-to-back launches of a 64 x 512 kernel whose block 0 spins
 * for 0 or 20 us, between two CUDA events, in five modes: the launch alone;
 * with cudaMallocAsync + cudaMemsetAsync of 64 bytes before it and
 * cudaFreeAsync after it (what every grid form did before session 27);
 * with a memset of a fixed 64 bytes; with an event created and recorded
 * after each launch and the next launch's stream waiting on it (what the
 * runtime's ring of grid words does, runtime/src/gpu/grid.rs); the launch
 * alone again. Prints us per launch on the GPU and on the host (enqueue);
 * the first of two runs of each mode is a warm-up. A benchmark, no checks:
 *
 *     nvcc -arch=sm_90 -O2 tests/cuda/launch_gap.cu -o launch_gap && ./launch_gap
 */
#include <chrono>
#include <cstdio>
#include <cuda_runtime.h>

__global__ void spin(unsigned long long ns, unsigned long long* w)
{
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        t = t0;
        while (t - t0 < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        w[1] += 1;
    }
}

int main()
{
    static const char* const names[] = {"launch alone", "malloc+memset+launch+free", "memset fixed+launch",
                                         "launch+event per launch+wait", "launch alone again"};
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    unsigned long long* fixed;
    cudaMalloc(&fixed, 64);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    const int N = 2000;
    for (unsigned long long ns : {0ull, 20000ull}) {
        for (int mode = 0; mode < 5; ++mode) {
            for (int rep = 0; rep < 2; ++rep) {
                cudaStreamSynchronize(s);
                const auto h0 = std::chrono::steady_clock::now();
                cudaEventRecord(a, s);
                cudaEvent_t last = nullptr;
                for (int i = 0; i < N; ++i) {
                    unsigned long long* w = fixed;
                    if (mode == 1) {
                        cudaMallocAsync((void**)&w, 64, s);
                        cudaMemsetAsync(w, 0, 64, s);
                    }
                    if (mode == 2) cudaMemsetAsync(w, 0, 64, s);
                    if (mode == 3 && last != nullptr) cudaStreamWaitEvent(s, last, 0);
                    spin<<<64, 512, 0, s>>>(ns, w);
                    if (mode == 1) cudaFreeAsync(w, s);
                    if (mode == 3) {
                        cudaEvent_t e;
                        cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
                        cudaEventRecord(e, s);
                        if (last != nullptr) cudaEventDestroy(last);
                        last = e;
                    }
                }
                cudaEventRecord(b, s);
                const auto h1 = std::chrono::steady_clock::now();
                cudaEventSynchronize(b);
                float ms = 0;
                cudaEventElapsedTime(&ms, a, b);
                const double host = std::chrono::duration<double, std::micro>(h1 - h0).count() / N;
                if (last != nullptr) cudaEventDestroy(last);
                if (rep == 1)
                    printf("gap: kernel %5llu ns, mode %d (%s): %.2f us per launch on the GPU, host enqueue %.2f us\n", ns,
                           mode, names[mode], ms * 1000 / N, host);
            }
        }
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "launch_gap: %s\n", cudaGetErrorString(e));
        return 1;
    }
    return 0;
}
