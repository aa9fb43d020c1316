/*
 * tests/cuda/amo.cu -- nvshmem.h's thread-scope AMOs under contention
 * (scripts/test-c.sh).
 *
 * Every thread of 8 blocks x 128 on every PE works on the words of the next
 * PE (its heap mapped by peer stores, the default on one host):
 *  - int fetch_add and long fetch_inc on one counter each: the counters end
 *    at n * 1024 (and the fetched values, sorted, are 0 .. n*1024-1 for the
 *    fetch_add: checked as a sum);
 *  - uint64 fetch_or of its own bit of a 64-word bitmap: every bit set once,
 *    and no fetch saw its own bit already set;
 *  - int compare_swap claiming slots of a table: each slot claimed once;
 *  - uint32 xor of a pattern an even number of times: back to 0;
 *  - double swap and fetch, float set.
 * Then every PE checks the words it owns. Prints "amo: PE i of n: 0 wrong: ok".
 */
#include <nvshmem.h>
#include <nvshmemx.h>
#include <cstdio>
#include <vector>

#define BLOCKS 8
#define THREADS 128
#define SLOTS 256

struct words {
    int add;               /* fetch_add target */
    long inc;              /* fetch_inc target */
    unsigned int xr;       /* xor target */
    float fl;              /* set target */
    double db;             /* swap target */
    uint64_t bits[BLOCKS * THREADS / 64 * 8]; /* one bit per (PE-local) thread and PE: n <= 8 */
    int slots[SLOTS];      /* compare_swap targets: -1 until claimed */
};

__global__ void amo_kernel(words* w, unsigned long long* fetched_sum, int* own_bit_seen, int* claims)
{
    const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
    const int next = (me + 1) % n;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int old = nvshmem_int_atomic_fetch_add(&w->add, 1, next);
    atomicAdd(fetched_sum, (unsigned long long)old);
    nvshmem_long_atomic_fetch_inc(&w->inc, next);
    const int bit = me * BLOCKS * THREADS + t;
    const uint64_t mask = 1ull << (bit % 64);
    if (nvshmem_uint64_atomic_fetch_or(&w->bits[bit / 64], mask, next) & mask) atomicAdd(own_bit_seen, 1);
    nvshmem_uint32_atomic_xor(&w->xr, 0x5a5a5a5au, next);
    nvshmem_uint32_atomic_xor(&w->xr, 0x5a5a5a5au, next);
    if (t < SLOTS && nvshmem_int_atomic_compare_swap(&w->slots[t], -1, me, next) == -1) atomicAdd(claims, 1);
    if (t == 0) {
        nvshmem_float_atomic_set(&w->fl, 1.5f, next);
        nvshmem_double_atomic_swap(&w->db, 2.25, next);
        (void)nvshmem_double_atomic_fetch(&w->db, next);
    }
}

int main()
{
    nvshmem_init();
    const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
    if (n > 8) {
        fprintf(stderr, "amo: at most 8 PEs\n");
        return 1;
    }
    words* w = (words*)nvshmem_malloc(sizeof(words));
    words init = {};
    for (int i = 0; i < SLOTS; ++i) init.slots[i] = -1;
    cudaMemcpy(w, &init, sizeof(words), cudaMemcpyHostToDevice);
    unsigned long long* sum;
    int *own, *claims;
    cudaMalloc(&sum, sizeof(*sum));
    cudaMalloc(&own, sizeof(*own));
    cudaMalloc(&claims, sizeof(*claims));
    cudaMemset(sum, 0, sizeof(*sum));
    cudaMemset(own, 0, sizeof(*own));
    cudaMemset(claims, 0, sizeof(*claims));
    nvshmem_barrier_all();
    amo_kernel<<<BLOCKS, THREADS>>>(w, sum, own, claims);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        fprintf(stderr, "amo: PE %d: the kernel failed: %s\n", me, cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    nvshmem_barrier_all();
    words got;
    unsigned long long fetched = 0;
    int own_seen = 0, claimed = 0;
    cudaMemcpy(&got, w, sizeof(words), cudaMemcpyDeviceToHost);
    cudaMemcpy(&fetched, sum, sizeof(fetched), cudaMemcpyDeviceToHost);
    cudaMemcpy(&own_seen, own, sizeof(own_seen), cudaMemcpyDeviceToHost);
    cudaMemcpy(&claimed, claims, sizeof(claimed), cudaMemcpyDeviceToHost);
    const int per = BLOCKS * THREADS;
    int wrong = 0;
    auto bad = [&](const char* what, long long g, long long want) {
        if (g != want) {
            fprintf(stderr, "amo: PE %d: %s: %lld, expected %lld\n", me, what, g, want);
            ++wrong;
        }
    };
    /* With n PEs in a ring each PE's words get exactly one PE's traffic. */
    bad("int fetch_add counter", got.add, per);
    bad("long fetch_inc counter", got.inc, per);
    bad("sum of the values fetch_add returned (at the previous PE)", (long long)fetched, (long long)per * (per - 1) / 2);
    bad("fetch_or that saw its own bit set", own_seen, 0);
    const int prev = (me + n - 1) % n;
    for (int b = 0; b < per; ++b) {
        const int bit = prev * per + b;
        if (!((got.bits[bit / 64] >> (bit % 64)) & 1)) {
            fprintf(stderr, "amo: PE %d: bit %d of PE %d not set\n", me, bit, prev);
            ++wrong;
            break;
        }
    }
    bad("uint32 after an even number of xors", got.xr, 0);
    bad("compare_swap claims made (at the previous PE)", claimed, SLOTS);
    for (int i = 0; i < SLOTS; ++i)
        if (got.slots[i] != prev) {
            bad("a claimed slot's owner", got.slots[i], prev);
            break;
        }
    bad("float set (x2)", (long long)(got.fl * 2), 3);
    bad("double swap (x4)", (long long)(got.db * 4), 9);
    printf("amo: PE %d of %d: %d wrong: %s\n", me, n, wrong, wrong ? "FAILED" : "ok");
    nvshmem_free(w);
    nvshmem_finalize();
    return wrong ? 1 : 0;
}
