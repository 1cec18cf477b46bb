//! The shim's progress: gpulmt's (control packets, copies), matching, and a poll of
//! every running operation until it finishes.

use gpulmt::ProtoError;
use mpi_sys::*;

use super::ops::{Done, RecvSpec, State};
use super::Shim;
use crate::raw::*;

impl Shim {
    /// One round of progress: gpulmt, matching, and every running operation.
    pub fn progress(&mut self) {
        self.progress_transfers();
        self.match_posted();
        let running: Vec<u64> = self.ops.keys().copied().collect();
        for id in running {
            self.poll(id);
        }
    }

    /// Lets gpulmt read and send control packets and start and finish copies, without
    /// looking at the shim's own operations.
    pub(super) fn progress_transfers(&mut self) {
        if let Err(e) = self.ctx.progress() {
            tracing::warn!(error = %e, "gpulmt progress");
        }
    }

    fn poll(&mut self, id: u64) {
        let Some(op) = self.ops.get_mut(&id) else { return };
        if matches!(op.state, State::Posted) {
            return;
        }
        let spec = op.recv;
        // Out of the table while polled (only `poll` touches a matched operation).
        let mut state = std::mem::replace(&mut op.state, State::Posted);
        match self.poll_state(&mut state, spec) {
            Some(done) => self.finish(id, done),
            None => {
                if let Some(op) = self.ops.get_mut(&id) {
                    op.state = state;
                }
            }
        }
    }

    /// Polls a matched operation; its result once it finished.
    fn poll_state(&mut self, state: &mut State, spec: Option<RecvSpec>) -> Option<Done> {
        Some(match state {
            State::Posted => return None,
            State::Finished(d) => *d,
            State::RawRecv { inner, staging } => {
                let (mut flag, mut st) = (0, empty_status());
                // SAFETY: our request from PMPI_Imrecv.
                let rc = unsafe { PMPI_Test(inner, &mut flag, &mut st) };
                if flag == 0 && rc == SUCCESS {
                    return None;
                }
                let err = if rc == SUCCESS {
                    SUCCESS
                } else if st.MPI_ERROR != SUCCESS {
                    st.MPI_ERROR
                } else {
                    rc
                };
                let bytes = status_bytes(&st);
                match staging.take() {
                    Some(staging) if err == SUCCESS => {
                        let spec = spec.expect("receives have a spec");
                        self.write_data(&spec, st.MPI_SOURCE, st.MPI_TAG, &staging[..bytes.min(staging.len())])
                    }
                    _ => Done { source: st.MPI_SOURCE, tag: st.MPI_TAG, bytes, error: err, cancelled: false },
                }
            }
            State::LmtRecv { req, source, tag, staging } => {
                let (source, tag) = (*source, *tag);
                match self.ctx.test(req) {
                    Ok(None) => return None,
                    Ok(Some(s)) => {
                        let n = s.len as usize;
                        let mut d = Done::ok(source, tag, n);
                        if let Some(staging) = staging.take() {
                            let spec = spec.expect("receives have a spec");
                            d.error = self.write_packed(&spec, &staging[..n]);
                        }
                        d
                    }
                    Err(e) => {
                        let code = match e.as_transfer() {
                            Some(ProtoError::Truncated { .. }) => ERR_TRUNCATE,
                            _ => {
                                tracing::error!(error = %e, "gpulmt receive failed");
                                ERR_OTHER
                            }
                        };
                        Done::err(source, tag, code)
                    }
                }
            }
            State::LmtSend { env_req, lmt, error, .. } => {
                if *env_req != request_null() {
                    let mut flag = 0;
                    // SAFETY: our request from PMPI_Isend (set to MPI_REQUEST_NULL when done).
                    let rc = unsafe { PMPI_Test(env_req, &mut flag, status_ignore()) };
                    if rc != SUCCESS {
                        *error = rc;
                        *env_req = request_null();
                    }
                }
                if let Some(r) = lmt {
                    match self.ctx.test(r) {
                        Ok(None) => {}
                        Ok(Some(_)) => *lmt = None,
                        Err(e) => {
                            tracing::error!(error = %e, "gpulmt send failed");
                            *error = ERR_OTHER;
                            *lmt = None;
                        }
                    }
                }
                if *env_req != request_null() || lmt.is_some() {
                    return None;
                }
                Done::err(0, 0, *error)
            }
            State::Staged { inner, staged, call } => return self.poll_staged(inner, staged, call),
            State::MpiSend { inner, .. } => {
                let mut flag = 0;
                // SAFETY: our request from PMPI_Isend / PMPI_Issend.
                let rc = unsafe { PMPI_Test(inner, &mut flag, status_ignore()) };
                if flag == 0 && rc == SUCCESS {
                    return None;
                }
                Done::err(0, 0, rc)
            }
        })
    }
}
