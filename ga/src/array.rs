//! [`GlobalArray`]: create and destroy (collective), queries, and the one-sided put, get
//! and accumulate on sections, blocking and not, with fence and sync.
//!
//! Memory: one symmetric allocation per array, the same size on every rank (the largest
//! local matrix, since the heap is symmetric): the owner lock's words
//! ([`crate::lock`]), then the rank's local matrix, row-major.
//!
//! A section's transfer: [`Distribution::locate`] splits it per owner tile; each piece is
//! one strided block on both sides (its rows in the owner's local matrix, and in the
//! caller's buffer with its leading dimension), moved by one 2-D heap copy
//! (`sym_put_2d`/`sym_get_2d`: one `cuMemcpy2D` to a mapped heap on CUDA; a queue packet
//! per row to a PE of another node). Remote owners go first, the local one last, as Global
//! Arrays orders them, so that the local copy overlaps the remote ones' completion.
//!
//! Ordering (CoGA's rules): blocking operations are complete when they return.
//! Non-blocking puts and gets return once issued (the heap's `_nbi` 2-D copies) and
//! complete at the heap's quiet; an operation on a section that overlaps one still in
//! flight is ordered after it ([`crate::handle`] says how). [`GlobalArray::fence`] is the
//! heap's quiet, and [`GlobalArray::sync`] a fence on every rank followed by a barrier.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gpulmt::context::TAG_UB;
use gpulmt::sym::Copy2d;
use gpulmt::{Context, Rank, SymPtr, Tag};

use crate::buffer::{Dst, Src};
use crate::element::{ElemType, Element};
use crate::error::{GaError, Result};
use crate::handle::{self, Handle, NbState};
use crate::lock::{lock_bytes, OwnerLock};
use crate::section::{Distribution, Layout, Piece, Section};

/// The tag of the layer's collective agreement at create: the second-highest user tag
/// (applications using the layer leave it alone, and [`crate::MSG_TAG`]).
pub const CREATE_TAG: Tag = TAG_UB - 2;

/// The direction of a transfer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// From the local buffer into the array.
    Put,
    /// From the array into the local buffer.
    Get,
}

/// Ids of arrays, in creation order (the same on every rank, creation being collective).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A 2-D array distributed over the ranks, read and written by sections.
///
/// Created and destroyed collectively; [`destroy`](Self::destroy) takes `&mut self` (the
/// free is collective, so it cannot happen in `Drop`) and any later call on the array is
/// refused with [`GaError::Destroyed`]. An array dropped without `destroy` keeps its heap
/// memory until the context finalizes.
#[derive(Debug)]
pub struct GlobalArray {
    id: u64,
    ty: ElemType,
    dist: Distribution,
    mem: Option<SymPtr>,
    ranks: u32,
    me: Rank,
    /// Shared with the array's non-blocking handles.
    nb: Arc<Mutex<NbState>>,
}

/// The create arguments every rank must give alike.
fn encode_create(ty: ElemType, dims: [usize; 2], layout: Layout) -> [u64; 8] {
    let (kind, a, b) = match layout {
        Layout::Block => (0, [0, 0], [0, 0]),
        Layout::BlockCyclic { block } => (1, block, [0, 0]),
        Layout::Grid { grid, block } => (2, grid, block.unwrap_or([0, 0])),
    };
    [ty as u64, kind, dims[0] as u64, dims[1] as u64, a[0] as u64, a[1] as u64, b[0] as u64, b[1] as u64]
}

impl GlobalArray {
    /// Collective: every rank calls it with the same arguments, in the same order as its
    /// other collective calls. Allocates each rank's local matrix in the symmetric heap,
    /// zeroed. Fails on every rank alike when the ranks' arguments differ, the layout is
    /// invalid or the heap has no room (`GPULMT_SYM_HEAP` sets its size).
    pub fn create(ctx: &mut Context, ty: ElemType, dims: [usize; 2], layout: Layout) -> Result<GlobalArray> {
        let mine = encode_create(ty, dims, layout);
        let all = allgather_words(ctx, &mine)?;
        if let Some(r) = all.iter().position(|w| *w != mine) {
            return Err(GaError::InvalidArgument(format!(
                "GlobalArray::create is collective: rank {} asked for {ty} {dims:?} {layout:?} ({mine:?}) and rank \
                 {r} for {:?}; every rank must pass the same type, dims and layout",
                ctx.rank(),
                all[r]
            )));
        }
        let (ranks, me) = (ctx.size(), ctx.rank());
        let dist = Distribution::new(dims, ranks, layout)?;
        let bytes = lock_bytes(ranks) + dist.max_local_len(ranks).max(1) * ty.size();
        let mem = ctx.sym_alloc(bytes)?;
        let zeros = vec![0u8; bytes];
        // SAFETY: `zeros` is a host buffer of `bytes` bytes, alive for the call.
        let cleared = unsafe { ctx.sym_put(mem.addr(), zeros.as_ptr(), bytes, me) };
        // Every rank clears its own part before any rank may use the array.
        let synced = ctx.barrier();
        if let Err(e) = cleared.and(synced) {
            let _ = ctx.sym_free(mem);
            return Err(e.into());
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let nb = Arc::new(Mutex::new(NbState { array: id, ..NbState::default() }));
        Ok(GlobalArray { id, ty, dist, mem: Some(mem), ranks, me, nb })
    }

    /// Collective: completes every rank's operations on the array (a [`sync`](Self::sync))
    /// and frees it on every rank. Later calls on it fail with [`GaError::Destroyed`].
    pub fn destroy(&mut self, ctx: &mut Context) -> Result<()> {
        let mem = self.mem.ok_or(GaError::Destroyed { array: self.id })?;
        self.sync(ctx)?;
        self.mem = None;
        handle::lock(&self.nb).destroyed = true;
        Ok(ctx.sym_free(mem)?)
    }

    /// The array's number (per process, in creation order: the same on every rank).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its element type.
    pub fn elem_type(&self) -> ElemType {
        self.ty
    }

    /// Rows and columns.
    pub fn dims(&self) -> [usize; 2] {
        self.dist.dims()
    }

    /// How it is spread over the ranks.
    pub fn layout(&self) -> &Distribution {
        &self.dist
    }

    /// Whether [`destroy`](Self::destroy) has been called.
    pub fn is_destroyed(&self) -> bool {
        self.mem.is_none()
    }

    /// The sections `rank` owns (Global Arrays' `NGA_Distribution`): one with
    /// [`Layout::Block`], one per tile with block-cyclic layouts, none for a rank that
    /// owns nothing.
    pub fn distribution(&self, rank: Rank) -> Result<Vec<Section>> {
        self.alive()?;
        if rank >= self.ranks {
            return Err(GaError::InvalidArgument(format!("rank {rank} is not in this job of {} ranks", self.ranks)));
        }
        Ok(self.dist.sections_of(rank))
    }

    /// The owners of `section`'s elements and the part each owns (Global Arrays'
    /// `NGA_Locate_region`), one entry per owner tile, row-major over the tiles.
    pub fn locate(&self, section: Section) -> Result<Vec<(Rank, Section)>> {
        self.alive()?;
        self.in_bounds(&section)?;
        Ok(self.dist.locate(&section).into_iter().map(|p| (p.rank, p.section)).collect())
    }

    /// This rank's local matrix (CoGA's `coGA_GetLocalBuffer`): its symmetric address
    /// (device memory on CUDA) and its rows and columns, row-major with no padding.
    pub fn local(&self) -> Result<(usize, [usize; 2])> {
        let mem = self.alive()?;
        Ok((mem.addr() + lock_bytes(self.ranks), self.dist.local_dims(self.me)))
    }

    /// Writes `section` from `src` (row `i` of the section at `src[i * ld..]`); complete
    /// at the owners on return.
    pub fn put<'a, T: Element>(
        &self,
        ctx: &Context,
        section: Section,
        src: impl Into<Src<'a, T>>,
        ld: usize,
    ) -> Result<()> {
        let src = src.into();
        // SAFETY: `Src` keeps the buffer readable for 'a, which outlives this call, and the
        // copies are complete when it returns.
        unsafe { self.transfer::<T>(ctx, Dir::Put, section, (src.addr, src.len), ld, true) }
    }

    /// Reads `section` into `dst` (row `i` of the section at `dst[i * ld..]`); complete
    /// on return.
    pub fn get<'a, T: Element>(
        &self,
        ctx: &Context,
        section: Section,
        dst: impl Into<Dst<'a, T>>,
        ld: usize,
    ) -> Result<()> {
        let dst = dst.into();
        // SAFETY: `Dst` keeps the buffer writable and unshared for 'a, which outlives this
        // call, and the copies are complete when it returns.
        unsafe { self.transfer::<T>(ctx, Dir::Get, section, (dst.addr, dst.len), ld, true) }
    }

    /// A put or get of `section` between the local buffer `(addr, len)` (elements) and
    /// the owners: checked whole, then one 2-D heap copy per owner tile, remote owners
    /// first. With `wait`, complete on return; else issued, complete at the next quiet.
    ///
    /// # Safety
    /// The buffer is valid for the copies (readable for a put, writable and unused for a
    /// get) until they complete.
    unsafe fn transfer<T: Element>(
        &self,
        ctx: &Context,
        dir: Dir,
        section: Section,
        (addr, len): (usize, usize),
        ld: usize,
        wait: bool,
    ) -> Result<()> {
        let what = match (dir, wait) {
            (Dir::Put, true) => "put",
            (Dir::Put, false) => "put_nb",
            (Dir::Get, true) => "get",
            (Dir::Get, false) => "get_nb",
        };
        let pieces = self.check::<T>(what, &section, len, ld)?;
        let mut nb = handle::lock(&self.nb);
        nb.order_before(ctx, &section);
        let sz = T::TYPE.size();
        for p in &pieces {
            let (remote, pitch) = self.remote(p);
            let local = addr + ((p.section.lo[0] - section.lo[0]) * ld + p.section.lo[1] - section.lo[1]) * sz;
            let (width, height) = (p.section.cols() * sz, p.section.rows());
            let (put_shape, get_shape) = (
                Copy2d { width, height, dst_pitch: pitch, src_pitch: ld * sz },
                Copy2d { width, height, dst_pitch: ld * sz, src_pitch: pitch },
            );
            let (to, from) = (local as *mut u8, local as *const u8);
            // SAFETY: the piece's rows lie inside the caller's buffer (check measured it
            // against the section and ld), valid as this function's contract says (until
            // the quiet for the `_nbi` forms); the heap checks the heap's rows.
            unsafe {
                match (dir, wait) {
                    (Dir::Put, true) => ctx.sym_put_2d(remote, from, put_shape, p.rank)?,
                    (Dir::Put, false) => ctx.sym_put_2d_nbi(remote, from, put_shape, p.rank)?,
                    (Dir::Get, true) => ctx.sym_get_2d(to, remote, get_shape, p.rank)?,
                    (Dir::Get, false) => ctx.sym_get_2d_nbi(to, remote, get_shape, p.rank)?,
                }
            }
        }
        if !wait && !pieces.is_empty() {
            nb.pending.push(section);
        }
        Ok(())
    }

    /// Adds `scale * src` to `section`, element by element, atomically per element
    /// against other accumulates (each owner's part under its owner lock); complete at the
    /// owners on return.
    pub fn acc<'a, T: Element>(
        &self,
        ctx: &Context,
        section: Section,
        src: impl Into<Src<'a, T>>,
        ld: usize,
        scale: T,
    ) -> Result<()> {
        let src = src.into();
        let pieces = self.check::<T>("acc", &section, src.len, ld)?;
        if pieces.is_empty() {
            return Ok(());
        }
        handle::lock(&self.nb).order_before(ctx, &section);
        // The source in host memory, wherever it lives: one copy of its span.
        let span = (section.rows() - 1) * ld + section.cols();
        let mut x = vec![T::default(); span];
        // SAFETY: `x` holds `span` elements; the source's span is inside the caller's
        // buffer (check), readable for the call.
        unsafe { ctx.copy_sync(x.as_mut_ptr() as usize, src.addr, span * T::TYPE.size())? };
        let mem = self.alive()?;
        let mut start = 0;
        while start < pieces.len() {
            let owner = pieces[start].rank;
            let end = pieces[start..].iter().position(|p| p.rank != owner).map_or(pieces.len(), |k| start + k);
            let lock = OwnerLock { base: mem.addr(), owner };
            lock.acquire(ctx)?;
            let updated = pieces[start..end].iter().try_for_each(|p| self.acc_piece(ctx, &section, p, &x, ld, scale));
            let released = lock.release(ctx);
            updated?;
            released?;
            start = end;
        }
        Ok(())
    }

    /// One piece of an accumulate, under its owner's lock: get, update, put back.
    fn acc_piece<T: Element>(&self, ctx: &Context, s: &Section, p: &Piece, x: &[T], ld: usize, scale: T) -> Result<()> {
        let (remote, pitch) = self.remote(p);
        let (rows, cols, sz) = (p.section.rows(), p.section.cols(), T::TYPE.size());
        let mut block = vec![T::default(); rows * cols];
        let into_block = Copy2d { width: cols * sz, height: rows, dst_pitch: cols * sz, src_pitch: pitch };
        // SAFETY: `block` is a host buffer of rows * cols elements, rows of `cols`.
        unsafe { ctx.sym_get_2d(block.as_mut_ptr() as *mut u8, remote, into_block, p.rank)? };
        let (r0, c0) = (p.section.lo[0] - s.lo[0], p.section.lo[1] - s.lo[1]);
        for i in 0..rows {
            let from = &x[(r0 + i) * ld + c0..][..cols];
            for (b, v) in block[i * cols..][..cols].iter_mut().zip(from) {
                *b = b.accumulate(scale, *v);
            }
        }
        let from_block = Copy2d { dst_pitch: pitch, src_pitch: cols * sz, ..into_block };
        // SAFETY: as the get, in the other direction.
        unsafe { ctx.sym_put_2d(remote, block.as_ptr() as *const u8, from_block, p.rank)? };
        Ok(())
    }

    /// [`put`](Self::put) that returns once issued, with a handle to wait on; the
    /// buffer stays borrowed until then ([`crate::handle`] says how it completes).
    pub fn put_nb<'a, T: Element>(
        &self,
        ctx: &'a Context,
        section: Section,
        src: Src<'a, T>,
        ld: usize,
    ) -> Result<Handle<'a>> {
        let issued_at = handle::lock(&self.nb).quiets;
        // SAFETY: the handle borrows the buffer for 'a and, waited or dropped, completes
        // the copies before that borrow ends.
        unsafe { self.transfer::<T>(ctx, Dir::Put, section, (src.addr, src.len), ld, false)? };
        Ok(Handle::new(ctx, &self.nb, Some(issued_at)))
    }

    /// [`get`](Self::get) that returns once issued, with a handle to wait on; the buffer
    /// stays borrowed, and holds the section, once the handle is waited on.
    pub fn get_nb<'a, T: Element>(
        &self,
        ctx: &'a Context,
        section: Section,
        dst: Dst<'a, T>,
        ld: usize,
    ) -> Result<Handle<'a>> {
        let issued_at = handle::lock(&self.nb).quiets;
        // SAFETY: as in put_nb.
        unsafe { self.transfer::<T>(ctx, Dir::Get, section, (dst.addr, dst.len), ld, false)? };
        Ok(Handle::new(ctx, &self.nb, Some(issued_at)))
    }

    /// [`acc`](Self::acc), returning a handle to wait on. The accumulate is complete when
    /// this returns: its read, update and write run under the owner's lock, which is
    /// released only once the write landed, so the call cannot return before.
    pub fn acc_nb<'a, T: Element>(
        &self,
        ctx: &'a Context,
        section: Section,
        src: Src<'a, T>,
        ld: usize,
        scale: T,
    ) -> Result<Handle<'a>> {
        self.acc(ctx, section, src, ld, scale)?;
        Ok(Handle::new(ctx, &self.nb, None))
    }

    /// Local: waits until every operation this rank issued is complete at its target.
    pub fn fence(&self, ctx: &Context) -> Result<()> {
        self.alive()?;
        handle::lock(&self.nb).quiet(ctx)
    }

    /// Collective: every rank's operations are complete everywhere, then a barrier.
    pub fn sync(&self, ctx: &mut Context) -> Result<()> {
        self.fence(ctx)?;
        Ok(ctx.barrier()?)
    }

    /// The allocation, unless destroyed.
    fn alive(&self) -> Result<SymPtr> {
        self.mem.ok_or(GaError::Destroyed { array: self.id })
    }

    fn in_bounds(&self, s: &Section) -> Result<()> {
        if self.dist.contains(s) {
            Ok(())
        } else {
            Err(GaError::OutOfBounds { array: self.id, section: *s, dims: self.dims() })
        }
    }

    /// Every check of an operation, before any byte moves; returns its pieces, remote
    /// owners first.
    fn check<T: Element>(&self, what: &'static str, s: &Section, buf_len: usize, ld: usize) -> Result<Vec<Piece>> {
        self.alive()?;
        if T::TYPE != self.ty {
            return Err(GaError::TypeMismatch { array: self.id, array_type: self.ty, given: T::TYPE });
        }
        self.in_bounds(s)?;
        if s.is_empty() {
            return Ok(Vec::new());
        }
        if ld < s.cols() {
            return Err(GaError::InvalidArgument(format!(
                "{what}: leading dimension {ld} is less than the section's {} columns",
                s.cols()
            )));
        }
        // The caller's rows, in elements and bytes: checked, since ld and the section
        // come from the caller (an overflow would wrap to a small span).
        let needed = (s.rows() - 1)
            .checked_mul(ld)
            .and_then(|n| n.checked_add(s.cols()))
            .filter(|n| n.checked_mul(T::TYPE.size()).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| {
                GaError::InvalidArgument(format!(
                    "{what}: {} rows {ld} elements apart exceed the address space",
                    s.rows()
                ))
            })?;
        if buf_len < needed {
            return Err(GaError::BufferTooSmall { what, needed, given: buf_len, ld });
        }
        let mut pieces = self.dist.locate(s);
        pieces.sort_by_key(|p| p.rank == self.me);
        Ok(pieces)
    }

    /// A piece's first element on its owner (symmetric address) and the owner's row pitch
    /// in bytes.
    fn remote(&self, p: &Piece) -> (usize, usize) {
        let mem = self.mem.expect("checked alive");
        let lcols = self.dist.local_dims(p.rank)[1];
        let sz = self.ty.size();
        (mem.addr() + lock_bytes(self.ranks) + (p.local[0] * lcols + p.local[1]) * sz, lcols * sz)
    }
}

/// Every rank's `mine`, in rank order (the context's messages on [`CREATE_TAG`]).
fn allgather_words(ctx: &mut Context, mine: &[u64; 8]) -> Result<Vec<[u64; 8]>> {
    let (me, n) = (ctx.rank(), ctx.size());
    let mut all = vec![[0u64; 8]; n as usize];
    let mut reqs = Vec::new();
    for (r, buf) in all.iter_mut().enumerate().filter(|(r, _)| *r as Rank != me) {
        // SAFETY: `buf` is 64 host bytes that outlive the request (wait_all below).
        reqs.push(unsafe { ctx.irecv(buf.as_mut_ptr() as *mut u8, 64, Some(r as Rank), Some(CREATE_TAG))? });
    }
    for r in (0..n).filter(|&r| r != me) {
        // SAFETY: `mine` outlives the request (wait_all below).
        reqs.push(unsafe { ctx.isend(mine.as_ptr() as *const u8, 64, r, CREATE_TAG)? });
    }
    ctx.wait_all(reqs)?;
    all[me as usize] = *mine;
    Ok(all)
}
