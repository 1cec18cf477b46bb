//! Shared memory of a job: named POSIX shared-memory objects, the lock-free control
//! rings between each pair of local ranks, and the pinned staging chunks of the SHM
//! protocol; who owns each object, and the sweep that removes what dead owners left.

pub mod job;
pub mod object;
pub mod owner;
pub mod ring;
pub mod sweep;
pub mod wait;
