/* Contexts, threads and locks (OpenSHMEM 1.5 §9.2, §9.5, §9.12): with
 * SHMEM_THREAD_MULTIPLE, 4 threads per PE each create a context and put
 * their slice to the right neighbour, quiet their own context; 4 more
 * threads share the default context; a lock-protected read-modify-write
 * counter on PE 0 (get, add, put under shmem_set_lock) ends exact;
 * test_lock reports a held lock. */
#include <pthread.h>
#include "check.h"

#define THREADS 4
#define SLICE 512

static long *dst;
static long *lock;
static long *counter;
static int me, n;

static void *ctx_worker(void *arg) {
    int t = (int)(intptr_t)arg;
    shmem_ctx_t ctx;
    CHECK_EQ(shmem_ctx_create(SHMEM_CTX_PRIVATE, &ctx), 0);
    long buf[SLICE];
    for (int i = 0; i < SLICE; i++) buf[i] = 1000000L * me + 1000L * t + i;
    shmem_ctx_long_put_nbi(ctx, dst + t * SLICE, buf, SLICE, (me + 1) % n);
    shmem_ctx_long_put(ctx, dst + THREADS * SLICE + t, &buf[0], 1, (me + 1) % n);
    shmem_ctx_quiet(ctx);
    shmem_ctx_destroy(ctx);
    return NULL;
}

static void *default_worker(void *arg) {
    int t = (int)(intptr_t)arg;
    for (int i = 0; i < 100; i++) shmem_long_atomic_inc(&counter[1 + t], 0);
    return NULL;
}

static void *lock_worker(void *arg) {
    (void)arg;
    for (int i = 0; i < 10; i++) {
        shmem_set_lock(lock);
        long v = shmem_long_g(&counter[0], 0);
        shmem_long_p(&counter[0], v + 1, 0);
        shmem_clear_lock(lock);
    }
    return NULL;
}

int main(void) {
    int provided = -1;
    CHECK_EQ(shmem_init_thread(SHMEM_THREAD_MULTIPLE, &provided), 0);
    CHECK_EQ(provided, SHMEM_THREAD_MULTIPLE);
    shmem_query_thread(&provided);
    CHECK_EQ(provided, SHMEM_THREAD_MULTIPLE);
    me = shmem_my_pe();
    n = shmem_n_pes();
    dst = shmem_calloc(THREADS * SLICE + THREADS, sizeof(long));
    lock = shmem_calloc(1, sizeof(long));
    counter = shmem_calloc(1 + THREADS, sizeof(long));

    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, ctx_worker, (void *)(intptr_t)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    shmem_barrier_all();
    int left = (me + n - 1) % n;
    for (int t = 0; t < THREADS; t++) {
        for (int i = 0; i < SLICE; i++) CHECK_EQ(dst[t * SLICE + i], 1000000L * left + 1000L * t + i);
        CHECK_EQ(dst[THREADS * SLICE + t], 1000000L * left + 1000L * t);
    }

    for (int t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, default_worker, (void *)(intptr_t)t);
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    shmem_barrier_all();
    if (me == 0)
        for (int t = 0; t < THREADS; t++) CHECK_EQ(counter[1 + t], 100L * n);

    /* locks: a non-atomic increment (get, then put) is exact under the lock */
    for (int t = 0; t < 2; t++) pthread_create(&th[t], NULL, lock_worker, NULL);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    shmem_barrier_all();
    CHECK_EQ(shmem_long_g(&counter[0], 0), 20L * n);
    /* test_lock: PE 0 takes it, the others find it held */
    if (me == 0) CHECK_EQ(shmem_test_lock(lock), 0);
    shmem_barrier_all();
    if (me != 0) CHECK_EQ(shmem_test_lock(lock), 1);
    shmem_barrier_all();
    if (me == 0) shmem_clear_lock(lock);
    shmem_barrier_all();

    /* a context made and freed again and again reuses its queue */
    for (int i = 0; i < 50; i++) {
        shmem_ctx_t c;
        CHECK_EQ(shmem_ctx_create(0, &c), 0);
        shmem_ctx_int_p(c, (int *)&dst[0], i, me);
        shmem_ctx_destroy(c);
        CHECK_EQ(*(int *)&dst[0], i);
    }
    shmem_barrier_all();
    PASS("ctx");
    shmem_finalize();
    return 0;
}
