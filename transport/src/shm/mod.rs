//! Shared memory of a job: named POSIX shared-memory objects, the lock-free control
//! rings between each pair of local ranks, and the pinned staging chunks of the SHM
//! protocol.

pub mod job;
pub mod object;
pub mod ring;
