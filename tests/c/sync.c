/* Point-to-point synchronization and signals (OpenSHMEM 1.5 §9.8,
 * §9.10): wait_until on each comparison, wait_until_all/any/some and
 * their vector forms, test and test_all/any/some, put_signal with SET and
 * ADD (the data is there when the signal is), signal_fetch,
 * signal_wait_until, fence ordering, barrier/sync_all. */
#include <string.h>
#include "check.h"

#define N 8

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    int right = (me + 1) % n, left = (me + n - 1) % n;
    int *flags = shmem_calloc(N, sizeof(int));
    long *data = shmem_calloc(1024, sizeof(long));
    uint64_t *sig = shmem_calloc(2, sizeof(uint64_t));
    unsigned short *us = shmem_calloc(1, sizeof(unsigned short));

    /* test on a fresh variable is false, wait_until after a put is true */
    CHECK_EQ(shmem_int_test(&flags[0], SHMEM_CMP_EQ, 5), 0);
    CHECK_EQ(shmem_test(&flags[0], SHMEM_CMP_EQ, 0), 1);
    shmem_barrier_all();
    shmem_int_p(&flags[0], 5, right);
    shmem_int_wait_until(&flags[0], SHMEM_CMP_EQ, 5);
    shmem_int_wait_until(&flags[0], SHMEM_CMP_GE, 5);
    shmem_int_wait_until(&flags[0], SHMEM_CMP_GT, 4);
    shmem_int_wait_until(&flags[0], SHMEM_CMP_LE, 5);
    shmem_int_wait_until(&flags[0], SHMEM_CMP_LT, 6);
    shmem_wait_until(&flags[0], SHMEM_CMP_NE, 0);
    shmem_ushort_p(us, (unsigned short)60000, right);
    shmem_ushort_wait_until(us, SHMEM_CMP_GT, 59999);
    CHECK_EQ(*us, 60000);

    /* left neighbour sets flags 1..N-1 to their index; wait_until_all and vector */
    shmem_barrier_all();
    for (int i = 1; i < N; i++) shmem_int_atomic_set(&flags[i], i, right);
    int status[N] = {1, 0, 0, 0, 0, 0, 0, 0}; /* skip flag 0 */
    shmem_int_wait_until_all(flags, N, status, SHMEM_CMP_GT, 0);
    int want[N] = {5, 1, 2, 3, 4, 5, 6, 7}; /* flag 0 is still 5 */
    shmem_int_wait_until_all_vector(flags, N, NULL, SHMEM_CMP_EQ, want);
    CHECK_EQ(shmem_int_test_all(flags, N, status, SHMEM_CMP_GT, 0), 1);
    CHECK_EQ(shmem_int_test_all(flags, N, NULL, SHMEM_CMP_GT, 1), 0);
    /* any: only flag 3 equals 3 */
    size_t idx = shmem_int_wait_until_any(flags, N, NULL, SHMEM_CMP_EQ, 3);
    CHECK_EQ(idx, 3);
    CHECK_EQ(shmem_int_test_any(flags, N, NULL, SHMEM_CMP_EQ, 42), SIZE_MAX);
    int skip_all[N] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_EQ(shmem_int_wait_until_any(flags, N, skip_all, SHMEM_CMP_EQ, 3), SIZE_MAX);
    /* some: flags >= 6 are 6 and 7 */
    size_t ids[N];
    size_t k = shmem_int_wait_until_some(flags, N, ids, NULL, SHMEM_CMP_GE, 6);
    CHECK_EQ(k, 2);
    CHECK_EQ(ids[0], 6);
    CHECK_EQ(ids[1], 7);
    int vals[N] = {0, 0, 2, 0, 4, 0, 0, 0};
    k = shmem_int_test_some_vector(flags, N, ids, NULL, SHMEM_CMP_EQ, vals);
    CHECK_EQ(k, 2);
    CHECK_EQ(ids[0], 2);
    CHECK_EQ(ids[1], 4);
    CHECK_EQ(shmem_int_wait_until_any_vector(flags, N, NULL, SHMEM_CMP_EQ, vals), 2);

    /* put_signal SET: 1024 longs then the signal; the data must be complete when it is seen */
    shmem_barrier_all();
    long buf[1024];
    for (int round = 1; round <= 3; round++) {
        for (int i = 0; i < 1024; i++) buf[i] = 1000000L * round + 1000L * me + i;
        shmem_long_put_signal(data, buf, 1024, &sig[0], (uint64_t)round, SHMEM_SIGNAL_SET, right);
        uint64_t s = shmem_signal_wait_until(&sig[0], SHMEM_CMP_EQ, (uint64_t)round);
        CHECK_EQ(s, round);
        for (int i = 0; i < 1024; i++) CHECK_EQ(data[i], 1000000L * round + 1000L * left + i);
        shmem_barrier_all(); /* the neighbour has read before the next round overwrites */
    }
    /* a large put_signal (past the staging area) from symmetric memory: the
     * source is reused as soon as the call returns */
    const int BIGN = 100000; /* 800 KB */
    long *bsrc = shmem_malloc(BIGN * sizeof(long)), *bdst = shmem_malloc(BIGN * sizeof(long));
    for (int i = 0; i < BIGN; i++) bsrc[i] = 7L * i + me;
    shmem_barrier_all();
    shmem_long_put_signal(bdst, bsrc, BIGN, &sig[0], 99, SHMEM_SIGNAL_SET, right);
    for (int i = 0; i < BIGN; i++) bsrc[i] = -1;
    shmem_signal_wait_until(&sig[0], SHMEM_CMP_EQ, 99);
    for (int i = 0; i < BIGN; i++) CHECK_EQ(bdst[i], 7L * i + left);
    shmem_barrier_all();

    /* put_signal ADD from every PE into PE 0's sig[1]: n adds of (me+1) */
    long one = me;
    shmem_putmem_signal_nbi(&data[me], &one, sizeof(long), &sig[1], (uint64_t)(me + 1), SHMEM_SIGNAL_ADD, 0);
    if (me == 0) {
        shmem_signal_wait_until(&sig[1], SHMEM_CMP_EQ, (uint64_t)n * (n + 1) / 2);
        for (int i = 0; i < n; i++) CHECK_EQ(data[i], i);
        CHECK_EQ(shmem_signal_fetch(&sig[1]), (uint64_t)n * (n + 1) / 2);
    }
    shmem_barrier_all();

    /* fence: a put then a flag; the flag never arrives before the data */
    for (int round = 0; round < 20; round++) {
        long v = 5000 + round;
        shmem_long_put(&data[100], &v, 1, right);
        shmem_fence();
        shmem_int_p(&flags[0], 100 + round, right);
        shmem_int_wait_until(&flags[0], SHMEM_CMP_EQ, 100 + round);
        CHECK_EQ(data[100], 5000 + round);
        shmem_sync_all();
    }

    shmem_barrier_all();
    PASS("sync");
    shmem_finalize();
    return 0;
}
