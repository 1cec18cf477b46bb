//! Test data and buffers: buffer placements (host or device memory), deterministic
//! message contents, and [`Buf`], a buffer between guard bytes whose contents a rank
//! checks byte for byte after a transfer.

use gpulmt::device::AllocKind;
use gpulmt::Context;

use crate::report::{fail, OrFail};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Host,
    Dev,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Host => "H",
            Kind::Dev => "D",
        })
    }
}

/// How a device buffer is allocated: its kind, and for VMM memory its chunks.
#[derive(Clone, Copy, Debug)]
pub struct Mem {
    pub kind: AllocKind,
    pub chunks: u32,
}

impl Default for Mem {
    fn default() -> Mem {
        Mem { kind: AllocKind::Legacy, chunks: 1 }
    }
}

/// A kind of device memory by name (`legacy`, `pool`, `pool-ipc`, `vmm`, `vmm-ipc`,
/// `managed`), VMM ones with `:CHUNKS` (`vmm-ipc:3`).
pub fn parse_mem(s: &str) -> Mem {
    let (name, chunks) = s.split_once(':').unwrap_or((s, "1"));
    let kind = AllocKind::from_name(name).unwrap_or_else(|| {
        let names: Vec<&str> = AllocKind::NAMES.iter().map(|(n, _)| *n).collect();
        fail(format!("memory kind {s:?}: expected one of {}", names.join(", ")))
    });
    let chunks = chunks.parse().unwrap_or_else(|_| fail(format!("memory kind {s:?}: chunks must be a number")));
    Mem { kind, chunks }
}

pub fn parse_placement(s: &str) -> (Kind, Kind) {
    let ks: Vec<Kind> = s
        .chars()
        .filter(|c| !c.is_whitespace() && *c != ',' && *c != '-')
        .map(|c| match c.to_ascii_uppercase() {
            'D' => Kind::Dev,
            'H' => Kind::Host,
            _ => fail(format!("placement {s:?}: expected two of D (device) / H (host), e.g. \"D H\"")),
        })
        .collect();
    ensure!(ks.len() == 2, "placement {s:?}: expected two of D / H, e.g. \"D H\"");
    (ks[0], ks[1])
}

pub fn parse_size(s: &str) -> usize {
    gpulmt::config::parse_size(s).unwrap_or_else(|| fail(format!("{s:?} is not a size"))) as usize
}

pub fn parse_sizes(s: &str) -> Vec<usize> {
    s.split(',').filter(|t| !t.trim().is_empty()).map(parse_size).collect()
}

/// Deterministic pseudo-random bytes (splitmix64) from `seed`.
pub fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n.next_multiple_of(8)];
    let mut s = seed ^ 0x6a09_e667_f3bc_c908;
    for c in v.chunks_exact_mut(8) {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        c.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Seed of the message `src -> dst` of iteration `iter` (alltoall, free...).
pub fn msg_seed(src: u32, dst: u32, iter: u32, salt: u64) -> u64 {
    ((src as u64) << 48) ^ ((dst as u64) << 32) ^ ((iter as u64) << 8) ^ salt.wrapping_mul(0x1000_0000_01b3)
}

/// Index of the first byte of `a` that is not `v`.
pub fn first_not(a: &[u8], v: u8) -> Option<usize> {
    // Compare against a filled buffer: memcmp is fast even in debug builds.
    if a == vec![v; a.len()].as_slice() {
        None
    } else {
        a.iter().position(|&b| b != v)
    }
}

pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        None
    } else {
        Some(a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len())))
    }
}

pub const GUARD_SEND: u8 = 0xa5;
pub const GUARD_RECV: u8 = 0x5a;

/// A buffer of `len` bytes at offset `off` of an allocation of `len + 2*off` bytes
/// (device memory from `mem_alloc`, or a host Vec); the bytes around it are guards.
pub struct Buf {
    pub kind: Kind,
    pub host: Vec<u8>,
    pub dev: usize,
    pub total: usize,
    pub off: usize,
    pub len: usize,
}

impl Buf {
    pub fn new(ctx: &mut Context, kind: Kind, len: usize, off: usize, guard: u8) -> Buf {
        Self::new_as(ctx, kind, Mem::default(), len, off, guard)
    }

    /// [`new`](Self::new) with device memory of kind `mem` (the allocation of a pool, VMM
    /// chunks, managed memory).
    pub fn new_as(ctx: &mut Context, kind: Kind, mem: Mem, len: usize, off: usize, guard: u8) -> Buf {
        let total = len + 2 * off;
        let mut b = match kind {
            Kind::Host => Buf { kind, host: vec![guard; total], dev: 0, total, off, len },
            Kind::Dev => {
                let dev = ctx.mem_alloc_as(total, mem.kind, mem.chunks).or_fail(format!(
                    "mem_alloc_as({total}, {}, {} chunks)",
                    mem.kind.name(),
                    mem.chunks
                ));
                Buf { kind, host: Vec::new(), dev, total, off, len }
            }
        };
        if kind == Kind::Dev {
            b.fill(ctx, guard);
        }
        b
    }

    /// Sets every byte of the allocation to `v`.
    pub fn fill(&mut self, ctx: &Context, v: u8) {
        match self.kind {
            Kind::Host => self.host.fill(v),
            Kind::Dev if self.total > 0 => {
                let tmp = vec![v; self.total];
                // SAFETY: `dev` is this buffer's allocation of `total` bytes from mem_alloc, and
                // `&mut self` means no transfer of it is running.
                unsafe { ctx.copy_sync(self.dev, tmp.as_ptr() as usize, self.total) }.or_fail("copy_sync to device");
            }
            Kind::Dev => {}
        }
    }

    pub fn ptr(&mut self) -> *mut u8 {
        match self.kind {
            // SAFETY: off <= total, inside (or one past) the Vec.
            Kind::Host => unsafe { self.host.as_mut_ptr().add(self.off) },
            Kind::Dev => (self.dev + self.off) as *mut u8,
        }
    }

    /// The whole allocation, guards included, as host bytes.
    pub fn whole(&self, ctx: &Context) -> Vec<u8> {
        match self.kind {
            Kind::Host => self.host.clone(),
            Kind::Dev => {
                let mut v = vec![0u8; self.total];
                if self.total > 0 {
                    // SAFETY: `dev` is this buffer's allocation of `total` bytes from mem_alloc;
                    // callers read it between transfers.
                    unsafe { ctx.copy_sync(v.as_mut_ptr() as usize, self.dev, self.total) }
                        .or_fail("copy_sync from device");
                }
                v
            }
        }
    }

    /// Writes `data` at the buffer's start.
    pub fn write(&mut self, ctx: &Context, data: &[u8]) {
        ensure!(data.len() <= self.len, "internal: {} bytes written into a {}-byte buffer", data.len(), self.len);
        match self.kind {
            Kind::Host => self.host[self.off..self.off + data.len()].copy_from_slice(data),
            Kind::Dev if !data.is_empty() => {
                // SAFETY: `data.len() <= len` (checked above) bytes at `off` of this buffer's
                // allocation of `len + 2 * off` bytes, with no transfer running (`&mut self`).
                unsafe { ctx.copy_sync(self.dev + self.off, data.as_ptr() as usize, data.len()) }
                    .or_fail("copy_sync to device")
            }
            Kind::Dev => {}
        }
    }

    /// Checks that the buffer starts with `expect` and that every other byte of the
    /// allocation (guards, and the buffer's tail past the message) is still `guard`.
    pub fn verify(&self, ctx: &Context, expect: &[u8], guard: u8, what: &str) {
        let w = self.whole(ctx);
        let (off, n) = (self.off, expect.len());
        let kind = self.kind;
        if let Some(i) = first_not(&w[..off], guard) {
            fail(format!(
                "{what}: guard byte {} before the {kind} buffer was overwritten ({:#04x}, expected {guard:#04x})",
                off - i,
                w[i]
            ));
        }
        if let Some(i) = first_diff(&w[off..off + n], expect) {
            let bad = w[off..off + n].iter().zip(expect).filter(|(a, b)| a != b).count();
            fail(format!(
                "{what}: {kind} data differs at byte {i} of {n}: got {:#04x}, expected {:#04x} ({bad} bytes differ)",
                w[off + i],
                expect[i]
            ));
        }
        if let Some(i) = first_not(&w[off + n..], guard) {
            fail(format!(
                "{what}: byte {} past the {n}-byte message in the {kind} buffer (of {} bytes + {} guard) was overwritten ({:#04x}, expected {guard:#04x})",
                i,
                self.len,
                off,
                w[off + n + i]
            ));
        }
    }

    /// Marks device memory for the next `mem_free_commit`.
    pub fn release(self, ctx: &mut Context) {
        if self.kind == Kind::Dev {
            ctx.mem_free(self.dev).or_fail("mem_free");
        }
    }
}
