/* check.h: the assertion the C tests use: prints the PE, the file, the
 * line, the expression and the values, then exits 1 (the job fails). */
#ifndef CPNET_TEST_CHECK_H
#define CPNET_TEST_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <shmem.h>

#define CHECK_EQ(got, want)                                                                          \
    do {                                                                                             \
        long long g_ = (long long)(got), w_ = (long long)(want);                                     \
        if (g_ != w_) {                                                                              \
            fprintf(stderr, "FAIL PE %d %s:%d: %s == %lld, expected %s == %lld\n", shmem_my_pe(),  \
                    __FILE__, __LINE__, #got, g_, #want, w_);                                        \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "FAIL PE %d %s:%d: %s\n", shmem_my_pe(), __FILE__, __LINE__, #cond);    \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

/* Print "<test>: PE x of n ok" once per PE at the end. */
#define PASS(name) printf("%s: PE %d of %d ok\n", name, shmem_my_pe(), shmem_n_pes())
#endif
