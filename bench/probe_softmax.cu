// bench/probe_softmax.cu — a GPU probe, not part of the library or of `make`: why
// nabla's generated softmax row kernel (src/backends/cuda/cuda_render_rows.c) reached
// 0.43 of a device copy's bandwidth on an H100 while layer_norm reached 0.76.
// Hand-written variants of the kernel the renderer emits for softmax over
// [65536, 1024] f32 (one warp per row, the row kept in registers, 32 columns a
// lane), each changing one thing, timed against a copy kernel and cudaMemcpy:
//   gen      the generated structure: scalar loads, float max, double sum of expf,
//            a double reciprocal, expf again in the output phase
//   f32sum   the sum of exponentials in float
//   ecache   the exponentials of phase 1 kept in registers (phase 2 multiplies)
//   vec4     ecache + 16-byte loads and stores (4 consecutive columns a lane)
//   vec4f    vec4 + the float sum
//   nabla    (with -DNB_GEN_KERNEL='"file"' -DNB_GEN_NAME=nbr_...) the renderer's own
//            kernel, its source taken from the kernel cache (the fake CUDA stack's
//            images are the source: test/fake_cuda/README.md); nabla2 likewise
//            (NB_GEN2_KERNEL, NB_GEN2_NAME), to compare two renderer versions
// Built here (nvcc is installed; no GPU needed), run on the GPU machine:
//   nvcc -O3 -arch=sm_90 --fmad=false -o probe_softmax bench/probe_softmax.cu
// It prints one line per variant: median ms of 20 (CUDA events), GB/s (read +
// written) and the ratio to the copy kernel, and the largest difference from gen.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));           \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#include <cstdint>
#ifdef NB_GEN_KERNEL /* each in its own namespace: both carry the preamble */
namespace gen1 {
#include NB_GEN_KERNEL
}
#endif
#ifdef NB_GEN2_KERNEL
namespace gen2 {
#include NB_GEN2_KERNEL
}
#endif

constexpr int COLS = 1024, PER = COLS / 32;

__device__ __forceinline__ float wmaxf(float a) {
  for (int o = 16; o; o >>= 1) {
    float b = __shfl_xor_sync(0xffffffffu, a, o);
    a = (b > a || b != b) ? b : a;
  }
  return a;
}
template <typename T> __device__ __forceinline__ T wsum(T a) {
  for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  return a;
}

template <typename Acc, bool ECACHE>
__global__ void __launch_bounds__(256) k_scalar(const float *x, float *y, long rows) {
  const int lane = threadIdx.x % 32;
  for (long r = (long)blockIdx.x * 8 + threadIdx.x / 32; r < rows; r += (long)gridDim.x * 8) {
    const float *xr = x + r * COLS;
    float c[PER];
    float m = -INFINITY;
#pragma unroll
    for (int u = 0; u < PER; u++) {
      c[u] = xr[u * 32 + lane];
      if (c[u] > m || c[u] != c[u]) m = c[u];
    }
    m = wmaxf(m);
    Acc s = 0;
#pragma unroll
    for (int u = 0; u < PER; u++) {
      float e = expf(c[u] - m);
      if (ECACHE) c[u] = e;
      s += (Acc)e;
    }
    s = wsum(s);
    const float f = (float)1.0 / s;
#pragma unroll
    for (int u = 0; u < PER; u++) y[r * COLS + u * 32 + lane] = (ECACHE ? c[u] : expf(c[u] - m)) * f;
  }
}

template <typename Acc>
__global__ void __launch_bounds__(256) k_vec4(const float *x, float *y, long rows) {
  const int lane = threadIdx.x % 32;
  for (long r = (long)blockIdx.x * 8 + threadIdx.x / 32; r < rows; r += (long)gridDim.x * 8) {
    const float4 *xr = (const float4 *)(x + r * COLS);
    float4 c[PER / 4];
    float m = -INFINITY;
#pragma unroll
    for (int u = 0; u < PER / 4; u++) {
      c[u] = xr[u * 32 + lane];
      float v[4] = {c[u].x, c[u].y, c[u].z, c[u].w};
      for (int k = 0; k < 4; k++)
        if (v[k] > m || v[k] != v[k]) m = v[k];
    }
    m = wmaxf(m);
    Acc s = 0;
#pragma unroll
    for (int u = 0; u < PER / 4; u++) {
      c[u].x = expf(c[u].x - m), c[u].y = expf(c[u].y - m);
      c[u].z = expf(c[u].z - m), c[u].w = expf(c[u].w - m);
      s += (Acc)c[u].x, s += (Acc)c[u].y, s += (Acc)c[u].z, s += (Acc)c[u].w;
    }
    s = wsum(s);
    const float f = (float)1.0 / s;
    float4 *yr = (float4 *)(y + r * COLS);
#pragma unroll
    for (int u = 0; u < PER / 4; u++)
      yr[u * 32 + lane] = make_float4(c[u].x * f, c[u].y * f, c[u].z * f, c[u].w * f);
  }
}

__global__ void k_copy(const float4 *x, float4 *y, long n4) {
  for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x)
    y[i] = x[i];
}

int main() {
  const long rows = 65536, n = rows * COLS;
  const double bytes = 2.0 * n * sizeof(float);
  int dev = 0, sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::vector<float> h(n);
  srand(7);
  for (long i = 0; i < n; i++) h[i] = (float)(rand() % 20001 - 10000) / 1000.0f;
  float *x, *y, *ref;
  CK(cudaMalloc(&x, n * 4));
  CK(cudaMalloc(&y, n * 4));
  CK(cudaMalloc(&ref, n * 4));
  CK(cudaMemcpy(x, h.data(), n * 4, cudaMemcpyHostToDevice));
  const int grid = (int)std::min<long>(rows / 8, (long)sms * 16);
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto time = [&](auto launch) {
    for (int w = 0; w < 3; w++) launch();
    CK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int i = 0; i < 20; i++) {
      CK(cudaEventRecord(a));
      launch();
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      CK(cudaGetLastError());
      float t;
      CK(cudaEventElapsedTime(&t, a, b));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return (double)ms[10];
  };
  double t_copy = time([&] { k_copy<<<sms * 8, 512>>>((const float4 *)x, (float4 *)y, n / 4); });
  double t_memcpy = time([&] { CK(cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice)); });
  printf("%s, %d SMs, softmax [%ld, %d] f32, grid %d x 256\n", prop.name, sms, rows, COLS, grid);
  printf("%-8s %9s %9s %7s %10s\n", "variant", "ms", "GB/s", "ratio", "max|diff|");
  printf("%-8s %9.4f %9.1f %7.3f\n", "copy", t_copy, bytes / t_copy / 1e6, 1.0);
  printf("%-8s %9.4f %9.1f %7.3f\n", "memcpy", t_memcpy, bytes / t_memcpy / 1e6, t_copy / t_memcpy);
  std::vector<float> hr(n), hy(n);
  auto run = [&](const char *name, auto launch, bool is_ref) {
    CK(cudaMemset(y, 0xff, n * 4));
    double t = time(launch);
    if (is_ref) CK(cudaMemcpy(ref, y, n * 4, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(hy.data(), y, n * 4, cudaMemcpyDeviceToHost));
    if (is_ref) hr = hy;
    double md = 0;
    for (long i = 0; i < n; i++) md = std::max(md, (double)fabsf(hy[i] - hr[i]));
    printf("%-8s %9.4f %9.1f %7.3f %10.2e\n", name, t, bytes / t / 1e6, t_copy / t, md);
  };
  run("gen", [&] { k_scalar<double, false><<<grid, 256>>>(x, y, rows); }, true);
#ifdef NB_GEN_KERNEL
  gen1::nb_params p = {rows, COLS, x, {COLS}, y};
  run("nabla", [&] { gen1::NB_GEN_NAME<<<grid, 256>>>(p); }, false);
#endif
#ifdef NB_GEN2_KERNEL
  gen2::nb_params p2 = {rows, COLS, x, {COLS}, y};
  run("nabla2", [&] { gen2::NB_GEN2_NAME<<<grid, 256>>>(p2); }, false);
#endif
  run("f32sum", [&] { k_scalar<float, false><<<grid, 256>>>(x, y, rows); }, false);
  run("ecache", [&] { k_scalar<double, true><<<grid, 256>>>(x, y, rows); }, false);
  run("vec4", [&] { k_vec4<double><<<grid, 256>>>(x, y, rows); }, false);
  run("vec4f", [&] { k_vec4<float><<<grid, 256>>>(x, y, rows); }, false);
  const int grid_all = (int)(rows / 8);
  run("gen-g", [&] { k_scalar<double, false><<<grid_all, 256>>>(x, y, rows); }, false);
  run("vec4-g", [&] { k_vec4<double><<<grid_all, 256>>>(x, y, rows); }, false);
  return 0;
}
