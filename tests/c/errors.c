/* Bad input (OpenSHMEM routines return nothing: cpnet ends the program
 * with the routine's name and the reason, status 1). `errors CASE` runs
 * one case on every PE; scripts/test-c.sh checks the exit status and the
 * message for each. */
#include <string.h>
#include "check.h"

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "";
    if (!strcmp(c, "before-init")) {
        (void)shmem_my_pe();
        return 0;
    }
    if (!strcmp(c, "put-before-init")) {
        static int x;
        shmem_int_p(&x, 1, 0);
        return 0;
    }
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    long *sym = shmem_malloc(16 * sizeof(long));
    long priv[16] = {0};
    static long global;
    if (!strcmp(c, "bad-pe")) shmem_long_put(sym, priv, 16, n + 3);
    else if (!strcmp(c, "negative-pe")) (void)shmem_long_g(sym, -1);
    else if (!strcmp(c, "amo-bad-pe")) shmem_long_atomic_add(sym, 1, n);
    else if (!strcmp(c, "outside-heap")) shmem_long_put(priv, sym, 16, (me + 1) % n);
    else if (!strcmp(c, "global-dest")) shmem_long_p(&global, 1, (me + 1) % n);
    else if (!strcmp(c, "size-too-big")) {
        /* a range that starts in the heap and runs past its end: twice
         * the CPNET_HEAP_SIZE default (64 MiB; the heap is that plus the
         * runtime's team scratch), so it does not depend on where `sym`
         * landed */
        size_t heap = (size_t)64 << 20;
        shmem_getmem(priv, sym, 2 * heap, (me + 1) % n);
    } else if (!strcmp(c, "misaligned-amo")) shmem_long_atomic_add((long *)((char *)sym + 4), 1, 0);
    else if (!strcmp(c, "bad-free")) shmem_free(sym + 1);
    else if (!strcmp(c, "bad-cmp")) shmem_long_wait_until(sym, 99, 0);
    else if (!strcmp(c, "bad-team")) (void)shmem_team_sync((shmem_team_t)(uintptr_t)40);
    else if (!strcmp(c, "bad-ctx")) shmem_ctx_quiet((shmem_ctx_t)(uintptr_t)0x1234);
    else if (!strcmp(c, "wait-timeout")) shmem_long_wait_until(sym, SHMEM_CMP_EQ, 12345);
    else if (!strcmp(c, "global-exit")) {
        if (me == 0) shmem_global_exit(7);
        shmem_long_wait_until(sym, SHMEM_CMP_EQ, 12345); /* ended by PE 0's exit */
    } else {
        fprintf(stderr, "errors: unknown case '%s'\n", c);
        return 2;
    }
    fprintf(stderr, "errors: case '%s' returned instead of failing\n", c);
    return 3;
}
