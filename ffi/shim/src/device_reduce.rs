//! Element-wise reduction of device buffers into another (`acc[i] = acc[i] op
//! other_0[i] op other_1[i] ...`, in that order), the step of the device-side
//! `MPI_Allreduce` (`intercept::coll::device`) that the staged path leaves to the MPI
//! library on host copies.
//!
//! On CUDA a kernel per (type, op), compiled once per process by NVRTC at run time
//! (libnvrtc must be loadable; the source is below, no headers) and launched on a stream
//! of its own, waited for before the result is sent on: one launch for all the other
//! buffers (every peer's chunk at np ranks), not one per buffer, as each launch and its
//! wait cost some microseconds of the collective's time. On sim, whose device memory the
//! process addresses directly, the same loop on the host. Where neither can run (no
//! NVRTC, a compile or load failure), [`Reducer::ready`] says no and the caller takes
//! the staged path; the reason is logged once.
//!
//! The predefined ops `MPI_SUM`, `MPI_PROD`, `MPI_MIN` and `MPI_MAX` on the predefined
//! integer and floating types of `csrc/mpi_consts.c`'s list; anything else is staged.

use std::ffi::c_int;
use std::sync::{Arc, Mutex, OnceLock};

use gpulmt::device::BackendKind;
use mpi_sys::{MPI_Datatype, MPI_Op, RSMPI_MAX, RSMPI_MIN, RSMPI_PROD, RSMPI_SUM};

extern "C" {
    /// The datatypes of `csrc/mpi_consts.c`, their kinds (`(class << 8) | bytes`) and
    /// how many there are.
    static gpulmt_mpi_reduce_types: [MPI_Datatype; 12];
    static gpulmt_mpi_reduce_kinds: [c_int; 12];
    static gpulmt_mpi_reduce_type_count: c_int;
}

/// An element type the reduction handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
}

impl Elem {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            Elem::I32 | Elem::U32 | Elem::F32 => 4,
            Elem::I64 | Elem::U64 | Elem::F64 => 8,
        }
    }

    /// The element type in CUDA C++.
    fn cuda(self) -> &'static str {
        match self {
            Elem::I32 => "int",
            Elem::U32 => "unsigned int",
            Elem::I64 => "long long",
            Elem::U64 => "unsigned long long",
            Elem::F32 => "float",
            Elem::F64 => "double",
        }
    }

    const ALL: [Elem; 6] = [Elem::I32, Elem::U32, Elem::I64, Elem::U64, Elem::F32, Elem::F64];
}

/// A reduction operator the reduction handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum,
    Prod,
    Min,
    Max,
}

impl Op {
    /// `a op b` in CUDA C++.
    fn cuda(self) -> &'static str {
        match self {
            Op::Sum => "a + b",
            Op::Prod => "a * b",
            Op::Min => "(b < a ? b : a)",
            Op::Max => "(b > a ? b : a)",
        }
    }

    const ALL: [Op; 4] = [Op::Sum, Op::Prod, Op::Min, Op::Max];
}

/// One (type, op) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reduction {
    pub elem: Elem,
    pub op: Op,
}

impl Reduction {
    /// The reduction of `op` on `dt`, if both are ones it handles.
    pub fn of(dt: MPI_Datatype, op: MPI_Op) -> Option<Reduction> {
        // SAFETY: immutable statics initialized by the MPI library's constants (C), read only.
        let (ops, types, kinds, n) = unsafe {
            (
                [(RSMPI_SUM, Op::Sum), (RSMPI_PROD, Op::Prod), (RSMPI_MIN, Op::Min), (RSMPI_MAX, Op::Max)],
                &gpulmt_mpi_reduce_types,
                &gpulmt_mpi_reduce_kinds,
                gpulmt_mpi_reduce_type_count as usize,
            )
        };
        let op = ops.iter().find(|(o, _)| *o == op)?.1;
        let kind = types[..n].iter().zip(&kinds[..n]).find(|(t, _)| **t == dt)?.1;
        let elem = match (kind >> 8, kind & 0xff) {
            (0, 4) => Elem::I32,
            (1, 4) => Elem::U32,
            (0, 8) => Elem::I64,
            (1, 8) => Elem::U64,
            (2, 4) => Elem::F32,
            (2, 8) => Elem::F64,
            _ => return None,
        };
        Some(Reduction { elem, op })
    }

    /// The kernel's name.
    fn kernel(self) -> String {
        format!("reduce_{:?}_{:?}", self.elem, self.op).to_lowercase()
    }

    /// `acc[i] = acc[i] op other[i]` for `n` elements, on the host.
    ///
    /// # Safety
    /// `acc` and `other` are valid (host-addressable) for `n` elements each, aligned for
    /// the element type, and do not overlap.
    unsafe fn host(self, acc: usize, other: usize, n: usize) {
        macro_rules! apply {
            ($t:ty) => {{
                // SAFETY: the caller's buffers, as the function's contract says.
                let (a, b) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(acc as *mut $t, n),
                        std::slice::from_raw_parts(other as *const $t, n),
                    )
                };
                match self.op {
                    Op::Sum => a.iter_mut().zip(b).for_each(|(x, y)| *x = add(*x, *y)),
                    Op::Prod => a.iter_mut().zip(b).for_each(|(x, y)| *x = mul(*x, *y)),
                    Op::Min => a.iter_mut().zip(b).for_each(|(x, y)| {
                        if *y < *x {
                            *x = *y
                        }
                    }),
                    Op::Max => a.iter_mut().zip(b).for_each(|(x, y)| {
                        if *y > *x {
                            *x = *y
                        }
                    }),
                }
            }};
        }
        match self.elem {
            Elem::I32 => apply!(i32),
            Elem::U32 => apply!(u32),
            Elem::I64 => apply!(i64),
            Elem::U64 => apply!(u64),
            Elem::F32 => apply!(f32),
            Elem::F64 => apply!(f64),
        }
    }
}

/// Sums and products as C computes them: integers wrap (as MPI libraries' do).
trait Arith: Copy {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}
macro_rules! wrapping {
    ($($t:ty),*) => {$(impl Arith for $t {
        fn add(self, o: Self) -> Self { self.wrapping_add(o) }
        fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
    })*};
}
wrapping!(i32, u32, i64, u64);
macro_rules! floating {
    ($($t:ty),*) => {$(impl Arith for $t {
        fn add(self, o: Self) -> Self { self + o }
        fn mul(self, o: Self) -> Self { self * o }
    })*};
}
floating!(f32, f64);
fn add<T: Arith>(a: T, b: T) -> T {
    a.add(b)
}
fn mul<T: Arith>(a: T, b: T) -> T {
    a.mul(b)
}

/// The CUDA source of every kernel: one per (type, op), a grid-stride loop over the
/// elements that folds the `m` other buffers (`stride` elements apart) into `acc` in order.
pub fn cuda_source() -> String {
    let mut s = String::from(
        "// gpulmt shim: element-wise reductions acc[i] = acc[i] op other[0][i] op ... op other[m-1][i]\n",
    );
    for elem in Elem::ALL {
        for op in Op::ALL {
            let r = Reduction { elem, op };
            let t = elem.cuda();
            s += &format!(
                "extern \"C\" __global__ void {name}({t} *acc, const {t} *other, unsigned long long n,\n    \
                 unsigned long long stride, unsigned int m) {{\n  \
                 for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;\n       \
                 i += (unsigned long long)gridDim.x * blockDim.x) {{\n    {t} a = acc[i];\n    \
                 for (unsigned int k = 0; k < m; k++) {{\n      {t} b = other[k * stride + i];\n      \
                 a = {expr};\n    }}\n    acc[i] = a;\n  }}\n}}\n",
                name = r.kernel(),
                expr = op.cuda(),
            );
        }
    }
    s
}

/// The CUDA side: the module with every kernel on this rank's device, and a stream.
pub struct Cuda {
    module: Arc<cudarc::driver::CudaModule>,
    stream: Arc<cudarc::driver::CudaStream>,
}

impl Cuda {
    fn load(dev: u32) -> Result<Cuda, String> {
        if !gpulmt::sym::nvrtc::nvrtc_available() {
            return Err("libnvrtc (the CUDA runtime compiler) was not found".into());
        }
        let opts = cudarc::nvrtc::CompileOptions { name: Some("gpulmt_reduce.cu".into()), ..Default::default() };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(cuda_source(), opts)
            .map_err(|e| format!("NVRTC could not compile the reduction kernels: {e:?}"))?;
        let ctx = cudarc::driver::CudaContext::new(dev as usize).map_err(|e| format!("retaining the context: {e}"))?;
        let module = ctx.load_module(ptx).map_err(|e| format!("loading the reduction kernels: {e}"))?;
        let stream = ctx.new_stream().map_err(|e| format!("creating a stream: {e}"))?;
        Ok(Cuda { module, stream })
    }

    /// # Safety
    /// As [`Reducer::reduce`], with device pointers of this module's device.
    unsafe fn reduce(&self, r: Reduction, acc: usize, others: Others, n: usize) -> Result<(), String> {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        let f = self.module.load_function(&r.kernel()).map_err(|e| format!("finding {}: {e}", r.kernel()))?;
        let (acc, other, n, stride) = (acc as u64, others.first as u64, n as u64, others.stride as u64);
        let m = u32::try_from(others.count).map_err(|_| format!("{} buffers to reduce at once", others.count))?;
        let blocks = n.div_ceil(256).clamp(1, 1024) as u32;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let mut l = self.stream.launch_builder(&f);
        l.arg(&acc).arg(&other).arg(&n).arg(&stride).arg(&m);
        // SAFETY: the kernel takes (T *acc, const T *other, u64 n, u64 stride, u32 m); the
        // caller vouches that acc and the m other buffers (stride elements apart from
        // `other`) hold n elements of T each and that acc overlaps none of them.
        unsafe { l.launch(cfg) }.map_err(|e| format!("launching {}: {e}", r.kernel()))?;
        self.stream.synchronize().map_err(|e| format!("waiting for {}: {e}", r.kernel()))
    }
}

/// The buffers folded into the accumulator by one [`Reducer::reduce`]: `count` buffers,
/// the first at address `first`, each `stride` elements after the one before.
#[derive(Clone, Copy, Debug)]
pub struct Others {
    pub first: usize,
    pub stride: usize,
    pub count: usize,
}

/// What reduces on this rank: the host on sim, kernels on CUDA.
pub enum Reducer {
    Host,
    Cuda(Box<Cuda>),
}

/// The process's reducer: made on first use; `Err` (why not) when none can run.
static REDUCER: OnceLock<Mutex<Result<Reducer, String>>> = OnceLock::new();

impl Reducer {
    /// Whether reductions can run on the device of `kind` (`dev`): on CUDA the first call
    /// compiles and loads the kernels, and logs why not when that fails.
    pub fn ready(kind: BackendKind, dev: u32) -> bool {
        let r = REDUCER.get_or_init(|| {
            Mutex::new(match kind {
                BackendKind::Sim => Ok(Reducer::Host),
                BackendKind::Cuda => Cuda::load(dev).map(|c| Reducer::Cuda(Box::new(c))).inspect_err(|e| {
                    tracing::warn!(error = %e, "device reductions unavailable; MPI_Allreduce on device buffers is staged")
                }),
            })
        });
        r.lock().unwrap_or_else(|p| p.into_inner()).is_ok()
    }

    /// `acc[i] = acc[i] op o_0[i] op o_1[i] ...` for `n` elements of `r` and the buffers
    /// `o_k` of `others` in order, finished when this returns. Call [`Reducer::ready`]
    /// first.
    ///
    /// # Safety
    /// `acc` and every buffer of `others` are device buffers of this rank's device (sim:
    /// mapped into this process) holding `n` elements each, aligned for the type, `acc`
    /// overlapping none of the others, and none in use by any other operation meanwhile.
    pub unsafe fn reduce(r: Reduction, acc: usize, others: Others, n: usize) -> Result<(), String> {
        if others.count == 0 || n == 0 {
            return Ok(());
        }
        let Some(cell) = REDUCER.get() else { return Err("the reducer was not set up".into()) };
        let guard = cell.lock().unwrap_or_else(|p| p.into_inner());
        match &*guard {
            Ok(Reducer::Host) => {
                for k in 0..others.count {
                    // SAFETY: sim device memory is mapped into this process; the caller's
                    // contract for buffer k of `others`.
                    unsafe { r.host(acc, others.first + k * others.stride * r.elem.size(), n) }
                }
            }
            // SAFETY: the caller's contract.
            Ok(Reducer::Cuda(c)) => unsafe { c.reduce(r, acc, others, n) }?,
            Err(e) => return Err(e.clone()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_reduction_wraps_integers_and_takes_extremes() {
        let mut a = [i32::MAX, 5, -3, 7];
        let b = [1, -9, 4, 7];
        let r = Reduction { elem: Elem::I32, op: Op::Sum };
        // SAFETY: two local arrays of 4 i32.
        unsafe { r.host(a.as_mut_ptr() as usize, b.as_ptr() as usize, 4) };
        assert_eq!(a, [i32::MIN, -4, 1, 14]);
        let x = [1.5f64, -2.0, 3.0];
        let y = [2.0f64, -3.0, 0.5];
        for (op, want) in [(Op::Max, [2.0, -2.0, 3.0]), (Op::Min, [1.5, -3.0, 0.5]), (Op::Prod, [3.0, 6.0, 1.5])] {
            let mut z = x;
            // SAFETY: two local arrays of 3 f64.
            unsafe { Reduction { elem: Elem::F64, op }.host(z.as_mut_ptr() as usize, y.as_ptr() as usize, 3) };
            assert_eq!(z, want, "{op:?}");
        }
    }

    #[test]
    fn one_reduction_folds_every_other_buffer_in_order() {
        assert!(Reducer::ready(BackendKind::Sim, 0));
        // Three other buffers of 2 elements, 3 elements apart (a gap between them).
        let others = [10i64, 20, -1, 100, 200, -1, 1000, 2000, -1];
        let mut acc = [1i64, 2];
        let o = Others { first: others.as_ptr() as usize, stride: 3, count: 3 };
        let sum = Reduction { elem: Elem::I64, op: Op::Sum };
        // SAFETY: acc holds 2 i64, and each of the 3 others 2 i64 of the local array.
        unsafe { Reducer::reduce(sum, acc.as_mut_ptr() as usize, o, 2) }.unwrap();
        assert_eq!(acc, [1111, 2222]);
        // Products in floating point: the order is acc, then the others in turn.
        let f = [3.0f64, 0.5, 4.0];
        let mut x = [2.0f64];
        let o = Others { first: f.as_ptr() as usize, stride: 1, count: 3 };
        // SAFETY: one f64 in x and in each of the 3 others.
        unsafe { Reducer::reduce(Reduction { elem: Elem::F64, op: Op::Prod }, x.as_mut_ptr() as usize, o, 1) }.unwrap();
        assert_eq!(x, [12.0]);
        // No other buffer: nothing changes.
        let o = Others { first: others.as_ptr() as usize, stride: 3, count: 0 };
        // SAFETY: as above, no buffer read.
        unsafe { Reducer::reduce(sum, acc.as_mut_ptr() as usize, o, 2) }.unwrap();
        assert_eq!(acc, [1111, 2222]);
    }

    #[test]
    fn cuda_source_has_a_kernel_per_type_and_op() {
        let s = cuda_source();
        assert_eq!(s.matches("__global__").count(), Elem::ALL.len() * Op::ALL.len());
        assert!(
            s.contains(
                "void reduce_f64_sum(double *acc, const double *other, unsigned long long n,\n    unsigned long long \
                 stride, unsigned int m)"
            ),
            "{s}"
        );
        assert!(s.contains("a = (b < a ? b : a);"), "{s}");
    }

    /// Compiles the kernels with NVRTC where libnvrtc loads (e.g.
    /// `LD_LIBRARY_PATH=/opt/cuda-pip/nvidia/cu13/lib`): what a CUDA rank compiles at run time.
    #[test]
    fn the_kernels_compile_under_nvrtc() {
        if !gpulmt::sym::nvrtc::nvrtc_available() {
            eprintln!(
                "skipped: NVRTC (libnvrtc) not found; add the CUDA toolkit's lib64 to LD_LIBRARY_PATH to run this"
            );
            return;
        }
        let ptx = cudarc::nvrtc::compile_ptx(cuda_source()).expect("NVRTC compiles the reduction kernels");
        let text = ptx.to_src();
        for elem in Elem::ALL {
            for op in Op::ALL {
                let name = Reduction { elem, op }.kernel();
                assert!(text.contains(&format!(".entry {name}(")), "{name} missing from the PTX");
            }
        }
    }
}
