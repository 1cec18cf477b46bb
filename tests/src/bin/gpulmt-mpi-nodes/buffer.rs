//! Message buffers in host or device memory at an offset, their byte patterns, and the
//! job-wide failure report.

use gpulmt::mpi::rsmpi::traits::Communicator;
use gpulmt::{Context, Rank};

/// Byte offset of each message within its buffer.
pub const OFFSET: usize = 3;
/// What the bytes around a received message hold before the receive.
pub const GUARD: u8 = 0xee;
/// Guard bytes checked past a message (fewer where the buffer ends first): a page, so
/// that a write rounded up to a page or a chunk shows, while a small message in a large
/// buffer does not cost a write and a read of the whole buffer (64 MiB in the rings).
const TAIL: usize = 4096;

/// Reports a failure and aborts the whole job (the other ranks may be waiting for us).
pub fn fail(rank: Rank, what: String) -> ! {
    eprintln!("FAIL: rank {rank}: {what}");
    gpulmt::mpi::rsmpi::topology::SimpleCommunicator::world().abort(1)
}

/// Unwraps a gpulmt result or fails the job with what was being done.
pub trait OrFail<T> {
    fn or_fail(self, rank: Rank, what: impl FnOnce() -> String) -> T;
}

impl<T> OrFail<T> for gpulmt::Result<T> {
    fn or_fail(self, rank: Rank, what: impl FnOnce() -> String) -> T {
        self.unwrap_or_else(|e| fail(rank, format!("{}: {e}", what())))
    }
}

/// Bytes of the block a message repeats: a prime, so that a piece that lands at any
/// power-of-two distance from its place (a chunk, a page) shows.
const PERIOD: usize = 4099;

/// The byte `i` of the block of message `seed`.
fn pattern(seed: u64, i: usize) -> u8 {
    let x = (i as u64).wrapping_mul(0x9e37_79b9).wrapping_add(seed.wrapping_mul(0x2545_f491));
    (x ^ (x >> 13)) as u8
}

/// `len` bytes of message `seed` (sender, size, sequence... mixed by the caller): its
/// block, repeated (by copies, which stay fast in a debug build for 64 MiB).
pub fn message(seed: u64, len: usize) -> Vec<u8> {
    let block: Vec<u8> = (0..PERIOD.min(len)).map(|i| pattern(seed, i)).collect();
    let mut m = Vec::with_capacity(len);
    while m.len() < len {
        let n = (len - m.len()).min(block.len());
        m.extend_from_slice(&block[..n]);
    }
    m
}

/// "D" or "H".
pub fn kind(device: bool) -> &'static str {
    if device {
        "D"
    } else {
        "H"
    }
}

/// A buffer of `OFFSET + len + 1` bytes in host or device memory; the message lives at
/// `OFFSET`, the bytes around it are guards.
pub struct Buffer {
    pub ptr: usize,
    host: Option<Vec<u8>>,
    bytes: usize,
}

impl Buffer {
    /// A buffer for messages of up to `len` bytes.
    pub fn new(ctx: &mut Context, device: bool, len: usize) -> gpulmt::Result<Buffer> {
        let bytes = OFFSET + len + 1;
        if device {
            Ok(Buffer { ptr: ctx.mem_alloc(bytes)?, host: None, bytes })
        } else {
            let mut v = vec![0u8; bytes];
            Ok(Buffer { ptr: v.as_mut_ptr() as usize, host: Some(v), bytes })
        }
    }

    /// The message's address.
    pub fn at(&self) -> usize {
        self.ptr + OFFSET
    }

    /// Bytes that a message of `len` bytes and its guards span: the offset, the message,
    /// and up to [`TAIL`] bytes after it.
    fn window(&self, len: usize) -> usize {
        (OFFSET + len + TAIL).min(self.bytes)
    }

    /// Writes `data` at the message's place and guards around it.
    pub fn fill(&self, ctx: &Context, data: &[u8]) -> gpulmt::Result<()> {
        let mut all = vec![GUARD; self.window(data.len())];
        all[OFFSET..OFFSET + data.len()].copy_from_slice(data);
        // SAFETY: `all` is no longer than the buffer; no transfer uses the buffer now.
        unsafe { ctx.copy_sync(self.ptr, all.as_ptr() as usize, all.len()) }
    }

    /// Writes guards over the place of a message of up to `len` bytes and around it:
    /// a receive buffer before its receive.
    pub fn guard(&self, ctx: &Context, len: usize) -> gpulmt::Result<()> {
        let all = vec![GUARD; self.window(len)];
        // SAFETY: as for `fill`.
        unsafe { ctx.copy_sync(self.ptr, all.as_ptr() as usize, all.len()) }
    }

    /// The bytes of a message of up to `len` bytes and its guards, from the buffer's start.
    pub fn read(&self, ctx: &Context, len: usize) -> gpulmt::Result<Vec<u8>> {
        let mut out = vec![0u8; self.window(len)];
        // SAFETY: as for `fill`.
        unsafe { ctx.copy_sync(out.as_mut_ptr() as usize, self.ptr, out.len()) }?;
        Ok(out)
    }

    /// Checks that the buffer holds `want` at the message's place (the first `want.len()`
    /// bytes) and guards after `written` bytes (as far as [`Buffer::guard`] wrote them)
    /// and before the message; the error says where it differs.
    pub fn check(&self, ctx: &Context, want: &[u8], written: usize) -> gpulmt::Result<Result<(), String>> {
        let got = self.read(ctx, want.len().max(written))?;
        let msg = &got[OFFSET..OFFSET + want.len()];
        if msg != want {
            let i = (0..want.len()).find(|&i| msg[i] != want[i]).unwrap_or(0);
            return Ok(Err(format!("byte {i} of the message differs ({:#x}, not {:#x})", msg[i], want[i])));
        }
        if got[..OFFSET].iter().any(|&b| b != GUARD) {
            return Ok(Err("bytes before the message were written".into()));
        }
        if let Some(i) = got[OFFSET + written..].iter().position(|&b| b != GUARD) {
            return Ok(Err(format!("byte {} past the receive's {written} bytes was written", written + i)));
        }
        Ok(Ok(()))
    }

    /// Gives the memory back (device memory is released at finalize).
    pub fn release(self) {
        drop(self.host);
    }
}
