// tests/cuda/coll.cu -- nvshmem.h's team collectives from one block per PE
// (scripts/test-c.sh builds it with nvcc against the installed headers and
// runs it where there is a GPU): reduce (sum, max), broadcast, fcollect,
// alltoall on NVSHMEM_TEAM_WORLD, and then the _on_stream forms (int sum
// reduce, broadcast, fcollect; double min reduce; and reductions large enough
// for the grid form of cpnet/grid.cuh where the heaps are mapped: float sum
// of NG elements, int max 4 bytes off 16-byte alignment, long sum in place)
// and an alltoall of NA ints per pair (the runtime's grid or network-path
// form where one runs) on the same stream, every element checked on the host. `coll legacy` uses
// the legacy stream; `coll bench` also times the float sum reduce on a stream.
#include <nvshmem.h>
#include <algorithm>
#include <cstdio>
#include <vector>

#define N 1000
/* Elements of the large reductions: over CPNET_REDUCE_GRID_MIN_BYTES, odd. */
#define NG 300001
/* Ints per pair of the large alltoall (640 KiB): over the runtime's grid
 * form's 512 KiB and its network-path form's 128 KiB. */
#define NA 163840

__global__ void coll_kernel(int* src, int* sum, int* mx, int* bc, int* fc, int* a2a_src, int* a2a)
{
    const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
    for (int i = threadIdx.x; i < N; i += blockDim.x) src[i] = (me + 1) * 1000 + i;
    for (int i = threadIdx.x; i < n; i += blockDim.x) a2a_src[i] = me * 100 + i;
    __syncthreads();
    nvshmemx_int_sum_reduce_block(NVSHMEM_TEAM_WORLD, sum, src, N);
    nvshmemx_int_max_reduce_block(NVSHMEM_TEAM_WORLD, mx, src, N);
    nvshmemx_int_broadcast_block(NVSHMEM_TEAM_WORLD, bc, src, N, n - 1);
    nvshmemx_int_fcollect_block(NVSHMEM_TEAM_WORLD, fc, src, 7);
    nvshmemx_int_alltoall_block(NVSHMEM_TEAM_WORLD, a2a, a2a_src, 1);
    nvshmemx_barrier_block(NVSHMEM_TEAM_WORLD);
}

int main(int argc, char** argv)
{
    // "legacy": the legacy default stream; otherwise a non-blocking stream.
    const bool legacy = argc > 1 && argv[1][0] == 'l';
    // "bench": then time the float sum reduce on a stream, 4 KiB to 64 MiB.
    const bool bench = argc > 1 && argv[1][0] == 'b';
    nvshmem_init();
    const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
    int* src = (int*)nvshmem_malloc(N * sizeof(int));
    int* sum = (int*)nvshmem_malloc(N * sizeof(int));
    int* mx = (int*)nvshmem_malloc(N * sizeof(int));
    int* bc = (int*)nvshmem_malloc(N * sizeof(int));
    int* fc = (int*)nvshmem_malloc(7 * n * sizeof(int));
    int* a2a_src = (int*)nvshmem_malloc(n * sizeof(int));
    int* a2a = (int*)nvshmem_malloc(n * sizeof(int));
    cudaStream_t s = 0;
    if (!legacy) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int* sum2 = (int*)nvshmem_malloc(N * sizeof(int));
    int* bc2 = (int*)nvshmem_malloc(N * sizeof(int));
    int* fc2 = (int*)nvshmem_malloc(7 * n * sizeof(int));
    double* dsrc = (double*)nvshmem_malloc(N * sizeof(double));
    double* dmin = (double*)nvshmem_malloc(N * sizeof(double));
    float* gsrc = (float*)nvshmem_malloc(NG * sizeof(float));
    float* gsum = (float*)nvshmem_malloc(NG * sizeof(float));
    int* gisrc = (int*)nvshmem_malloc((NG + 1) * sizeof(int));
    int* gimax = (int*)nvshmem_malloc((NG + 1) * sizeof(int));
    long* glong = (long*)nvshmem_malloc(NG * sizeof(long));
    int* asrc = (int*)nvshmem_malloc((size_t)NA * n * sizeof(int));
    int* adst = (int*)nvshmem_malloc((size_t)NA * n * sizeof(int));
    coll_kernel<<<1, 128, 0, s>>>(src, sum, mx, bc, fc, a2a_src, a2a);
    nvshmemx_barrier_on_stream(NVSHMEM_TEAM_WORLD, s);
    /* The _on_stream forms, ordered after the kernel on the same stream. */
    std::vector<double> hd(N);
    for (int i = 0; i < N; ++i) hd[i] = 0.5 * (me + 1) + i;
    cudaMemcpyAsync(dsrc, hd.data(), N * sizeof(double), cudaMemcpyHostToDevice, s);
    std::vector<float> hg(NG);
    std::vector<int> hi(NG + 1);
    std::vector<long> hl(NG);
    for (int i = 0; i < NG; ++i) {
        hg[i] = (float)(me + 1) + (float)(i % 1000);
        hi[i + 1] = (i * 7 + me * 13) % 100003;
        hl[i] = (long)(me + 1) * 1000003L + i;
    }
    cudaMemcpyAsync(gsrc, hg.data(), NG * sizeof(float), cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(gisrc, hi.data(), (NG + 1) * sizeof(int), cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(glong, hl.data(), NG * sizeof(long), cudaMemcpyHostToDevice, s);
    int rc = 0;
    rc |= nvshmemx_float_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, gsum, gsrc, NG, s);
    rc |= nvshmemx_int_max_reduce_on_stream(NVSHMEM_TEAM_WORLD, gimax + 1, gisrc + 1, NG, s);
    rc |= nvshmemx_long_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, glong, glong, NG, s);
    rc |= nvshmemx_int_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, sum2, src, N, s);
    rc |= nvshmemx_int_broadcast_on_stream(NVSHMEM_TEAM_WORLD, bc2, src, N, 0, s);
    rc |= nvshmemx_int_fcollect_on_stream(NVSHMEM_TEAM_WORLD, fc2, src, 7, s);
    rc |= nvshmemx_double_min_reduce_on_stream(NVSHMEM_TEAM_WORLD, dmin, dsrc, N, s);
    /* Element k of block j of PE p: p * 1000003 + j * 7919 + k. */
    std::vector<int> ha((size_t)NA * n);
    for (int j = 0; j < n; ++j)
        for (int k = 0; k < NA; ++k) ha[(size_t)j * NA + k] = me * 1000003 + j * 7919 + k;
    cudaMemcpyAsync(asrc, ha.data(), ha.size() * sizeof(int), cudaMemcpyHostToDevice, s);
    rc |= nvshmemx_int_alltoall_on_stream(NVSHMEM_TEAM_WORLD, adst, asrc, NA, s);
    cudaStreamSynchronize(s);
    nvshmem_barrier_all();
    std::vector<int> h(N), f(7 * n), a(n);
    int bad = 0;
    cudaMemcpy(h.data(), sum, N * sizeof(int), cudaMemcpyDeviceToHost);
    for (int i = 0; i < N; ++i) {
        int want = 0;
        for (int p = 0; p < n; ++p) want += (p + 1) * 1000 + i;
        bad += h[i] != want;
    }
    cudaMemcpy(h.data(), mx, N * sizeof(int), cudaMemcpyDeviceToHost);
    for (int i = 0; i < N; ++i) bad += h[i] != n * 1000 + i;
    cudaMemcpy(h.data(), bc, N * sizeof(int), cudaMemcpyDeviceToHost);
    for (int i = 0; i < N; ++i) bad += h[i] != n * 1000 + i;
    cudaMemcpy(f.data(), fc, 7 * n * sizeof(int), cudaMemcpyDeviceToHost);
    for (int p = 0; p < n; ++p)
        for (int i = 0; i < 7; ++i) bad += f[p * 7 + i] != (p + 1) * 1000 + i;
    cudaMemcpy(a.data(), a2a, n * sizeof(int), cudaMemcpyDeviceToHost);
    for (int p = 0; p < n; ++p) bad += a[p] != p * 100 + me;
    /* _on_stream results */
    bad += rc != 0;
    cudaMemcpy(h.data(), sum2, N * sizeof(int), cudaMemcpyDeviceToHost);
    for (int i = 0; i < N; ++i) {
        int want = 0;
        for (int p = 0; p < n; ++p) want += (p + 1) * 1000 + i;
        bad += h[i] != want;
    }
    cudaMemcpy(h.data(), bc2, N * sizeof(int), cudaMemcpyDeviceToHost);
    for (int i = 0; i < N; ++i) bad += h[i] != 1000 + i;
    cudaMemcpy(f.data(), fc2, 7 * n * sizeof(int), cudaMemcpyDeviceToHost);
    for (int p = 0; p < n; ++p)
        for (int i = 0; i < 7; ++i) bad += f[p * 7 + i] != (p + 1) * 1000 + i;
    cudaMemcpy(hd.data(), dmin, N * sizeof(double), cudaMemcpyDeviceToHost);
    for (int i = 0; i < N; ++i) bad += hd[i] != 0.5 + i;
    /* The large reductions */
    int gbad = 0;
    cudaMemcpy(hg.data(), gsum, NG * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; i < NG; ++i) {
        float want = 0;
        for (int p = 0; p < n; ++p) want += (float)(p + 1) + (float)(i % 1000);
        gbad += hg[i] != want;
    }
    cudaMemcpy(hi.data(), gimax, (NG + 1) * sizeof(int), cudaMemcpyDeviceToHost);
    for (int i = 0; i < NG; ++i) {
        int want = 0;
        for (int p = 0; p < n; ++p) want = std::max(want, (i * 7 + p * 13) % 100003);
        gbad += hi[i + 1] != want;
    }
    cudaMemcpy(hl.data(), glong, NG * sizeof(long), cudaMemcpyDeviceToHost);
    for (int i = 0; i < NG; ++i) {
        long want = 0;
        for (int p = 0; p < n; ++p) want += (long)(p + 1) * 1000003L + i;
        gbad += hl[i] != want;
    }
    cudaMemcpy(ha.data(), adst, ha.size() * sizeof(int), cudaMemcpyDeviceToHost);
    for (int i = 0; i < n; ++i)
        for (int k = 0; k < NA; ++k) gbad += ha[(size_t)i * NA + k] != i * 1000003 + me * 7919 + k;
    bad += gbad;
    printf("coll: PE %d of %d (%d-element reductions, %d ints per pair alltoall: %d wrong): %d wrong: %s\n", me, n, NG, NA, gbad, bad,
           bad ? "FAILED" : "ok");
    if (bench) {
        /* float sum on a stream, µs per call (200 up to 1 MiB, else 20,
         * after 3 warm-up), as the runtime's `cpnet-gpu-check reduce-bench`
         * times it. */
        for (size_t bytes = 4096; bytes <= ((size_t)64 << 20); bytes *= 4) {
            float* bs = (float*)nvshmem_malloc(bytes);
            float* bd = (float*)nvshmem_malloc(bytes);
            const size_t ne = bytes / sizeof(float);
            const int calls = bytes <= ((size_t)1 << 20) ? 200 : 20;
            for (int k = 0; k < 3; ++k) nvshmemx_float_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, bd, bs, ne, s);
            cudaStreamSynchronize(s);
            nvshmem_barrier_all();
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            cudaEventRecord(e0, s);
            for (int k = 0; k < calls; ++k) nvshmemx_float_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, bd, bs, ne, s);
            cudaEventRecord(e1, s);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            if (me == 0) printf("coll bench: float sum_reduce_on_stream %zu bytes: %.2f us\n", bytes, ms * 1000.0f / calls);
            nvshmem_barrier_all();
            nvshmem_free(bd);
            nvshmem_free(bs);
        }
    }
    nvshmem_finalize();
    return bad ? 1 : 0;
}
