// How many thread-block clusters of 1, 2 and 4 CTAs can be resident at once on this GPU, for a
// kernel shaped like the sm90 GEMMs (256 or 384 threads, ~200 KB of dynamic shared memory, one
// CTA per SM)?  cudaOccupancyMaxActiveClusters is the authority; SMs / cluster size is what the
// loader assumes.  Build and run: nvcc -arch=sm_90a -o /tmp/pc scripts/probe_clusters.cu && /tmp/pc
#include <cstdio>
#include <cuda_runtime.h>

__global__ void dummy(int *out) { extern __shared__ int smem[]; if (out) out[0] = smem[0]; }

int main() {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("%s: %d SMs\n", prop.name, prop.multiProcessorCount);
  for (int threads : {256, 384}) {
    for (int smem : {160 * 1024, 200 * 1024, 227 * 1024}) {
      cudaFuncSetAttribute(dummy, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      cudaFuncSetAttribute(dummy, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      for (int cs : {1, 2, 4}) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = cs; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
        cfg.gridDim = dim3(cs * 64, 1, 1);
        cfg.blockDim = dim3(threads, 1, 1);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        int n = -1;
        cudaError_t e = cudaOccupancyMaxActiveClusters(&n, dummy, &cfg);
        printf("threads %d smem %3d KB cluster %d: max active clusters %d (SMs/cluster %d)%s\n", threads,
               smem / 1024, cs, n, prop.multiProcessorCount / cs, e ? cudaGetErrorString(e) : "");
      }
    }
  }
  return 0;
}
