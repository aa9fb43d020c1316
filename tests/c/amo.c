/* AMOs (OpenSHMEM 1.5 §9.7): every PE hits PE 0's words with fetch_add,
 * add, inc, fetch_inc, and/or/xor with their fetch forms, swap,
 * compare_swap, set and fetch, on int, long, unsigned long long, int32_t,
 * uint64_t, float and double; the results are checked exactly. */
#include "check.h"

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    long *counter = shmem_calloc(1, sizeof(long));
    int *icount = shmem_calloc(1, sizeof(int));
    unsigned long long *bits = shmem_calloc(3, sizeof(unsigned long long));
    int32_t *cas = shmem_calloc(1, sizeof(int32_t));
    uint64_t *sw = shmem_calloc(1, sizeof(uint64_t));
    double *dd = shmem_calloc(1, sizeof(double));
    float *ff = shmem_calloc(1, sizeof(float));

    /* 100 fetch_adds of (me+1) each and 50 incs from every PE */
    long seen_max = -1;
    for (int i = 0; i < 100; i++) {
        long old = shmem_long_atomic_fetch_add(counter, me + 1, 0);
        CHECK(old >= 0 && old < 100L * n * (n + 1) / 2 + 1);
        if (old > seen_max) seen_max = old;
    }
    for (int i = 0; i < 50; i++) shmem_int_atomic_inc(icount, 0);
    for (int i = 0; i < 50; i++) shmem_atomic_add(icount, 2, 0); /* generic */
    int prev = shmem_int_atomic_fetch_inc(icount, 0);
    CHECK(prev >= 0);
    shmem_barrier_all();
    if (me == 0) {
        CHECK_EQ(*counter, 100L * n * (n + 1) / 2);
        CHECK_EQ(*icount, n * (50 + 100 + 1));
    }
    CHECK_EQ(shmem_long_atomic_fetch(counter, 0), 100L * n * (n + 1) / 2);
    CHECK_EQ(shmem_atomic_fetch(icount, 0), n * 151);

    /* bitwise: each PE sets bit me in word 0 (or), flips bit me in word 1 twice
     * (xor), clears bit me in word 2 (and), starting from all ones */
    if (me == 0) bits[2] = ~0ull;
    shmem_barrier_all();
    unsigned long long before = shmem_ulonglong_atomic_fetch_or(&bits[0], 1ull << me, 0);
    CHECK_EQ(before & (1ull << me), 0);
    shmem_ulonglong_atomic_xor(&bits[1], 1ull << me, 0);
    shmem_atomic_xor(&bits[1], 1ull << me, 0);
    shmem_ulonglong_atomic_xor(&bits[1], 1ull << (me + 32), 0);
    shmem_ulonglong_atomic_and(&bits[2], ~(1ull << me), 0);
    unsigned long long fx = shmem_ulonglong_atomic_fetch_xor(&bits[1], 0, 0);
    CHECK_EQ(fx & (1ull << me), 0);
    unsigned long long fa = shmem_atomic_fetch_and(&bits[2], ~0ull, 0);
    CHECK_EQ(fa & (1ull << me), 0);
    shmem_barrier_all();
    unsigned long long all = (n == 64) ? ~0ull : ((1ull << n) - 1);
    if (me == 0) {
        CHECK_EQ(bits[0], all);
        CHECK_EQ(bits[1], all << 32);
        CHECK_EQ(bits[2], ~all);
    }

    /* compare_swap: a ticket each PE takes by CAS loop; every value 0..n-1 taken once */
    int32_t mine = -1;
    for (;;) {
        int32_t cur = shmem_int32_atomic_fetch(cas, 0);
        if (shmem_int32_atomic_compare_swap(cas, cur, cur + 1, 0) == cur) {
            mine = cur;
            break;
        }
    }
    int32_t *tickets = shmem_calloc(n, sizeof(int32_t));
    shmem_int32_p(&tickets[mine], 1, 0);
    shmem_barrier_all();
    if (me == 0)
        for (int i = 0; i < n; i++) CHECK_EQ(tickets[i], 1);
    CHECK_EQ(shmem_int32_atomic_fetch(cas, 0), n);
    /* a failing compare_swap leaves the word alone */
    CHECK_EQ(shmem_int32_atomic_compare_swap(cas, -5, 99, 0), n);
    shmem_barrier_all();

    /* swap: the values form a chain; set and fetch */
    if (me == 0) *sw = 1000;
    shmem_barrier_all();
    uint64_t got = shmem_uint64_atomic_swap(sw, (uint64_t)me, 0);
    CHECK(got == 1000 || got < (uint64_t)n);
    shmem_barrier_all();
    shmem_uint64_atomic_set(sw, 77, (me + 1) % n);
    shmem_barrier_all();
    CHECK_EQ(*sw, 77);

    /* extended: double and float set / swap / fetch */
    shmem_double_atomic_set(dd, 2.5 * (me + 1), me);
    shmem_quiet();
    CHECK(shmem_double_atomic_fetch(dd, me) == 2.5 * (me + 1));
    CHECK(shmem_atomic_swap(dd, -1.0, me) == 2.5 * (me + 1));
    CHECK(*dd == -1.0);
    shmem_float_atomic_set(ff, 0.25f, (me + 1) % n);
    shmem_barrier_all();
    CHECK(*ff == 0.25f);
    CHECK(shmem_float_atomic_swap(ff, 4.0f, me) == 0.25f);

    /* nbi fetch forms */
    long f1;
    shmem_long_atomic_fetch_nbi(&f1, counter, 0);
    shmem_quiet();
    CHECK_EQ(f1, 100L * n * (n + 1) / 2);
    shmem_barrier_all();
    long f2 = -1, f3 = -1;
    shmem_atomic_fetch_add_nbi(&f2, counter, 5L, 0); /* generic */
    shmem_atomic_compare_swap_nbi(SHMEM_CTX_DEFAULT, &f3, counter, -7L, 0L, 0); /* generic, with a context */
    shmem_quiet();
    CHECK(f2 >= 100L * n * (n + 1) / 2 && f2 < 100L * n * (n + 1) / 2 + 5L * n);
    CHECK(f3 >= 100L * n * (n + 1) / 2);

    shmem_barrier_all();
    PASS("amo");
    shmem_finalize();
    return 0;
}
