//! Local buffers: where a put reads and a get writes, in host memory or in device memory
//! of the rank's backend, and registered buffers (CoGA's `coGA_Reg`).
//!
//! [`Src`] and [`Dst`] borrow the buffer for as long as the operation (or its
//! non-blocking handle) lives, so that safe code cannot touch it while it moves.
//! Device memory comes in through the unsafe constructors, whose callers promise the same.

use std::marker::PhantomData;

use gpulmt::device::Backend;
use gpulmt::Context;

use crate::element::Element;
use crate::error::{GaError, Result};

/// What a put or an accumulate reads: `len` elements of `T` at `addr`.
#[derive(Clone, Copy, Debug)]
pub struct Src<'a, T> {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    _borrow: PhantomData<&'a [T]>,
}

impl<'a, T: Element> Src<'a, T> {
    /// A host slice.
    pub fn host(s: &'a [T]) -> Self {
        Src { addr: s.as_ptr() as usize, len: s.len(), _borrow: PhantomData }
    }

    /// `len` elements at `ptr`: host memory, or device memory of this rank's backend.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be readable for `'a`, with nothing writing it meanwhile.
    pub unsafe fn raw(ptr: *const T, len: usize) -> Self {
        Src { addr: ptr as usize, len, _borrow: PhantomData }
    }
}

impl<'a, T: Element> From<&'a [T]> for Src<'a, T> {
    fn from(s: &'a [T]) -> Self {
        Src::host(s)
    }
}

impl<'a, T: Element> From<&'a Vec<T>> for Src<'a, T> {
    fn from(s: &'a Vec<T>) -> Self {
        Src::host(s)
    }
}

impl<'a, T: Element> From<&'a Registered<T>> for Src<'a, T> {
    fn from(r: &'a Registered<T>) -> Self {
        Src { addr: r.host, len: r.len, _borrow: PhantomData }
    }
}

/// What a get writes: `len` elements of `T` at `addr`.
#[derive(Debug)]
pub struct Dst<'a, T> {
    pub(crate) addr: usize,
    pub(crate) len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

impl<'a, T: Element> Dst<'a, T> {
    /// A host slice.
    pub fn host(s: &'a mut [T]) -> Self {
        Dst { addr: s.as_mut_ptr() as usize, len: s.len(), _borrow: PhantomData }
    }

    /// `len` elements at `ptr`: host memory, or device memory of this rank's backend.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be writable for `'a`, with nothing else accessing it meanwhile.
    pub unsafe fn raw(ptr: *mut T, len: usize) -> Self {
        Dst { addr: ptr as usize, len, _borrow: PhantomData }
    }
}

impl<'a, T: Element> From<&'a mut [T]> for Dst<'a, T> {
    fn from(s: &'a mut [T]) -> Self {
        Dst::host(s)
    }
}

impl<'a, T: Element> From<&'a mut Vec<T>> for Dst<'a, T> {
    fn from(s: &'a mut Vec<T>) -> Self {
        Dst::host(s)
    }
}

impl<'a, T: Element> From<&'a mut Registered<T>> for Dst<'a, T> {
    fn from(r: &'a mut Registered<T>) -> Self {
        Dst { addr: r.host, len: r.len, _borrow: PhantomData }
    }
}

/// A registered local buffer (CoGA's `coGA_Reg`): host memory pinned and mapped for the
/// devices once, at creation, so that later puts and gets from it go straight to the
/// copy engines, with no staging of pageable memory and no registration per call.
/// Zeroed at creation; freed when dropped.
pub struct Registered<T: Element> {
    backend: Backend,
    host: usize,
    len: usize,
    _elems: PhantomData<T>,
}

impl<T: Element> Registered<T> {
    /// `len` zeroed elements of pinned host memory.
    pub fn new(ctx: &Context, len: usize) -> Result<Self> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                GaError::InvalidArgument(format!("a registered buffer of {len} elements exceeds the address space"))
            })?
            .max(1);
        let m = ctx.backend().alloc_host_mapped(bytes).map_err(gpulmt::Error::from)?;
        Ok(Registered { backend: ctx.backend().clone(), host: m.host, len, _elems: PhantomData })
    }

    /// Elements it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Element> std::ops::Deref for Registered<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `host` is a live, page-aligned allocation of at least `len` elements,
        // zeroed at creation (every bit pattern is a valid f32, f64, i32 or i64), and
        // the borrow of `self` keeps operations from writing it meanwhile.
        unsafe { std::slice::from_raw_parts(self.host as *const T, self.len) }
    }
}

impl<T: Element> std::ops::DerefMut for Registered<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in deref; the mutable borrow is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.host as *mut T, self.len) }
    }
}

impl<T: Element> Drop for Registered<T> {
    fn drop(&mut self) {
        // SAFETY: our allocation; every operation that used it borrowed it and completed
        // before the borrow ended, so no copy is in flight.
        if let Err(e) = unsafe { self.backend.free_host_mapped(self.host) } {
            tracing::warn!(error = %e, "freeing a registered buffer");
        }
    }
}
