//! Sections (Global Arrays' patches) and how an array is spread over the ranks: the
//! pure arithmetic of the layer, from a global element to its owner and its place in
//! the owner's local block, and from a section to the per-owner blocks that make it up.
//!
//! One scheme covers both distributions: the ranks form a `grid[0] x grid[1]` process
//! grid and the array is cut into `block[0] x block[1]` tiles dealt round-robin over it
//! (ScaLAPACK's block-cyclic layout). The block distribution is the case of one tile
//! per rank (`block = ceil(dims / grid)`). Each rank stores its tiles as one row-major
//! local matrix: its tile rows in global order, its tile columns likewise.

use crate::error::GaError;

/// A rectangular section of a 2-D array: rows `lo[0]..hi[0]` and columns
/// `lo[1]..hi[1]` (half-open, zero-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Section {
    pub lo: [usize; 2],
    pub hi: [usize; 2],
}

impl Section {
    /// Rows `lo[0]..hi[0]`, columns `lo[1]..hi[1]`.
    pub fn new(lo: [usize; 2], hi: [usize; 2]) -> Section {
        Section { lo, hi }
    }

    /// The whole of an array of `dims`.
    pub fn whole(dims: [usize; 2]) -> Section {
        Section { lo: [0, 0], hi: dims }
    }

    /// Rows it spans (0 when `hi[0] <= lo[0]`).
    pub fn rows(&self) -> usize {
        self.hi[0].saturating_sub(self.lo[0])
    }

    /// Columns it spans.
    pub fn cols(&self) -> usize {
        self.hi[1].saturating_sub(self.lo[1])
    }

    /// Elements it holds.
    pub fn len(&self) -> usize {
        self.rows() * self.cols()
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements both hold, if any.
    pub fn intersect(&self, other: &Section) -> Option<Section> {
        let s = Section {
            lo: [self.lo[0].max(other.lo[0]), self.lo[1].max(other.lo[1])],
            hi: [self.hi[0].min(other.hi[0]), self.hi[1].min(other.hi[1])],
        };
        (!s.is_empty()).then_some(s)
    }

    /// Whether they share an element.
    pub fn overlaps(&self, other: &Section) -> bool {
        self.intersect(other).is_some()
    }
}

impl std::fmt::Display for Section {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}..{}, {}..{}]", self.lo[0], self.hi[0], self.lo[1], self.hi[1])
    }
}

/// How [`GlobalArray::create`](crate::GlobalArray::create) spreads an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// One rectangular block per rank, over the process grid whose blocks have the
    /// smallest perimeter.
    Block,
    /// Tiles of `block` rows and columns dealt round-robin over the process grid
    /// [`Layout::Block`] would pick.
    BlockCyclic { block: [usize; 2] },
    /// Tiles of `block` (None: one per rank) over a `grid[0] x grid[1]` process grid of
    /// exactly the job's ranks.
    Grid { grid: [usize; 2], block: Option<[usize; 2]> },
}

/// One owner's part of a section: a strided block in its local matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The rank that owns it.
    pub rank: u32,
    /// Its global elements.
    pub section: Section,
    /// The local row and column of its first element in the owner's local matrix.
    pub local: [usize; 2],
}

/// Where every element of an array lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Distribution {
    dims: [usize; 2],
    grid: [usize; 2],
    block: [usize; 2],
}

impl Distribution {
    /// The distribution of a `dims` array over `ranks` ranks.
    pub fn new(dims: [usize; 2], ranks: u32, layout: Layout) -> Result<Distribution, GaError> {
        let n = ranks as usize;
        if dims[0] == 0 || dims[1] == 0 {
            return Err(GaError::InvalidArgument(format!("an array of {}x{} elements holds none", dims[0], dims[1])));
        }
        // Every size computed from the dims below (local matrices, offsets, bytes of the
        // widest element type) stays in range once the whole array's bytes do.
        if dims[0].checked_mul(dims[1]).and_then(|n| n.checked_mul(8)).is_none_or(|b| b > isize::MAX as usize) {
            return Err(GaError::InvalidArgument(format!(
                "an array of {}x{} elements exceeds the address space",
                dims[0], dims[1]
            )));
        }
        // The process grid whose blocks have the smallest perimeter (the least data on
        // their edges), as Global Arrays picks it: near-square for square arrays, one
        // row of ranks for a row vector.
        let near_square = || {
            let perimeter = |p: usize| dims[0].div_ceil(p) + dims[1].div_ceil(n / p);
            let p = (1..=n).filter(|p| n.is_multiple_of(*p)).min_by_key(|&p| (perimeter(p), n - p)).unwrap_or(1);
            [p, n / p]
        };
        let (grid, block) = match layout {
            Layout::Block => (near_square(), None),
            Layout::BlockCyclic { block } => (near_square(), Some(block)),
            Layout::Grid { grid, block } => {
                if grid[0].checked_mul(grid[1]) != Some(n) {
                    return Err(GaError::InvalidArgument(format!(
                        "a {}x{} process grid does not have {n} places, one per rank; give one of exactly {n}",
                        grid[0], grid[1]
                    )));
                }
                (grid, block)
            }
        };
        let block = block.unwrap_or([dims[0].div_ceil(grid[0]), dims[1].div_ceil(grid[1])]);
        if block[0] == 0 || block[1] == 0 {
            return Err(GaError::InvalidArgument(format!("tiles of {}x{} elements hold none", block[0], block[1])));
        }
        Ok(Distribution { dims, grid, block })
    }

    /// Rows and columns of the array.
    pub fn dims(&self) -> [usize; 2] {
        self.dims
    }

    /// The process grid.
    pub fn grid(&self) -> [usize; 2] {
        self.grid
    }

    /// The tile size.
    pub fn block(&self) -> [usize; 2] {
        self.block
    }

    /// The rank owning tile `(ti, tj)`.
    fn tile_owner(&self, ti: usize, tj: usize) -> u32 {
        ((ti % self.grid[0]) * self.grid[1] + tj % self.grid[1]) as u32
    }

    /// The grid coordinates of `rank`.
    fn coords(&self, rank: u32) -> [usize; 2] {
        let r = rank as usize;
        [r / self.grid[1], r % self.grid[1]]
    }

    /// Local rows (`axis` 0) or columns (1) of grid coordinate `p` along that axis.
    fn local_extent(&self, axis: usize, p: usize) -> usize {
        let (dim, b, g) = (self.dims[axis], self.block[axis], self.grid[axis]);
        (p..dim.div_ceil(b)).step_by(g).map(|t| b.min(dim - t * b)).sum()
    }

    /// Rows and columns of `rank`'s local matrix (0 where it owns nothing).
    pub fn local_dims(&self, rank: u32) -> [usize; 2] {
        let [pi, pj] = self.coords(rank);
        let d = [self.local_extent(0, pi), self.local_extent(1, pj)];
        if d[0] == 0 || d[1] == 0 {
            [0, 0]
        } else {
            d
        }
    }

    /// Elements of the largest local matrix (what every rank reserves: the heap is
    /// symmetric).
    pub fn max_local_len(&self, ranks: u32) -> usize {
        (0..ranks).map(|r| self.local_dims(r)).map(|[a, b]| a * b).max().unwrap_or(0)
    }

    /// The local index, along `axis`, of global index `g` (in a tile its owner holds).
    fn local_index(&self, axis: usize, g: usize) -> usize {
        let b = self.block[axis];
        (g / b / self.grid[axis]) * b + g % b
    }

    /// The rank owning element `(i, j)`.
    pub fn owner(&self, i: usize, j: usize) -> u32 {
        self.tile_owner(i / self.block[0], j / self.block[1])
    }

    /// Whether `s` lies inside the array (an empty section anywhere within it, too).
    pub fn contains(&self, s: &Section) -> bool {
        s.lo[0] <= s.hi[0] && s.lo[1] <= s.hi[1] && s.hi[0] <= self.dims[0] && s.hi[1] <= self.dims[1]
    }

    /// The sections `rank` owns, one per tile, in local order (Global Arrays'
    /// `NGA_Distribution`; one section with [`Layout::Block`]).
    pub fn sections_of(&self, rank: u32) -> Vec<Section> {
        let [pi, pj] = self.coords(rank);
        let tiles = |axis: usize, p: usize| {
            let (dim, b) = (self.dims[axis], self.block[axis]);
            (p..dim.div_ceil(b)).step_by(self.grid[axis]).map(move |t| (t * b, (t * b + b).min(dim)))
        };
        let mut out = Vec::new();
        for (r0, r1) in tiles(0, pi) {
            for (c0, c1) in tiles(1, pj) {
                out.push(Section::new([r0, c0], [r1, c1]));
            }
        }
        out
    }

    /// The per-owner blocks of `s` (Global Arrays' `NGA_Locate_region`): one piece per
    /// tile it touches, row-major over the tiles. `s` must lie inside the array.
    pub fn locate(&self, s: &Section) -> Vec<Piece> {
        let mut out = Vec::new();
        if s.is_empty() {
            return out;
        }
        let [br, bc] = self.block;
        for ti in s.lo[0] / br..=(s.hi[0] - 1) / br {
            for tj in s.lo[1] / bc..=(s.hi[1] - 1) / bc {
                let tile = Section::new([ti * br, tj * bc], [(ti + 1) * br, (tj + 1) * bc]);
                let part = s.intersect(&tile).expect("the tile range covers the section");
                out.push(Piece {
                    rank: self.tile_owner(ti, tj),
                    section: part,
                    local: [self.local_index(0, part.lo[0]), self.local_index(1, part.lo[1])],
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of the array, through `locate` of random sections, lands at a
    /// distinct place of its owner's local matrix, inside it.
    fn check(dist: &Distribution, ranks: u32) {
        let [rows, cols] = dist.dims();
        let mut seen = std::collections::HashSet::new();
        for p in dist.locate(&Section::whole(dist.dims())) {
            let [lr, lc] = dist.local_dims(p.rank);
            for i in 0..p.section.rows() {
                for j in 0..p.section.cols() {
                    let (gi, gj) = (p.section.lo[0] + i, p.section.lo[1] + j);
                    assert_eq!(dist.owner(gi, gj), p.rank);
                    let (li, lj) = (p.local[0] + i, p.local[1] + j);
                    assert!(li < lr && lj < lc, "{dist:?}: ({gi},{gj}) at ({li},{lj}) outside {lr}x{lc}");
                    assert!(seen.insert((p.rank, li, lj)), "{dist:?}: two elements at ({li},{lj}) of {}", p.rank);
                }
            }
        }
        assert_eq!(seen.len(), rows * cols);
        let owned: usize = (0..ranks).map(|r| dist.local_dims(r)).map(|[a, b]| a * b).sum();
        assert_eq!(owned, rows * cols, "{dist:?}: the local matrices hold the array exactly");
        for r in 0..ranks {
            let total: usize = dist.sections_of(r).iter().map(Section::len).sum();
            let [a, b] = dist.local_dims(r);
            assert_eq!(total, a * b, "{dist:?}: rank {r}'s sections fill its local matrix");
        }
    }

    #[test]
    fn every_element_has_one_place_in_block_and_block_cyclic_layouts() {
        for ranks in 1..=6u32 {
            for dims in [[1, 1], [7, 5], [5, 13], [16, 16], [3, 40]] {
                for layout in [
                    Layout::Block,
                    Layout::BlockCyclic { block: [2, 3] },
                    Layout::BlockCyclic { block: [1, 1] },
                    Layout::Grid { grid: [1, ranks as usize], block: None },
                ] {
                    check(&Distribution::new(dims, ranks, layout).unwrap(), ranks);
                }
            }
        }
    }

    #[test]
    fn block_layout_gives_one_section_per_rank_and_locate_splits_per_owner() {
        let d = Distribution::new([10, 10], 4, Layout::Block).unwrap();
        assert_eq!(d.grid(), [2, 2]);
        assert_eq!(d.sections_of(3), vec![Section::new([5, 5], [10, 10])]);
        let pieces = d.locate(&Section::new([4, 4], [6, 7]));
        let ranks: Vec<u32> = pieces.iter().map(|p| p.rank).collect();
        assert_eq!(ranks, vec![0, 1, 2, 3]);
        assert_eq!(pieces[3].section, Section::new([5, 5], [6, 7]));
        assert_eq!(pieces[3].local, [0, 0]);
        assert!(d.locate(&Section::new([3, 3], [3, 9])).is_empty());
        // A row vector: one row of ranks, each owning a part of it.
        let v = Distribution::new([1, 1000], 4, Layout::Block).unwrap();
        assert_eq!(v.grid(), [1, 4]);
        assert!((0..4).all(|r| v.local_dims(r) == [1, 250]));
    }

    #[test]
    fn bad_layouts_are_refused() {
        assert!(Distribution::new([0, 4], 2, Layout::Block).is_err());
        assert!(Distribution::new([4, 4], 2, Layout::BlockCyclic { block: [0, 1] }).is_err());
        assert!(Distribution::new([4, 4], 4, Layout::Grid { grid: [3, 1], block: None }).is_err());
    }
}
