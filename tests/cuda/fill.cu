/*
 * tests/cuda/fill.cu -- a collective launch that fills the GPU and waits on
 * the network (scripts/test-c.sh; issue 21).
 *
 * Every block of the largest grid nvshmemx_collective_launch_query_gridsize
 * allows puts a 4 KiB slot with a signal into the next PE's heap and waits
 * for the one the previous PE sends it. On the network path
 * (CPNET_GPU_IPC=0 CPNET_GPU_P2P=0) that data and signal land through the
 * proxy's landing agent, which needs room beside the grid: the test hangs
 * (and fails on its wait timeout) if the query leaves none. Then a grid one
 * block larger must be refused. Prints "fill: PE i of n: B blocks, 0 wrong: ok".
 */
#include <nvshmem.h>
#include <nvshmemx.h>
#include <cstdio>
#include <vector>

#define SLOT 1024 /* ints per block: 4 KiB */

__global__ void fill_kernel(int* src, int* dst, uint64_t* sig)
{
    const int me = nvshmem_my_pe(), n = nvshmem_n_pes(), b = blockIdx.x;
    const int next = (me + 1) % n;
    int* mine = src + (size_t)b * SLOT;
    for (int i = threadIdx.x; i < SLOT; i += blockDim.x) mine[i] = me * 1000000 + b * SLOT + i;
    __syncthreads();
    nvshmemx_putmem_signal_nbi_block(dst + (size_t)b * SLOT, mine, SLOT * sizeof(int), sig + b, 1,
                                     NVSHMEM_SIGNAL_SET, next);
    if (threadIdx.x == 0) nvshmem_signal_wait_until(sig + b, NVSHMEM_CMP_EQ, 1);
    __syncthreads();
}

int main()
{
    nvshmem_init();
    const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
    const dim3 block(256);
    int blocks = 0;
    if (nvshmemx_collective_launch_query_gridsize((const void*)fill_kernel, block, nullptr, 0, &blocks) !=
            NVSHMEMX_SUCCESS ||
        blocks < 1) {
        fprintf(stderr, "fill: PE %d: query_gridsize failed\n", me);
        return 1;
    }
    int* src = (int*)nvshmem_malloc((size_t)blocks * SLOT * sizeof(int));
    int* dst = (int*)nvshmem_malloc((size_t)blocks * SLOT * sizeof(int));
    uint64_t* sig = (uint64_t*)nvshmem_calloc(blocks, sizeof(uint64_t));
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    void* args[] = {&src, &dst, &sig};
    int bad = 0;
    if (nvshmemx_collective_launch((const void*)fill_kernel, dim3(blocks + 1), block, args, 0, s) !=
        NVSHMEMX_ERROR_INVALID_VALUE) {
        fprintf(stderr, "fill: PE %d: a grid of %d blocks (one over the query) was not refused\n", me, blocks + 1);
        ++bad;
    }
    if (nvshmemx_collective_launch((const void*)fill_kernel, dim3(blocks), block, args, 0, s) != NVSHMEMX_SUCCESS) {
        fprintf(stderr, "fill: PE %d: collective launch of %d blocks failed\n", me, blocks);
        return 1;
    }
    const cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        fprintf(stderr, "fill: PE %d: kernel: %s\n", me, cudaGetErrorString(e));
        return 1;
    }
    nvshmem_barrier_all();
    std::vector<int> h((size_t)blocks * SLOT);
    cudaMemcpy(h.data(), dst, h.size() * sizeof(int), cudaMemcpyDeviceToHost);
    const int prev = (me + n - 1) % n;
    for (size_t i = 0; i < h.size(); ++i) bad += h[i] != prev * 1000000 + (int)i;
    printf("fill: PE %d of %d: %d blocks, %d wrong: %s\n", me, n, blocks, bad, bad ? "FAILED" : "ok");
    nvshmem_free(sig);
    nvshmem_free(dst);
    nvshmem_free(src);
    nvshmem_finalize();
    return bad ? 1 : 0;
}
