/*
 * tests/cuda/warp.cu -- nvshmem.h's warp-scope calls (scripts/test-c.sh).
 *
 * 4 blocks x 4 warps per PE; warp k puts its 2000-int row (an odd byte count
 * after the first: 16-byte and byte copies both) to the next PE with
 * nvshmemx_int_put_warp, signals with nvshmemx_putmem_signal_warp (a
 * 24-byte tail and SET k + 1), the receiver's lane 0 waits for its signal;
 * then every warp gets the row back from the next PE with
 * nvshmemx_int_get_warp and compares. Prints "warp: PE i of n: 0 wrong: ok".
 */
#include <nvshmem.h>
#include <nvshmemx.h>
#include <cstdio>

#define BLOCKS 4
#define WARPS 4
#define ROW 2000
#define TAIL 6 /* ints: 24 bytes */

__global__ void warp_kernel(int* src, int* dst, int* tail_dst, uint64_t* sig, int* back, int* wrong)
{
    const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    const int w = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    int* mine = src + (size_t)w * (ROW + TAIL);
    for (int i = lane; i < ROW + TAIL; i += 32) mine[i] = me * 10000000 + w * 10000 + i;
    __syncwarp();
    nvshmemx_int_put_warp(dst + (size_t)w * ROW, mine, ROW, next);
    nvshmemx_putmem_signal_warp(tail_dst + (size_t)w * TAIL, mine + ROW, TAIL * sizeof(int), sig + w, (uint64_t)w + 1,
                                NVSHMEM_SIGNAL_SET, next);
    if (lane == 0) nvshmem_signal_wait_until(sig + w, NVSHMEM_CMP_EQ, (uint64_t)w + 1);
    __syncwarp();
    /* What the previous PE put here. */
    for (int i = lane; i < ROW; i += 32)
        if (dst[(size_t)w * ROW + i] != prev * 10000000 + w * 10000 + i) atomicAdd(wrong, 1);
    for (int i = lane; i < TAIL; i += 32)
        if (tail_dst[(size_t)w * TAIL + i] != prev * 10000000 + w * 10000 + ROW + i) atomicAdd(wrong, 1);
    /* And back: the next PE's copy of this row (an odd count: byte copies). */
    nvshmemx_int_get_nbi_warp(back + (size_t)w * ROW, dst + (size_t)w * ROW, ROW - 1, next);
    for (int i = lane; i < ROW - 1; i += 32)
        if (back[(size_t)w * ROW + i] != me * 10000000 + w * 10000 + i) atomicAdd(wrong, 1);
}

int main()
{
    nvshmem_init();
    const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
    const int rows = BLOCKS * WARPS;
    int* src = (int*)nvshmem_malloc((size_t)rows * (ROW + TAIL) * sizeof(int));
    int* dst = (int*)nvshmem_malloc((size_t)rows * ROW * sizeof(int));
    int* tail = (int*)nvshmem_malloc((size_t)rows * TAIL * sizeof(int));
    uint64_t* sig = (uint64_t*)nvshmem_calloc(rows, sizeof(uint64_t));
    int* back = (int*)nvshmem_malloc((size_t)rows * ROW * sizeof(int));
    int* wrong;
    cudaMalloc(&wrong, sizeof(int));
    cudaMemset(wrong, 0, sizeof(int));
    nvshmem_barrier_all();
    warp_kernel<<<BLOCKS, WARPS * 32>>>(src, dst, tail, sig, back, wrong);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "warp: PE %d: the kernel failed: %s\n", me, cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    nvshmem_sync_all();
    int bad = 0;
    cudaMemcpy(&bad, wrong, sizeof(int), cudaMemcpyDeviceToHost);
    printf("warp: PE %d of %d: %d wrong: %s\n", me, n, bad, bad ? "FAILED" : "ok");
    nvshmem_finalize();
    return bad ? 1 : 0;
}
