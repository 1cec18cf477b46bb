//! Ranks that share a GPU: without NVIDIA MPS the driver time-slices their contexts.
//!
//! Two processes on one H200 without MPS read 145 us for an 8 B D-D ping-pong, under MPS
//! 10.2-10.4 us (git history: bench/results/h200x1/windows2_* at c15a975): every copy waits
//! for the GPU to switch to its context. gpulmt cannot start MPS itself (it is a node
//! service started before the job), so it says so once at start-up.

/// The ranks bound to `device`, given every rank's device.
fn sharing(device: u32, rank_devices: &[u32]) -> Vec<usize> {
    (0..rank_devices.len()).filter(|&r| rank_devices[r] == device).collect()
}

/// Whether other ranks share `device`: there, gpulmt's copies within the GPU compete with
/// their kernels, and `GPULMT_COPY_PRIORITY=auto` raises the copies' priority.
pub(crate) fn shared_device(device: u32, rank_devices: &[u32]) -> bool {
    sharing(device, rank_devices).len() > 1
}

/// The warning for rank `me`, bound to `device`, given every rank's device
/// (`rank_devices[r]`) and whether MPS serves `device` (None: unknown, no warning).
/// Only the lowest rank of a shared device warns, so a job logs it once per device.
pub(crate) fn time_slicing_warning(me: usize, device: u32, rank_devices: &[u32], mps: Option<bool>) -> Option<String> {
    let sharing = sharing(device, rank_devices);
    if mps != Some(false) || sharing.len() < 2 || sharing[0] != me {
        return None;
    }
    Some(format!(
        "ranks {sharing:?} share GPU {device} without NVIDIA MPS: the driver time-slices their contexts, \
         so each copy waits for a context switch (8 B latency 145 us against 10 us under MPS on H200); \
         start the MPS control daemon (`nvidia-cuda-mps-control -d`) before the job, or give each rank its own GPU"
    ))
}

/// Why a copy server (a kernel resident on the GPU) must not run on `device`, if it must
/// not: other ranks share the device and MPS is not known to serve it, so the driver
/// time-slices their contexts and a resident kernel would hold the GPU for its whole slice.
pub(crate) fn copy_server_refusal(device: u32, rank_devices: &[u32], mps: Option<bool>) -> Option<String> {
    let sharers = sharing(device, rank_devices).len();
    (sharers > 1 && mps != Some(true)).then(|| {
        format!(
            "{sharers} ranks share GPU {device} without NVIDIA MPS (or MPS is not known to serve it): \
             a resident copy server would stall the others' time slices; small copies use the copy engine"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_server_needs_its_own_gpu_or_mps() {
        assert_eq!(copy_server_refusal(0, &[0, 1], Some(false)), None);
        assert_eq!(copy_server_refusal(1, &[0, 1], None), None);
        assert_eq!(copy_server_refusal(0, &[0, 0], Some(true)), None);
        for mps in [Some(false), None] {
            let why = copy_server_refusal(0, &[0, 1, 0], mps).expect("refused");
            assert!(why.contains("2 ranks share GPU 0"), "{why}");
        }
    }

    #[test]
    fn a_device_is_shared_when_another_rank_uses_it() {
        assert!(shared_device(0, &[0, 1, 0]));
        assert!(!shared_device(1, &[0, 1, 0]));
        assert!(!shared_device(0, &[0]));
    }

    #[test]
    fn warns_once_per_shared_device_without_mps() {
        let devices = [0, 0, 1, 1, 0];
        let w = time_slicing_warning(0, 0, &devices, Some(false)).expect("ranks 0, 1 and 4 share GPU 0");
        assert!(w.contains("[0, 1, 4]") && w.contains("GPU 0") && w.contains("nvidia-cuda-mps-control"), "{w}");
        assert_eq!(time_slicing_warning(1, 0, &devices, Some(false)), None, "only the lowest rank warns");
        assert!(time_slicing_warning(2, 1, &devices, Some(false)).is_some());
        assert_eq!(time_slicing_warning(0, 0, &devices, Some(true)), None, "MPS serves it");
        assert_eq!(time_slicing_warning(0, 0, &devices, None), None, "unknown (sim, old driver)");
        assert_eq!(time_slicing_warning(0, 0, &[0, 1], Some(false)), None, "a GPU of its own");
    }
}
