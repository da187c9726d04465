// The CUDA source kernels/cuda/cuda_embedding.cu compiled for the host (Note [Host execution
// of CUDA kernels] in cuda_host.h).
#include "kernels/cuda/cuda_embedding.cu"
