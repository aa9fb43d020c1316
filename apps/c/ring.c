/* ring.c: a first OpenSHMEM program on cpnet (CPU PEs).
 *
 *   1. ring put: a token of 1024 longs travels around the ring of PEs
 *      `laps` times; each PE adds its number to every element before it
 *      passes it on with shmem_long_put_signal (data, then the signal),
 *      and waits for it with shmem_signal_wait_until;
 *   2. atomics: every PE takes 1000 tickets from a counter on PE 0 with
 *      shmem_long_atomic_fetch_add; the tickets are all distinct;
 *   3. a reduction: shmem_double_sum_reduce of every PE's partial sum.
 *
 * Every result is checked; the program exits 1 on a wrong value.
 *   oshcc -O2 ring.c -o ring && oshrun -np 4 ./ring [laps]
 */
#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>

#define LEN 1024

int main(int argc, char **argv) {
    int laps = argc > 1 ? atoi(argv[1]) : 10;
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    long *token = shmem_calloc(LEN, sizeof(long));
    uint64_t *arrived = shmem_calloc(1, sizeof(uint64_t));
    long *counter = shmem_calloc(1, sizeof(long));
    double *partial = shmem_malloc(sizeof(double)), *total = shmem_malloc(sizeof(double));
    int bad = 0;

    /* 1. the ring: PE 0 starts each lap; hop h of the run carries signal h+1 */
    long local[LEN];
    for (int lap = 0; lap < laps; lap++) {
        uint64_t hop = (uint64_t)lap * n + me; /* hops before this PE's turn */
        if (hop > 0) shmem_signal_wait_until(arrived, SHMEM_CMP_GE, hop);
        for (int i = 0; i < LEN; i++) local[i] = token[i] + me;
        shmem_long_put_signal(token, local, LEN, arrived, hop + 1, SHMEM_SIGNAL_SET, (me + 1) % n);
    }
    if (me == 0) {
        shmem_signal_wait_until(arrived, SHMEM_CMP_GE, (uint64_t)laps * n);
        long want = (long)laps * n * (n - 1) / 2;
        for (int i = 0; i < LEN; i++)
            if (token[i] != want) {
                fprintf(stderr, "ring: token[%d] = %ld, expected %ld\n", i, token[i], want);
                bad = 1;
                break;
            }
        printf("ring: %d laps of %d PEs, %d longs: every element is %ld (expected %ld)\n", laps, n, LEN, token[0], want);
    }
    shmem_barrier_all();

    /* 2. atomics: 1000 distinct tickets per PE */
    long lo = -1, hi = -1;
    for (int i = 0; i < 1000; i++) {
        long t = shmem_long_atomic_fetch_add(counter, 1, 0);
        if (lo < 0) lo = t;
        if (t <= hi) bad = 1;
        hi = t;
    }
    shmem_barrier_all();
    long count = shmem_long_atomic_fetch(counter, 0);
    if (count != 1000L * n) {
        fprintf(stderr, "ring: counter = %ld, expected %ld\n", count, 1000L * n);
        bad = 1;
    }

    /* 3. a reduction: sum of 1/(k(k+1)) over k = 1..1000n, split by PE */
    *partial = 0;
    for (long k = 1 + 1000L * me; k <= 1000L * (me + 1); k++) *partial += 1.0 / ((double)k * (k + 1));
    shmem_double_sum_reduce(SHMEM_TEAM_WORLD, total, partial, 1);
    double want = 1.0 - 1.0 / (1000.0 * n + 1);
    if (*total < want - 1e-12 || *total > want + 1e-12) {
        fprintf(stderr, "ring: sum = %.15f, expected %.15f\n", *total, want);
        bad = 1;
    }
    if (me == 0) printf("ring: %ld tickets taken, sum_reduce = %.12f (expected %.12f)\n", count, *total, want);

    shmem_barrier_all();
    shmem_finalize();
    return bad;
}
