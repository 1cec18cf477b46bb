//! The device header for kernels compiled at run time: `include/gpulmt_device.cuh`,
//! embedded in the library so that a program compiles its kernels with NVRTC wherever it
//! runs (no include path, no CUDA toolkit headers: the header is self-contained).

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

/// The text of `include/gpulmt_device.cuh`.
pub const DEVICE_HEADER: &str = include_str!("../../../include/gpulmt_device.cuh");

/// Whether NVRTC (`libnvrtc`) can be loaded here.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library; cudarc panics later if it is absent.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Compiles `kernels` (CUDA C++ that uses the device API) behind the device header with
/// NVRTC, as the file `name`, with `options` added (e.g. `-DGPULMT_DEVICE_UNCHECKED`,
/// `--fmad=false`). The kernels find `gpulmt_dctx` and every `gpulmt_*` call declared.
pub fn compile_device_kernels(kernels: &str, name: &str, options: &[&str]) -> Result<Ptx, String> {
    if !nvrtc_available() {
        return Err("libnvrtc (the CUDA runtime compiler) was not found: install the CUDA toolkit's NVRTC or add \
                    its lib64 directory to LD_LIBRARY_PATH"
            .into());
    }
    let source = format!("{DEVICE_HEADER}\n#line 1 \"{name}\"\n{kernels}");
    let opts = CompileOptions {
        name: Some(name.to_string()),
        options: options.iter().map(|o| o.to_string()).collect(),
        ..Default::default()
    };
    compile_ptx_with_opts(source, opts).map_err(|e| format!("NVRTC could not compile {name}: {e:?}"))
}
