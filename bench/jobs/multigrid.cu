// SPDX-License-Identifier: MIT
/*
 * A plain CUDA program (no framework): a multigrid solver of the 2D Poisson equation whose grid
 * changes size every step (256 to 1024 points a side, seeded), as a code that solves a series of
 * problems of different sizes does. Every level of every V-cycle takes its arrays with cudaMalloc
 * and gives them back with cudaFree, and every residual norm takes a buffer of partial sums sized
 * by its grid: the sizes follow the problem, level by level. Each step (4 V-cycles on one grid)
 * ends with cuheap_mark("step") when cuheap is loaded. Prints what the Python jobs print
 * (bench/jobs/jobcommon.py): the step times and the residual norms as exact hex floats.
 *
 *   nvcc -O2 -arch=sm_90 -o multigrid multigrid.cu -ldl && ./multigrid [STEPS]
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define THREADS 256

static void check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "multigrid: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

static float *grid_new(int n)
{
    float *p;
    check(cudaMalloc(&p, (size_t)n * n * sizeof(float)), "cudaMalloc");
    check(cudaMemset(p, 0, (size_t)n * n * sizeof(float)), "cudaMemset");
    return p;
}

__device__ float at(const float *u, int n, int i, int j)
{
    return i < 0 || j < 0 || i >= n || j >= n ? 0.0f : u[i * n + j];
}

/* the right-hand side: a smooth pattern plus a hash of the point and the step (seeded) */
__global__ void rhs(float *f, int n, unsigned seed)
{
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * n)
        return;
    unsigned h = (unsigned)k * 2654435761u ^ seed * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    float x = (float)(k / n) / n, y = (float)(k % n) / n;
    f[k] = sinpif(2 * x) * cospif(4 * y) + 0.1f * ((float)(h & 0xffff) / 65536.0f - 0.5f);
}

/* weighted Jacobi: out = u + w (h^2 f + neighbours - 4 u) / 4 */
__global__ void smooth(float *out, const float *u, const float *f, int n, float h2)
{
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * n)
        return;
    int i = k / n, j = k % n;
    float s = at(u, n, i - 1, j) + at(u, n, i + 1, j) + at(u, n, i, j - 1) + at(u, n, i, j + 1);
    out[k] = u[k] + 0.8f * (h2 * f[k] + s - 4 * u[k]) / 4;
}

/* r = f - A u, A u = (4 u - neighbours) / h^2 */
__global__ void residual(float *r, const float *u, const float *f, int n, float h2)
{
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * n)
        return;
    int i = k / n, j = k % n;
    float s = at(u, n, i - 1, j) + at(u, n, i + 1, j) + at(u, n, i, j - 1) + at(u, n, i, j + 1);
    r[k] = f[k] - (4 * u[k] - s) / h2;
}

/* coarse = the mean of each 2x2 block of fine (n: the coarse side) */
__global__ void restrict_to(float *coarse, const float *fine, int n)
{
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * n)
        return;
    int i = 2 * (k / n), j = 2 * (k % n), m = 2 * n;
    coarse[k] = 0.25f * (fine[i * m + j] + fine[i * m + j + 1] + fine[(i + 1) * m + j] +
                         fine[(i + 1) * m + j + 1]);
}

/* fine += the coarse correction, constant over each 2x2 block (n: the fine side) */
__global__ void prolong_add(float *fine, const float *coarse, int n)
{
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * n)
        return;
    fine[k] += coarse[(k / n / 2) * (n / 2) + (k % n) / 2];
}

/* each block's sum of squares, in a fixed order (a tree in shared memory) */
__global__ void sum_squares(double *part, const float *r, int count)
{
    __shared__ double s[THREADS];
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = k < count ? (double)r[k] * r[k] : 0.0;
    __syncthreads();
    for (int w = THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w)
            s[threadIdx.x] += s[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        part[blockIdx.x] = s[0];
}

static int blocks(int count)
{
    return (count + THREADS - 1) / THREADS;
}

/* The residual's norm: a buffer of partial sums of its own, summed on the host in order. */
static double norm(const float *r, int n)
{
    int nb = blocks(n * n);
    double *part, *host = (double *)malloc(nb * sizeof(double)), sum = 0;
    check(cudaMalloc(&part, nb * sizeof(double)), "cudaMalloc");
    sum_squares<<<nb, THREADS>>>(part, r, n * n);
    check(cudaMemcpy(host, part, nb * sizeof(double), cudaMemcpyDeviceToHost), "cudaMemcpy");
    check(cudaFree(part), "cudaFree");
    for (int b = 0; b < nb; b++)
        sum += host[b];
    free(host);
    return sqrt(sum / ((double)n * n));
}

/* One V-cycle on an n x n grid of spacing h: smooth, restrict the residual, solve the coarse
 * problem the same way (its arrays made here and freed on the way back), correct, smooth. */
static void vcycle(float *u, const float *f, int n, float h)
{
    float h2 = h * h, *tmp = grid_new(n);
    int nb = blocks(n * n);
    for (int s = 0; s < (n <= 16 ? 40 : 2); s++) {
        smooth<<<nb, THREADS>>>(tmp, u, f, n, h2);
        check(cudaMemcpy(u, tmp, (size_t)n * n * sizeof(float), cudaMemcpyDeviceToDevice), "copy");
    }
    if (n > 16 && n % 2 == 0) {
        int m = n / 2;
        float *r = grid_new(n), *fc = grid_new(m), *ec = grid_new(m);
        residual<<<nb, THREADS>>>(r, u, f, n, h2);
        restrict_to<<<blocks(m * m), THREADS>>>(fc, r, m);
        check(cudaFree(r), "cudaFree");
        vcycle(ec, fc, m, 2 * h);
        prolong_add<<<nb, THREADS>>>(u, ec, n);
        check(cudaFree(fc), "cudaFree");
        check(cudaFree(ec), "cudaFree");
        for (int s = 0; s < 2; s++) {
            smooth<<<nb, THREADS>>>(tmp, u, f, n, h2);
            check(cudaMemcpy(u, tmp, (size_t)n * n * sizeof(float), cudaMemcpyDeviceToDevice),
                  "copy");
        }
    }
    check(cudaFree(tmp), "cudaFree");
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *env = getenv("JOB_STEPS");
    int steps = argc > 1 ? atoi(argv[1]) : env ? atoi(env) : 30;
    static const int sides[] = {256, 384, 512, 640, 768, 1024};
    void (*mark)(const char *) = (void (*)(const char *))dlsym(RTLD_DEFAULT, "cuheap_mark");
    double t_start = now(), *ms = (double *)calloc(steps + 1, sizeof(double));
    double *out = (double *)calloc(steps + 1, sizeof(double));
    unsigned seed = 7;
    check(cudaFree(0), "cudaFree(0)"); /* the context, before the first step */
    for (int s = 0; s < steps; s++) {
        seed = seed * 1103515245u + 12345u;
        int n = sides[(seed >> 16) % 6];
        check(cudaDeviceSynchronize(), "sync");
        double t0 = now();
        float *u = grid_new(n), *f = grid_new(n), *r = grid_new(n);
        rhs<<<blocks(n * n), THREADS>>>(f, n, seed);
        for (int c = 0; c < 4; c++)
            vcycle(u, f, n, 1.0f / n);
        residual<<<blocks(n * n), THREADS>>>(r, u, f, n, 1.0f / ((float)n * n));
        out[s] = norm(r, n);
        check(cudaFree(u), "cudaFree");
        check(cudaFree(f), "cudaFree");
        check(cudaFree(r), "cudaFree");
        check(cudaDeviceSynchronize(), "sync");
        ms[s] = 1000 * (now() - t0);
        if (mark)
            mark("step");
    }
    double *sorted = (double *)calloc(steps + 1, sizeof(double));
    int skip = steps > 6 ? 3 : 0;
    for (int s = skip; s < steps; s++)
        sorted[s - skip] = ms[s];
    qsort(sorted, steps - skip, sizeof(double), cmp_double);
    printf("job=cuda-multigrid device=cuda steps=%d step_ms=%.3f first_ms=%.3f total_s=%.1f\n",
           steps, steps - skip > 0 ? sorted[(steps - skip) / 2] : 0.0, steps ? ms[0] : 0.0,
           now() - t_start);
    printf("step_ms_all");
    for (int s = 0; s < steps; s++)
        printf(" %.3f", ms[s]);
    printf("\noutputs");
    for (int s = 0; s < steps; s++)
        printf(" %a", out[s]);
    printf("\n");
    free(ms);
    free(out);
    free(sorted);
    return 0;
}
