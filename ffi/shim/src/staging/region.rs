//! Which bytes of a buffer an MPI call touches, from the arguments that describe it: a
//! count of a datatype, per-rank counts and displacements in elements (the `v`
//! collectives), or per-rank counts, byte displacements and datatypes (`MPI_Alltoallw`).
//! Any datatype: a region is the span from the lowest byte to the highest one the call
//! may touch (gaps included), so staging it byte for byte keeps the layout the call
//! expects.

use std::ffi::c_int;

use mpi_sys::*;

use crate::raw::*;

/// What a call does with a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Reads it.
    In,
    /// Writes it.
    Out,
    /// Reads and then writes it (`MPI_IN_PLACE`).
    InOut,
}

/// How an argument describes a buffer's contents.
#[derive(Clone, Copy)]
pub enum Shape<'a> {
    /// `count` elements of `dt` (wider than a C int: `MPI_Reduce_scatter_block`'s send
    /// buffer holds a count per rank).
    Count { count: i64, dt: MPI_Datatype },
    /// One block per rank: `counts[i]` elements of `dt` starting `displs[i]` extents of
    /// `dt` from the buffer (`displs` `None`: blocks one after the other, as in
    /// `MPI_Reduce_scatter`).
    Blocks { counts: &'a [c_int], displs: Option<&'a [c_int]>, dt: MPI_Datatype },
    /// One block per rank: `counts[i]` elements of `types[i]` starting `displs[i]`
    /// bytes from the buffer (`MPI_Alltoallw`).
    Typed { counts: &'a [c_int], displs: &'a [c_int], types: &'a [MPI_Datatype] },
}

/// The bytes a call touches in one buffer: `[base + lo, base + hi)`, where `base` is
/// the pointer the call is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub base: usize,
    pub lo: isize,
    pub hi: isize,
    pub role: Role,
    /// Every byte of the span is data (no gaps): a buffer the call only writes needs
    /// nothing copied in first. With gaps it is copied in, so that staging it back
    /// leaves the gaps as they were.
    pub dense: bool,
}

impl Region {
    /// Bytes of the span (never 0: an empty region is `None` in [`Region::of`]).
    pub fn bytes(&self) -> usize {
        (self.hi - self.lo) as usize
    }

    /// First byte of the span.
    pub fn start(&self) -> usize {
        self.base.wrapping_add_signed(self.lo)
    }

    /// Whether the call reads the buffer (so it is staged in).
    pub fn read(&self) -> bool {
        self.role != Role::Out || !self.dense
    }

    /// Whether the call writes the buffer (so it is staged out).
    pub fn written(&self) -> bool {
        self.role != Role::In
    }

    /// The region `shape` describes at `base`; `None` when it holds no byte. An invalid
    /// datatype or count is the MPI library's to report: its error code.
    pub fn of(base: usize, shape: Shape<'_>, role: Role) -> Result<Option<Region>, c_int> {
        let mut span = Span::default();
        match shape {
            Shape::Count { count, dt } => span.add(0, count, &TypeShape::of(dt)?)?,
            Shape::Blocks { counts, displs, dt } => {
                let t = TypeShape::of(dt)?;
                let mut next = 0isize;
                for (i, &count) in counts.iter().enumerate() {
                    let at = match displs {
                        Some(d) => d[i] as isize * t.extent,
                        None => next,
                    };
                    span.add(at, count.into(), &t)?;
                    next = at + count.max(0) as isize * t.extent;
                }
            }
            Shape::Typed { counts, displs, types } => {
                for i in 0..counts.len() {
                    span.add(displs[i] as isize, counts[i].into(), &TypeShape::of(types[i])?)?;
                }
            }
        }
        Ok(span.region(base, role))
    }
}

/// A datatype's layout: size, extent, true lower bound and true extent.
struct TypeShape {
    size: isize,
    extent: isize,
    true_lb: isize,
    true_extent: isize,
}

impl TypeShape {
    fn of(dt: MPI_Datatype) -> Result<TypeShape, c_int> {
        let (mut size, mut lb, mut extent, mut tlb, mut text): (MPI_Count, MPI_Count, MPI_Count, MPI_Count, MPI_Count) =
            (0, 0, 0, 0, 0);
        // SAFETY: out-pointers to locals; an invalid datatype makes the library fail.
        unsafe {
            let rc = PMPI_Type_size_x(dt, &mut size);
            if rc != SUCCESS {
                return Err(rc);
            }
            PMPI_Type_get_extent_x(dt, &mut lb, &mut extent);
            PMPI_Type_get_true_extent_x(dt, &mut tlb, &mut text);
        }
        Ok(TypeShape {
            size: size as isize,
            extent: extent as isize,
            true_lb: tlb as isize,
            true_extent: text as isize,
        })
    }

    /// Whether `count` elements are their bytes and nothing else.
    fn packed(&self, count: i64) -> bool {
        self.size == self.true_extent && (count == 1 || self.extent == self.size)
    }
}

/// The union of blocks, and whether they are data without gaps or overlaps.
#[derive(Default)]
struct Span {
    bounds: Option<(isize, isize)>,
    /// Bytes of data in the blocks.
    data: isize,
    /// Every block so far is packed and starts where the previous one ended.
    dense: bool,
    /// End of the previous block.
    end: Option<isize>,
}

impl Span {
    /// The region of the blocks added so far; `None` when they hold no byte.
    fn region(&self, base: usize, role: Role) -> Option<Region> {
        let (lo, hi) = self.bounds?;
        Some(Region { base, lo, hi, role, dense: self.dense && self.data == hi - lo })
    }

    /// Adds `count` elements of `t` at byte offset `at`.
    fn add(&mut self, at: isize, count: i64, t: &TypeShape) -> Result<(), c_int> {
        if count < 0 {
            return Err(ERR_COUNT);
        }
        if count == 0 || t.size == 0 {
            return Ok(());
        }
        let step = (count as isize - 1).saturating_mul(t.extent);
        let lo = at + t.true_lb + step.min(0);
        let hi = at + t.true_lb + step.max(0) + t.true_extent;
        let first = self.bounds.is_none();
        self.dense = (first || self.dense) && t.packed(count) && self.end.is_none_or(|e| e == lo);
        self.end = Some(hi);
        self.data = self.data.saturating_add((count as isize).saturating_mul(t.size));
        self.bounds = Some(match self.bounds {
            None => (lo, hi),
            Some((l, h)) => (l.min(lo), h.max(hi)),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INT: TypeShape = TypeShape { size: 4, extent: 4, true_lb: 0, true_extent: 4 };
    /// Three blocks of two ints, stride three: 24 bytes of data in 32.
    const VECTOR: TypeShape = TypeShape { size: 24, extent: 32, true_lb: 0, true_extent: 32 };
    /// Two ints with a lower bound of -8 (data at -8..0).
    const SHIFTED: TypeShape = TypeShape { size: 8, extent: 8, true_lb: -8, true_extent: 8 };

    fn region(blocks: &[(isize, i64, &TypeShape)], role: Role) -> Option<Region> {
        let mut span = Span::default();
        for &(at, count, t) in blocks {
            span.add(at, count, t).expect("a valid count");
        }
        span.region(0x1000, role)
    }

    #[test]
    fn packed_elements_are_dense_and_an_output_of_them_is_not_read() {
        let r = region(&[(0, 5, &INT)], Role::Out).unwrap();
        assert_eq!((r.lo, r.hi, r.bytes(), r.start()), (0, 20, 20, 0x1000));
        assert!(r.dense && !r.read() && r.written());
        // Blocks one after the other, as Gather's receive buffer at the root.
        let r = region(&[(0, 3, &INT), (12, 2, &INT), (20, 1, &INT)], Role::Out).unwrap();
        assert!(r.dense && (r.lo, r.hi) == (0, 24));
    }

    #[test]
    fn gaps_between_or_inside_elements_make_an_output_read_first() {
        // Displacements with a gap of one int (Gatherv).
        let r = region(&[(0, 2, &INT), (12, 2, &INT)], Role::Out).unwrap();
        assert!(!r.dense && r.read() && (r.lo, r.hi) == (0, 20));
        // Gaps inside the type.
        let r = region(&[(0, 2, &VECTOR)], Role::Out).unwrap();
        assert!(!r.dense && r.read() && (r.lo, r.hi) == (0, 64));
        // Blocks out of rank order tile the span but are not seen as dense: read too (safe).
        assert!(!region(&[(8, 2, &INT), (0, 2, &INT)], Role::Out).unwrap().dense);
    }

    #[test]
    fn the_span_follows_lower_bounds_and_inputs_are_always_read() {
        let r = region(&[(0, 3, &SHIFTED)], Role::In).unwrap();
        assert_eq!((r.lo, r.hi, r.start()), (-8, 16, 0x1000 - 8));
        assert!(r.read() && !r.written());
        let r = region(&[(0, 1, &INT)], Role::InOut).unwrap();
        assert!(r.read() && r.written());
    }

    #[test]
    fn empty_blocks_make_no_region_and_negative_counts_are_refused() {
        assert_eq!(region(&[(0, 0, &INT), (64, 0, &VECTOR)], Role::Out), None);
        let empty = TypeShape { size: 0, extent: 0, true_lb: 0, true_extent: 0 };
        assert_eq!(region(&[(0, 9, &empty)], Role::In), None);
        assert_eq!(Span::default().add(0, -1, &INT), Err(ERR_COUNT));
    }
}
