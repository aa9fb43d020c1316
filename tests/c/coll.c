/* Teams and team collectives (OpenSHMEM 1.5 §9.4, §9.9): world and shared
 * team queries, split_strided (even PEs, odd PEs; a team of one),
 * translate_pe, team_sync, broadcast, fcollect, collect (sizes differ per
 * PE), alltoall, and every reduction on int, long, double and unsigned,
 * in place too; fcollect and alltoall on a split team; collectives and a
 * split of SHMEM_TEAM_SHARED (this PE alone); results are computed
 * independently and compared. */
#include <string.h>
#include "check.h"

static long lsum(int n) { return (long)n * (n - 1) / 2; }

int main(void) {
    shmem_init();
    int me = shmem_my_pe(), n = shmem_n_pes();

    CHECK_EQ(shmem_team_my_pe(SHMEM_TEAM_WORLD), me);
    CHECK_EQ(shmem_team_n_pes(SHMEM_TEAM_WORLD), n);
    CHECK_EQ(shmem_team_n_pes(SHMEM_TEAM_SHARED), 1); /* CPU PEs share no memory */
    CHECK_EQ(shmem_team_my_pe(SHMEM_TEAM_SHARED), 0);
    CHECK_EQ(shmem_team_my_pe(SHMEM_TEAM_INVALID), -1);

    /* broadcast from the last PE, 100 ints */
    int *bsrc = shmem_malloc(100 * sizeof(int)), *bdst = shmem_calloc(100, sizeof(int));
    for (int i = 0; i < 100; i++) bsrc[i] = me * 1000 + i;
    CHECK(shmem_team_ptr(SHMEM_TEAM_SHARED, bsrc, 0) == (void *)bsrc);
    CHECK(shmem_team_ptr(SHMEM_TEAM_WORLD, bsrc, me) == (void *)bsrc);
    CHECK(n == 1 || shmem_team_ptr(SHMEM_TEAM_WORLD, bsrc, (me + 1) % n) == NULL);
    CHECK_EQ(shmem_int_broadcast(SHMEM_TEAM_WORLD, bdst, bsrc, 100, n - 1), 0);
    for (int i = 0; i < 100; i++) CHECK_EQ(bdst[i], (n - 1) * 1000 + i);

    /* fcollect: 3 longs per PE */
    long *fsrc = shmem_malloc(3 * sizeof(long)), *fdst = shmem_malloc(3 * n * sizeof(long));
    for (int i = 0; i < 3; i++) fsrc[i] = 10 * me + i;
    shmem_long_fcollect(SHMEM_TEAM_WORLD, fdst, fsrc, 3);
    for (int p = 0; p < n; p++)
        for (int i = 0; i < 3; i++) CHECK_EQ(fdst[3 * p + i], 10 * p + i);

    /* collect: PE p contributes p+1 shorts */
    short *csrc = shmem_malloc((n + 1) * sizeof(short)), *cdst = shmem_malloc(n * (n + 1) * sizeof(short));
    for (int i = 0; i <= me; i++) csrc[i] = (short)(100 * me + i);
    shmem_collect(SHMEM_TEAM_WORLD, cdst, csrc, (size_t)me + 1);
    int at = 0;
    for (int p = 0; p < n; p++)
        for (int i = 0; i <= p; i++) CHECK_EQ(cdst[at++], 100 * p + i);

    /* alltoall: block j of PE i (2 ints) = 100 i + 10 j + k lands in block i of PE j */
    int *asrc = shmem_malloc(2 * n * sizeof(int)), *adst = shmem_malloc(2 * n * sizeof(int));
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 2; k++) asrc[2 * j + k] = 100 * me + 10 * j + k;
    shmem_int_alltoall(SHMEM_TEAM_WORLD, adst, asrc, 2);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 2; k++) CHECK_EQ(adst[2 * i + k], 100 * i + 10 * me + k);

    /* alltoalls: 1 long per PE pair, source stride 2, dest stride 3 */
    long *ssrc = shmem_malloc(2 * n * sizeof(long)), *sdst = shmem_calloc(3 * n, sizeof(long));
    for (int j = 0; j < n; j++) ssrc[2 * j] = 1000 * me + j, ssrc[2 * j + 1] = -1;
    shmem_alltoalls(SHMEM_TEAM_WORLD, sdst, ssrc, 3, 2, 1); /* generic */
    for (int i = 0; i < n; i++) {
        CHECK_EQ(sdst[3 * i], 1000 * i + me);
        CHECK_EQ(sdst[3 * i + 1], 0);
    }

    /* reductions */
    int *ri = shmem_malloc(4 * sizeof(int)), *ro = shmem_malloc(4 * sizeof(int));
    for (int i = 0; i < 4; i++) ri[i] = me + i;
    shmem_int_sum_reduce(SHMEM_TEAM_WORLD, ro, ri, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ(ro[i], lsum(n) + n * i);
    shmem_int_max_reduce(SHMEM_TEAM_WORLD, ro, ri, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ(ro[i], n - 1 + i);
    shmem_min_reduce(SHMEM_TEAM_WORLD, ro, ri, 4); /* generic */
    for (int i = 0; i < 4; i++) CHECK_EQ(ro[i], i);
    long *rl = shmem_malloc(sizeof(long));
    *rl = me + 2;
    shmem_long_prod_reduce(SHMEM_TEAM_WORLD, rl, rl, 1); /* in place */
    long prod = 1;
    for (int p = 0; p < n; p++) prod *= p + 2;
    CHECK_EQ(*rl, prod);
    double *rd = shmem_malloc(2 * sizeof(double));
    rd[0] = 0.5 * me;
    rd[1] = -1.0 * me;
    shmem_double_sum_reduce(SHMEM_TEAM_WORLD, rd, rd, 2);
    CHECK(rd[0] == 0.5 * lsum(n) && rd[1] == -1.0 * lsum(n));
    unsigned int *ru = shmem_malloc(3 * sizeof(unsigned int)), *rv = shmem_malloc(3 * sizeof(unsigned int));
    ru[0] = 1u << me;      /* or: all bits */
    ru[1] = ~(1u << me);   /* and: the bits of no PE cleared */
    ru[2] = 1u << me | 1u; /* xor: bit 0 n times (except PE 0), one bit each */
    shmem_uint_or_reduce(SHMEM_TEAM_WORLD, &rv[0], &ru[0], 1);
    shmem_uint_and_reduce(SHMEM_TEAM_WORLD, &rv[1], &ru[1], 1);
    shmem_uint_xor_reduce(SHMEM_TEAM_WORLD, &rv[2], &ru[2], 1);
    unsigned int all = (1u << n) - 1;
    CHECK_EQ(rv[0], all);
    CHECK_EQ(rv[1], ~all);
    unsigned int x = 0;
    for (int p = 0; p < n; p++) x ^= 1u << p | 1u;
    CHECK_EQ(rv[2], x);

    /* split: even PEs and odd PEs */
    shmem_team_t evens, odds, one;
    CHECK_EQ(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 2, (n + 1) / 2, NULL, 0, &evens), 0);
    CHECK_EQ(shmem_team_split_strided(SHMEM_TEAM_WORLD, 1, 2, n / 2, NULL, 0, &odds), n < 2 ? 1 : 0);
    shmem_team_t mine = me % 2 ? odds : evens;
    CHECK((me % 2 ? evens : odds) == SHMEM_TEAM_INVALID);
    CHECK(mine != SHMEM_TEAM_INVALID);
    CHECK_EQ(shmem_team_my_pe(mine), me / 2);
    CHECK_EQ(shmem_team_n_pes(mine), me % 2 ? n / 2 : (n + 1) / 2);
    CHECK_EQ(shmem_team_translate_pe(mine, 0, SHMEM_TEAM_WORLD), me % 2);
    CHECK_EQ(shmem_team_translate_pe(SHMEM_TEAM_WORLD, me, mine), me / 2);
    int nb = (me + 1) % n;
    CHECK_EQ(shmem_team_translate_pe(SHMEM_TEAM_WORLD, nb, mine), nb % 2 == me % 2 ? nb / 2 : -1);
    shmem_team_config_t cfg = {0};
    CHECK_EQ(shmem_team_get_config(mine, SHMEM_TEAM_NUM_CONTEXTS, &cfg), 0);
    CHECK_EQ(cfg.num_contexts, 0);
    /* sum over the sub-team: world PEs me%2, me%2+2, ... */
    long *tl = shmem_malloc(sizeof(long)), *tsum = shmem_malloc(sizeof(long));
    *tl = me;
    shmem_team_sync(mine);
    shmem_long_sum_reduce(mine, tsum, tl, 1);
    long want = 0;
    for (int p = me % 2; p < n; p += 2) want += p;
    CHECK_EQ(*tsum, want);
    /* broadcast within the sub-team from its team PE 0 (world PE me % 2) */
    shmem_int_broadcast(mine, bdst, bsrc, 10, 0);
    for (int i = 0; i < 10; i++) CHECK_EQ(bdst[i], (me % 2) * 1000 + i);
    /* fcollect and alltoall within the sub-team (team PE t is world PE
     * me % 2 + 2 t) */
    int tsize = shmem_team_n_pes(mine);
    shmem_long_fcollect(mine, fdst, fsrc, 3);
    for (int t = 0; t < tsize; t++)
        for (int i = 0; i < 3; i++) CHECK_EQ(fdst[3 * t + i], 10 * (me % 2 + 2 * t) + i);
    shmem_int_alltoall(mine, adst, asrc, 2);
    for (int t = 0; t < tsize; t++)
        for (int k = 0; k < 2; k++) CHECK_EQ(adst[2 * t + k], 100 * (me % 2 + 2 * t) + 10 * (me / 2) + k);
    /* SHMEM_TEAM_SHARED is this PE alone: its collectives are copies, and
     * its split is a team of one */
    int *si = shmem_malloc(4 * sizeof(int)), *so = shmem_malloc(4 * sizeof(int));
    for (int i = 0; i < 4; i++) si[i] = me + i;
    shmem_int_sum_reduce(SHMEM_TEAM_SHARED, so, si, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ(so[i], me + i);
    shmem_long_fcollect(SHMEM_TEAM_SHARED, fdst, fsrc, 3);
    for (int i = 0; i < 3; i++) CHECK_EQ(fdst[i], 10 * me + i);
    shmem_team_t self;
    CHECK_EQ(shmem_team_split_strided(SHMEM_TEAM_SHARED, 0, 1, 1, NULL, 0, &self), 0);
    CHECK(self != SHMEM_TEAM_INVALID);
    CHECK_EQ(shmem_team_n_pes(self), 1);
    CHECK_EQ(shmem_team_translate_pe(self, 0, SHMEM_TEAM_WORLD), me);
    shmem_int_broadcast(self, bdst, bsrc, 10, 0);
    for (int i = 0; i < 10; i++) CHECK_EQ(bdst[i], bsrc[i]);
    shmem_team_sync(self);
    shmem_team_destroy(self);
    /* a context on the sub-team: PE numbers are team numbers */
    shmem_ctx_t tctx;
    CHECK_EQ(shmem_team_create_ctx(mine, 0, &tctx), 0);
    int tn = shmem_team_n_pes(mine), tme = shmem_team_my_pe(mine);
    shmem_ctx_int_p(tctx, &ri[0], 4242 + me, (tme + 1) % tn);
    shmem_ctx_quiet(tctx);
    shmem_team_sync(mine);
    CHECK_EQ(ri[0], 4242 + shmem_team_translate_pe(mine, (tme + tn - 1) % tn, SHMEM_TEAM_WORLD));
    shmem_team_t back;
    shmem_ctx_get_team(tctx, &back);
    CHECK(back == mine);
    shmem_ctx_destroy(tctx);
    shmem_team_sync(mine);
    /* a split of the sub-team: its team PE 0 alone */
    CHECK_EQ(shmem_team_split_strided(mine, 0, 1, 1, NULL, 0, &one), 0);
    CHECK((one != SHMEM_TEAM_INVALID) == (me / 2 == 0));
    if (one != SHMEM_TEAM_INVALID) {
        CHECK_EQ(shmem_team_n_pes(one), 1);
        shmem_team_sync(one);
        shmem_team_destroy(one);
    }
    shmem_team_destroy(mine);
    /* a triplet that does not fit is refused on every PE */
    shmem_team_t bad;
    CHECK(shmem_team_split_strided(SHMEM_TEAM_WORLD, 0, 1, n + 1, NULL, 0, &bad) != 0);
    CHECK(bad == SHMEM_TEAM_INVALID);
    /* 2-D split: rows of 2 */
    shmem_team_t xt, yt;
    CHECK_EQ(shmem_team_split_2d(SHMEM_TEAM_WORLD, 2, NULL, 0, &xt, NULL, 0, &yt), 0);
    CHECK_EQ(shmem_team_my_pe(xt), me % 2);
    CHECK_EQ(shmem_team_my_pe(yt), me / 2);
    shmem_team_destroy(xt);
    shmem_team_destroy(yt);

    shmem_barrier_all();
    PASS("coll");
    shmem_finalize();
    return 0;
}
