// Host cost per launch of one empty kernel with ~640 bytes of parameters, by launch path.
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
struct Params { char bytes[640]; };
extern "C" __global__ void k(Params p) { if (p.bytes[0] == 42 && threadIdx.x == 999) p.bytes[1] = 0; }
static double now() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "rb"); fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    std::vector<char> cubin(n); fread(cubin.data(), 1, n, f); fclose(f);
    cudaSetDevice(0); cudaFree(0);
    cudaLibrary_t lib; cudaKernel_t kern;
    if (cudaLibraryLoadData(&lib, cubin.data(), 0, 0, 0, 0, 0, 0) != cudaSuccess) { printf("load failed\n"); return 1; }
    cudaLibraryGetKernel(&kern, lib, "k");
    CUfunction fn; cuKernelGetFunction(&fn, (CUkernel)kern);
    cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    Params p; memset(&p, 0, sizeof p); void *args[1] = {&p};
    const int N = 20000, BATCH = 200;
    for (int path = 0; path < 5; path++) for (int rep = 0; rep < 3; rep++) {
        double t = 0;
        for (int i = 0; i < N; i += BATCH) {
            cudaStreamSynchronize(s);
            double t0 = now();
            for (int j = 0; j < BATCH; j++) {
                if (path == 0) {  // the DSL's path: cudaLaunchKernelExC on a cudaKernel_t, no attributes
                    cudaLaunchConfig_t c = {}; c.gridDim = dim3(1); c.blockDim = dim3(128); c.stream = s;
                    cudaLaunchKernelExC(&c, (const void *)kern, args);
                } else if (path == 1) {  // the same with a cluster-dimension attribute (1x1x1)
                    cudaLaunchAttribute a[1]; a[0].id = cudaLaunchAttributeClusterDimension;
                    a[0].val.clusterDim.x = 1; a[0].val.clusterDim.y = 1; a[0].val.clusterDim.z = 1;
                    cudaLaunchConfig_t c = {}; c.gridDim = dim3(1); c.blockDim = dim3(128); c.stream = s;
                    c.attrs = a; c.numAttrs = 1;
                    cudaLaunchKernelExC(&c, (const void *)kern, args);
                } else if (path == 2) {  // driver: cuLaunchKernel on the CUfunction
                    cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, (CUstream)s, args, 0);
                } else if (path == 3) {  // driver: cuLaunchKernelEx
                    CUlaunchConfig c = {}; c.gridDimX = c.gridDimY = c.gridDimZ = 1; c.blockDimX = 128;
                    c.blockDimY = c.blockDimZ = 1; c.hStream = (CUstream)s;
                    cuLaunchKernelEx(&c, fn, args, 0);
                } else {  // driver: cuLaunchKernel on the CUkernel handle itself
                    cuLaunchKernel((CUfunction)kern, 1, 1, 1, 128, 1, 1, 0, (CUstream)s, args, 0);
                }
            }
            t += now() - t0;
        }
        cudaError_t e = cudaStreamSynchronize(s);
        printf("path %d rep %d: %.3f us/launch (%s)\n", path, rep, t / N, cudaGetErrorString(e));
    }
    return 0;
}
