/* RMA (OpenSHMEM 1.5 §9.6): typed and sized put/get/p/g, blocking and
 * _nbi, putmem/getmem, iput/iget, from and to private and symmetric
 * memory, sizes from 1 byte to past the staging area (1 MiB). Every PE
 * writes to its right neighbour and reads from its left one; values are
 * checked element by element. */
#include <string.h>
#include "check.h"

#define BIG (1 << 20)

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();
    int right = (me + 1) % n, left = (me + n - 1) % n;

    /* typed put from a private array, blocking */
    long *lsym = shmem_malloc(16 * sizeof(long));
    long lpriv[16];
    for (int i = 0; i < 16; i++) lpriv[i] = 1000L * me + i;
    shmem_long_put(lsym, lpriv, 16, right);
    shmem_barrier_all();
    for (int i = 0; i < 16; i++) CHECK_EQ(lsym[i], 1000L * left + i);

    /* generic put/get (C11 _Generic), double */
    double *dsym = shmem_malloc(8 * sizeof(double));
    double dpriv[8], dback[8];
    for (int i = 0; i < 8; i++) dpriv[i] = me + i * 0.5;
    shmem_put(dsym, dpriv, 8, right);
    shmem_barrier_all();
    for (int i = 0; i < 8; i++) CHECK(dsym[i] == left + i * 0.5);
    shmem_get(dback, dsym, 8, right);
    for (int i = 0; i < 8; i++) CHECK(dback[i] == me + i * 0.5);

    /* p and g of every width */
    char *c = shmem_malloc(1);
    short *s = shmem_malloc(sizeof(short));
    int *x = shmem_malloc(sizeof(int));
    long long *ll = shmem_malloc(sizeof(long long));
    float *f = shmem_malloc(sizeof(float));
    shmem_char_p(c, (char)('a' + me), right);
    shmem_short_p(s, (short)(-100 - me), right);
    shmem_int_p(x, 7 * me + 1, right);
    shmem_longlong_p(ll, (1LL << 40) + me, right);
    shmem_float_p(f, 1.5f * me, right);
    shmem_barrier_all();
    CHECK_EQ(*c, 'a' + left);
    CHECK_EQ(*s, -100 - left);
    CHECK_EQ(*x, 7 * left + 1);
    CHECK_EQ(*ll, (1LL << 40) + left);
    CHECK(*f == 1.5f * left);
    CHECK_EQ(shmem_int_g(x, left), 7 * ((left + n - 1) % n) + 1);
    CHECK_EQ(shmem_g(ll, right), (1LL << 40) + me);
    CHECK_EQ(shmem_short_g(s, me), -100 - left);

    /* large putmem (several staging rounds) and getmem, private buffers */
    unsigned char *big = shmem_malloc(BIG);
    unsigned char *priv = malloc(BIG), *back = malloc(BIG);
    for (int i = 0; i < BIG; i++) priv[i] = (unsigned char)(i * 7 + me);
    shmem_putmem(big, priv, BIG, right);
    shmem_barrier_all();
    for (int i = 0; i < BIG; i++) CHECK_EQ(big[i], (unsigned char)(i * 7 + left));
    memset(back, 0, BIG);
    shmem_getmem(back, big, BIG, right);
    for (int i = 0; i < BIG; i++) CHECK_EQ(back[i], (unsigned char)(i * 7 + me));
    shmem_barrier_all();

    /* _nbi puts from a symmetric source, completed by quiet, then a get_nbi */
    int *src = shmem_malloc(1024 * sizeof(int));
    int *dst = shmem_malloc(1024 * sizeof(int));
    for (int i = 0; i < 1024; i++) src[i] = me * 100000 + i;
    shmem_barrier_all();
    for (int k = 0; k < 4; k++) shmem_int_put_nbi(dst + 256 * k, src + 256 * k, 256, right);
    shmem_quiet();
    shmem_barrier_all();
    for (int i = 0; i < 1024; i++) CHECK_EQ(dst[i], left * 100000 + i);
    int *gdst = shmem_malloc(1024 * sizeof(int));
    shmem_int_get_nbi(gdst, src, 1024, left);
    shmem_quiet();
    for (int i = 0; i < 1024; i++) CHECK_EQ(gdst[i], left * 100000 + i);

    /* sized put32/get64 */
    uint32_t *u32 = shmem_malloc(4 * sizeof(uint32_t));
    uint32_t u32p[4] = {1u + me, 2u + me, 3u + me, 0xffffffffu - me};
    shmem_put32(u32, u32p, 4, right);
    shmem_barrier_all();
    CHECK_EQ(u32[0], 1u + left);
    CHECK_EQ(u32[3], 0xffffffffu - left);
    uint64_t *u64 = shmem_malloc(2 * sizeof(uint64_t));
    u64[0] = 0x1122334455667788ull + me;
    u64[1] = me;
    shmem_barrier_all();
    uint64_t u64b[2];
    shmem_get64(u64b, u64, 2, left);
    CHECK_EQ(u64b[0], 0x1122334455667788ull + left);
    CHECK_EQ(u64b[1], left);

    /* strided: every other element of a private array to every third of dest */
    long *strided = shmem_calloc(30, sizeof(long));
    long sp[20];
    for (int i = 0; i < 20; i++) sp[i] = 10 * me + i;
    shmem_long_iput(strided, sp, 3, 2, 10, right);
    shmem_barrier_all();
    for (int i = 0; i < 10; i++) CHECK_EQ(strided[3 * i], 10 * left + 2 * i);
    CHECK_EQ(strided[1], 0);
    long sg[10];
    shmem_long_iget(sg, strided, 1, 3, 10, right);
    for (int i = 0; i < 10; i++) CHECK_EQ(sg[i], 10 * me + 2 * i);

    /* a large iget (several staging batches) into private and symmetric memory */
    int *ig = shmem_malloc(2 * 40000 * sizeof(int)), *igs = shmem_malloc(40000 * sizeof(int));
    int *igp = malloc(40000 * sizeof(int));
    for (int i = 0; i < 80000; i++) ig[i] = i % 2 ? -1 : 3 * (i / 2) + me;
    shmem_barrier_all();
    shmem_int_iget(igp, ig, 1, 2, 40000, right);
    shmem_iget32(igs, ig, 1, 2, 40000, left);
    for (int i = 0; i < 40000; i++) {
        CHECK_EQ(igp[i], 3 * i + right);
        CHECK_EQ(igs[i], 3 * i + left);
    }
    free(igp);

    /* iput128 from symmetric memory, the source reused at once */
    uint64_t *w = shmem_malloc(8 * sizeof(uint64_t)), *wd = shmem_calloc(16, sizeof(uint64_t));
    for (int i = 0; i < 8; i++) w[i] = 100u * me + i;
    shmem_barrier_all();
    shmem_iput128(wd, w, 2, 1, 4, right); /* 4 x 16 bytes, to every other 16-byte slot */
    for (int i = 0; i < 8; i++) w[i] = 0;
    shmem_barrier_all();
    for (int k = 0; k < 4; k++) {
        CHECK_EQ(wd[4 * k], 100u * left + 2 * k);
        CHECK_EQ(wd[4 * k + 1], 100u * left + 2 * k + 1);
        CHECK_EQ(wd[4 * k + 2], 0);
    }

    /* shmem_ptr and accessibility */
    CHECK(shmem_ptr(x, me) == (void *)x);
    CHECK(n == 1 || shmem_ptr(x, right) == NULL);
    CHECK_EQ(shmem_addr_accessible(x, right), 1);
    CHECK_EQ(shmem_addr_accessible(lpriv, right), 0);
    CHECK_EQ(shmem_pe_accessible(n), 0);

    shmem_free(big);
    free(priv);
    free(back);
    shmem_barrier_all();
    PASS("rma");
    shmem_finalize();
    return 0;
}
