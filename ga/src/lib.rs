//! Global Arrays over gpulmt (seed 003, CoGA; issue 29): a 2-D array distributed over
//! the ranks' GPUs, which any rank reads and writes by rectangular sections with
//! one-sided put, get and accumulate, and no matching call on the owners.
//!
//! # Where this layer lives, and why
//!
//! In a crate of its own, `ga/` (`gpulmt-ga`), above the `gpulmt` crate and using only
//! its public API: the symmetric heap (`Context::sym_alloc`/`sym_free`, the host
//! `sym_put_2d`/`sym_get_2d` strided copies and their `_nbi` forms, 64-bit atomic set and
//! fetch, `sym_fence`, `sym_quiet`) and the context's messages and barrier. Nothing here
//! knows where a peer's heap is: the heap routes each operation (over the on-node IPC
//! mappings, or through the internode path's queues to another node), so arrays span
//! pseudo-nodes and nodes without a change here.
//! Keeping it out of `transport/` keeps the transport free of a data model it does not
//! need, as Global Arrays sits on ARMCI/ComEx and CoGA on SCIF. The C API is in the
//! `gpulmt-ffi` crate (`ffi/src/ga.rs`, `gpulmt_ga_*` in `include/gpulmt.h`).
//!
//! # The pieces
//!
//! - [`GlobalArray`] ([`mod@array`]): create and destroy (collective), [`Layout::Block`] and
//!   block-cyclic distributions ([`section`]), element types f32, f64, i32 and i64
//!   ([`Element`], sealed), queries `distribution(rank)` and `locate(section)`, and put,
//!   get and accumulate on sections, blocking and non-blocking ([`Handle`],
//!   [`mod@handle`]), with `fence` (local) and `sync` (collective).
//! - Local buffers ([`buffer`]): host slices, device memory ([`Src::raw`], [`Dst::raw`]),
//!   and registered buffers ([`Registered`], CoGA's `coGA_Reg`).
//! - Atomic accumulates: a per-owner bakery lock over heap words ([`lock`] says why).
//! - Short messages ([`message`], CoGA's `sendMsg`/`recvMsg`).
//!
//! Bad input gets a [`GaError`] before any byte moves: a section outside the array, a
//! buffer of another element type, a destroyed array, a buffer too small for the section.
//!
//! ```no_run
//! use gpulmt::Context;
//! use gpulmt_ga::{ElemType, GlobalArray, Layout, Section};
//!
//! let mut ctx = Context::init()?;
//! let mut a = GlobalArray::create(&mut ctx, ElemType::F64, [100, 100], Layout::Block)?;
//! let s = Section::new([10, 20], [12, 25]); // rows 10..12, columns 20..25
//! if ctx.rank() == 0 {
//!     let v: Vec<f64> = (0..10).map(f64::from).collect();
//!     a.put(&ctx, s, &v, 5)?; // leading dimension 5
//! }
//! a.sync(&mut ctx)?;
//! let mut back = vec![0.0f64; 10];
//! a.get(&ctx, s, &mut back, 5)?;
//! a.destroy(&mut ctx)?;
//! ctx.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod array;
pub mod buffer;
pub mod element;
pub mod error;
pub mod handle;
pub mod lock;
pub mod message;
pub mod section;

pub use array::{GlobalArray, CREATE_TAG};
pub use buffer::{Dst, Registered, Src};
pub use element::{ElemType, Element};
pub use error::{GaError, Result};
pub use handle::{Handle, Pending};
pub use message::{recv_msg, send_msg, MSG_TAG};
pub use section::{Distribution, Layout, Piece, Section};
