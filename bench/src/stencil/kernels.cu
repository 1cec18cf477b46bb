// Stencil2D's device kernels. NVRTC compiles this at run time (compute.rs) with a
// `typedef float real;` or `typedef double real;` in front, and by default with
// --fmad=false: stencil9 then rounds exactly like `point` in kernel.rs, whose
// association order it restates, so GPU results are bit-identical to the CPU
// reference. Pointers arrive as 64-bit device addresses from gpulmt's mem_alloc.

// The new value of point (i, j) of a pitched array (pitch in elements), from its
// 3x3 neighbourhood in src: `point` of kernel.rs, in its association order. Shared by
// stencil9 and the GIO mode's persistent kernel (gio.cu). No __restrict__ here: in the
// persistent kernel src changes during the kernel (its own steps, the neighbours' puts),
// so its loads must not take the read-only (non-coherent) path.
__device__ __forceinline__ real stencil9_point(const real* src, unsigned long long pitch,
                                               unsigned i, unsigned j, real w_center, real w_cardinal,
                                               real w_diagonal)
{
    const real* up = src + (size_t)(i - 1) * pitch + j;
    const real* mid = up + pitch;
    const real* down = mid + pitch;
    const real cardinal = ((up[0] + down[0]) + mid[-1]) + mid[1];
    const real diagonal = ((up[-1] + up[1]) + down[-1]) + down[1];
    return (w_center * mid[0] + w_cardinal * cardinal) + w_diagonal * diagonal;
}

// One stencil step on rows [r0, r1) x columns [c0, c1) of a pitched array
// (pitch in elements): dst = S(src). The region never includes the outermost ring,
// so every neighbour read is in bounds. One thread per point; neighbouring threads
// share rows, which the L1/L2 caches serve.
extern "C" __global__ void stencil9(const real* __restrict__ src, real* __restrict__ dst,
                                    unsigned long long pitch, unsigned r0, unsigned r1,
                                    unsigned c0, unsigned c1, real w_center,
                                    real w_cardinal, real w_diagonal)
{
    const unsigned j = c0 + blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned i = r0 + blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= r1 || j >= c1) {
        return;
    }
    dst[(size_t)i * pitch + j] = stencil9_point(src, pitch, i, j, w_center, w_cardinal, w_diagonal);
}

// Copies a rows x cols block between pitched arrays: packs halo columns into a
// contiguous message buffer (dst_pitch = cols) and unpacks them (src_pitch = cols).
// Blocks are thin (cols = halo width), so threads run over the flattened block
// rather than a 2D grid that would leave most lanes idle.
extern "C" __global__ void copy_block(real* __restrict__ dst, unsigned long long dst_pitch,
                                      const real* __restrict__ src, unsigned long long src_pitch,
                                      unsigned rows, unsigned cols)
{
    const unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (unsigned long long)rows * cols) {
        return;
    }
    const unsigned long long r = k / cols;
    const unsigned long long c = k % cols;
    dst[r * dst_pitch + c] = src[r * src_pitch + c];
}
