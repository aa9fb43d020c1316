/* Memory management and library queries (OpenSHMEM 1.5 §9.1, §9.3):
 * malloc alignment and symmetry, calloc zeroes, align to 4 KiB, realloc
 * keeps the contents and stays symmetric (a put into the new block lands),
 * malloc(0) and an allocation larger than the heap return NULL, free(NULL)
 * does nothing, freed space is reused; version and name. */
#include <string.h>
#include "check.h"

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    int major = 0, minor = 0;
    char name[SHMEM_MAX_NAME_LEN];
    shmem_info_get_version(&major, &minor);
    shmem_info_get_name(name);
    CHECK_EQ(major, 1);
    CHECK_EQ(minor, 5);
    CHECK(strncmp(name, "cpnet", 5) == 0);

    char *a = shmem_malloc(100);
    CHECK(a != NULL);
    CHECK_EQ((uintptr_t)a % 64, 0);
    int *z = shmem_calloc(1000, sizeof(int));
    for (int i = 0; i < 1000; i++) CHECK_EQ(z[i], 0);
    void *al = shmem_align(4096, 10);
    CHECK(al != NULL);
    CHECK_EQ((uintptr_t)al % 4096, 0);
    CHECK(shmem_malloc(0) == NULL);
    CHECK(shmem_malloc((size_t)1 << 40) == NULL); /* larger than the heap */
    shmem_free(NULL);

    /* realloc keeps the first 100 bytes and the new block is symmetric */
    for (int i = 0; i < 100; i++) a[i] = (char)(i + me);
    char *b = shmem_realloc(a, 5000);
    CHECK(b != NULL);
    for (int i = 0; i < 100; i++) CHECK_EQ(b[i], (char)(i + me));
    shmem_barrier_all();
    shmem_char_p(&b[4999], (char)(40 + me), (me + 1) % n);
    shmem_barrier_all();
    CHECK_EQ(b[4999], (char)(40 + (me + n - 1) % n));
    CHECK(shmem_realloc(b, 0) == NULL);

    /* free, then the same size again reuses the space (first fit) */
    void *c = shmem_malloc(1 << 16);
    shmem_free(c);
    void *d = shmem_malloc(1 << 16);
    CHECK(c == d);
    shmem_free(d);
    shmem_free(al);
    shmem_free(z);
    shmem_barrier_all();
    PASS("mem");
    shmem_finalize();
    return 0;
}
