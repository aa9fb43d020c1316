// jacobi.cu -- a 2D Jacobi solver written with NVSHMEM's names, built with
// nvcc against an installed cpnet (issue 21 item 4): the NVSHMEM program's
// include and link lines are the only cpnet-specific parts.
//
//     make -C apps/cuda PREFIX=$HOME/cpnet          # scripts/install.sh --prefix $HOME/cpnet
//     cpnet-run -n 2 -- apps/cuda/jacobi -nx 1024 -ny 1026 -iters 1000
//
// The global grid is nx x ny with fixed boundaries (top row 1, bottom row 0,
// left column 1, right column 0); its ny - 2 interior rows are split evenly
// over the PEs (row decomposition). Each PE keeps two buffers of chunk + 2
// rows (one halo row above, one below) in symmetric GPU memory. Per
// iteration: one kernel updates the PE's rows, then a two-block kernel puts
// the first and last rows into the neighbours' halos with
// nvshmemx_putmem_signal_nbi_block and waits for the neighbours' rows with
// nvshmem_signal_wait_until (the signal is the iteration number). At the
// end every PE compares its rows with a host computation of the whole grid
// and reports the largest difference; PE 0 also gathers every PE's count of
// wrong points with nvshmemx_int_put_block.
#include <nvshmem.h>
#include <nvshmemx.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CUDA_CHECK(call)                                                                          \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "jacobi: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

__global__ void jacobi_kernel(float* a_new, const float* a, int nx, int chunk)
{
    const int ix = blockIdx.x * blockDim.x + threadIdx.x + 1;
    const int iy = blockIdx.y * blockDim.y + threadIdx.y + 1;
    if (ix < nx - 1 && iy <= chunk)
        a_new[iy * nx + ix] = 0.25f * (a[iy * nx + ix + 1] + a[iy * nx + ix - 1] + a[(iy + 1) * nx + ix] + a[(iy - 1) * nx + ix]);
}

// Block 0 sends row 1 to the PE above (its bottom halo, row chunk + 1) and
// waits for that PE's last row in row 0; block 1 the same downwards.
// sig[0]: set by the PE above, sig[1]: by the PE below.
__global__ void halo_kernel(float* a_new, int nx, int chunk, int top, int bottom, uint64_t* sig, uint64_t iter)
{
    const size_t row = (size_t)nx * sizeof(float);
    if (blockIdx.x == 0 && top >= 0) {
        nvshmemx_putmem_signal_nbi_block(a_new + (size_t)(chunk + 1) * nx, a_new + nx, row, &sig[1], iter,
                                         NVSHMEM_SIGNAL_SET, top);
        if (threadIdx.x == 0) nvshmem_signal_wait_until(&sig[0], NVSHMEM_CMP_GE, iter);
    }
    if (blockIdx.x == 1 && bottom >= 0) {
        nvshmemx_putmem_signal_nbi_block(a_new, a_new + (size_t)chunk * nx, row, &sig[0], iter, NVSHMEM_SIGNAL_SET,
                                         bottom);
        if (threadIdx.x == 0) nvshmem_signal_wait_until(&sig[1], NVSHMEM_CMP_GE, iter);
    }
}

// One block: this PE's count of wrong points into slot my_pe of PE 0's array.
__global__ void report_kernel(int* counts, const int* mine)
{
    nvshmemx_int_put_block(counts + nvshmem_my_pe(), mine, 1, 0);
    if (threadIdx.x == 0) nvshmem_quiet();
}

static float boundary(int gy, int ix, int nx, int ny)
{
    if (gy == 0) return 1.0f;
    if (gy == ny - 1) return 0.0f;
    if (ix == 0) return 1.0f;
    if (ix == nx - 1) return 0.0f;
    return 0.0f;
}

int main(int argc, char** argv)
{
    int nx = 1024, ny = 1026, iters = 1000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-nx")) nx = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-ny")) ny = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-iters")) iters = atoi(argv[i + 1]);
        else { fprintf(stderr, "usage: jacobi [-nx N] [-ny N] [-iters N]\n"); return 2; }
    }
    nvshmem_init();
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const int local = nvshmem_team_my_pe(NVSHMEMX_TEAM_NODE);
    if (nx < 3 || ny < 3 || iters < 1 || (ny - 2) % npes != 0) {
        if (me == 0) fprintf(stderr, "jacobi: need nx, ny >= 3, iters >= 1 and (ny - 2) divisible by %d PEs\n", npes);
        nvshmem_finalize();
        return 2;
    }
    const int chunk = (ny - 2) / npes;
    const size_t elems = (size_t)(chunk + 2) * nx;
    float* a = (float*)nvshmem_malloc(elems * sizeof(float));
    float* a_new = (float*)nvshmem_malloc(elems * sizeof(float));
    uint64_t* sig = (uint64_t*)nvshmem_calloc(2, sizeof(uint64_t));
    int* counts = (int*)nvshmem_malloc(npes * sizeof(int));
    int* mine = (int*)nvshmem_malloc(sizeof(int));

    // Local row r is global row me * chunk + r.
    std::vector<float> h(elems);
    for (int r = 0; r < chunk + 2; ++r)
        for (int ix = 0; ix < nx; ++ix) h[(size_t)r * nx + ix] = boundary(me * chunk + r, ix, nx, ny);
    CUDA_CHECK(cudaMemcpy(a, h.data(), elems * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(a_new, h.data(), elems * sizeof(float), cudaMemcpyHostToDevice));
    const int top = me > 0 ? me - 1 : -1, bottom = me < npes - 1 ? me + 1 : -1;

    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const dim3 block(32, 8), grid((nx - 2 + 31) / 32, (chunk + 7) / 8);
    nvshmem_barrier_all();
    const auto t0 = std::chrono::steady_clock::now();
    for (int it = 1; it <= iters; ++it) {
        jacobi_kernel<<<grid, block, 0, s>>>(a_new, a, nx, chunk);
        uint64_t iter = (uint64_t)it;
        void* args[] = {&a_new, &nx, (void*)&chunk, (void*)&top, (void*)&bottom, &sig, &iter};
        if (nvshmemx_collective_launch((const void*)halo_kernel, dim3(2), dim3(256), args, 0, s) != NVSHMEMX_SUCCESS) {
            fprintf(stderr, "jacobi: PE %d: collective launch failed\n", me);
            return 1;
        }
        float* t = a; a = a_new; a_new = t;
    }
    nvshmemx_barrier_all_on_stream(s);
    CUDA_CHECK(cudaStreamSynchronize(s));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // The whole grid on the host, the same arithmetic in the same order.
    std::vector<float> g((size_t)ny * nx), gn;
    for (int y = 0; y < ny; ++y)
        for (int x = 0; x < nx; ++x) g[(size_t)y * nx + x] = boundary(y, x, nx, ny);
    gn = g;
    for (int it = 0; it < iters; ++it) {
        for (int y = 1; y < ny - 1; ++y)
            for (int x = 1; x < nx - 1; ++x)
                gn[(size_t)y * nx + x] = 0.25f * (g[(size_t)y * nx + x + 1] + g[(size_t)y * nx + x - 1] +
                                                  g[(size_t)(y + 1) * nx + x] + g[(size_t)(y - 1) * nx + x]);
        g.swap(gn);
    }
    CUDA_CHECK(cudaMemcpy(h.data(), a, elems * sizeof(float), cudaMemcpyDeviceToHost));
    int wrong = 0;
    double maxdiff = 0;
    for (int r = 1; r <= chunk; ++r)
        for (int x = 0; x < nx; ++x) {
            const double d = fabs((double)h[(size_t)r * nx + x] - (double)g[(size_t)(me * chunk + r) * nx + x]);
            maxdiff = d > maxdiff ? d : maxdiff;
            wrong += d > 1e-5;
        }
    CUDA_CHECK(cudaMemcpy(mine, &wrong, sizeof(int), cudaMemcpyHostToDevice));
    nvshmem_barrier_all();
    report_kernel<<<1, 32, 0, s>>>(counts, mine);
    CUDA_CHECK(cudaStreamSynchronize(s));
    nvshmem_barrier_all();
    printf("PE %d (node rank %d): %d x %d, %d iterations, %.3f ms/iteration, max |diff| vs host %.2e, %d wrong\n", me,
           local, nx, ny, iters, secs * 1e3 / iters, maxdiff, wrong);
    int total = 0;
    if (me == 0) {
        std::vector<int> c(npes);
        CUDA_CHECK(cudaMemcpy(c.data(), counts, npes * sizeof(int), cudaMemcpyDeviceToHost));
        for (int p = 0; p < npes; ++p) total += c[p];
        printf("jacobi: %d PEs, %d wrong points in all: %s\n", npes, total, total == 0 ? "OK" : "FAILED");
    }
    nvshmem_free(mine);
    nvshmem_free(counts);
    nvshmem_free(sig);
    nvshmem_free(a_new);
    nvshmem_free(a);
    CUDA_CHECK(cudaStreamDestroy(s));
    nvshmem_finalize();
    return total == 0 && wrong == 0 ? 0 : 1;
}
