//! Domain decomposition of Stencil2D: the 2D process grid, each rank's block of the
//! global interior, its neighbours, and the regions each step of a batch updates.
//!
//! Every rank stores its block row-major with `halo` ghost rows and columns on every
//! side, `rows + 2h` rows of `pitch = cols + 2h` elements. On a side with a neighbour
//! the ghost cells receive the neighbour's edge; on a side at the global boundary
//! (non-periodic) the innermost ghost layer holds the fixed boundary values, which the
//! stencil reads and nothing ever writes.
//!
//! A halo exchange fills `h` ghost layers, which lets a rank take `h` steps before the
//! next one (SHOC's "iterations per exchange"): step `k` of a batch updates the
//! interior plus the `h - k - 1` ghost layers that are still valid on neighbour sides,
//! so the valid region shrinks by one layer per step until only the interior is left.
//! The redundant ghost updates compute exactly what the neighbour computes for the
//! same cells, from the same inputs, so the result is bit-identical to a single rank.

use std::fmt;

/// A side of a rank's block, and the neighbour across it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    North,
    South,
    West,
    East,
}

impl Side {
    pub const ALL: [Side; 4] = [Side::North, Side::South, Side::West, Side::East];
    /// The sides of the first phase of an exchange (whole rows, contiguous).
    pub const VERTICAL: [Side; 2] = [Side::North, Side::South];
    /// The sides of the second phase (columns, packed).
    pub const HORIZONTAL: [Side; 2] = [Side::West, Side::East];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn opposite(self) -> Side {
        match self {
            Side::North => Side::South,
            Side::South => Side::North,
            Side::West => Side::East,
            Side::East => Side::West,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Side::North => "north",
            Side::South => "south",
            Side::West => "west",
            Side::East => "east",
        }
    }

    pub fn letter(self) -> char {
        match self {
            Side::North => 'N',
            Side::South => 'S',
            Side::West => 'W',
            Side::East => 'E',
        }
    }

    pub fn from_letter(c: char) -> Option<Side> {
        Side::ALL.into_iter().find(|s| s.letter() == c)
    }
}

/// The ranks arranged as `rows x cols`; rank `r` sits at `(r / cols, r % cols)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcGrid {
    pub rows: u32,
    pub cols: u32,
}

impl ProcGrid {
    /// The factorization of `n` closest to square, with `rows >= cols` as
    /// MPI_Dims_create orders it (SHOC uses that): 2 ranks split the rows and exchange
    /// contiguous rows only; a prime count becomes `n x 1`.
    // `is_multiple_of` needs Rust 1.87; the workspace supports 1.80.
    #[allow(clippy::manual_is_multiple_of)]
    pub fn squarest(n: u32) -> ProcGrid {
        let n = n.max(1);
        let cols = (1..=n).take_while(|c| c * c <= n).filter(|c| n % c == 0).last().unwrap_or(1);
        ProcGrid { rows: n / cols, cols }
    }

    /// Parses `RxC`, e.g. `2x3`.
    pub fn parse(s: &str) -> Result<ProcGrid, String> {
        let bad = || format!("grid '{s}': expected ROWSxCOLS, e.g. 2x3");
        let (r, c) = s.split_once(['x', 'X']).ok_or_else(bad)?;
        let r: u32 = r.trim().parse().map_err(|_| bad())?;
        let c: u32 = c.trim().parse().map_err(|_| bad())?;
        if r == 0 || c == 0 {
            return Err(bad());
        }
        Ok(ProcGrid { rows: r, cols: c })
    }

    pub fn size(&self) -> u32 {
        self.rows * self.cols
    }

    pub fn coords(&self, rank: u32) -> (u32, u32) {
        (rank / self.cols, rank % self.cols)
    }

    pub fn rank_at(&self, row: u32, col: u32) -> u32 {
        row * self.cols + col
    }
}

impl fmt::Display for ProcGrid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.rows, self.cols)
    }
}

/// A half-open rectangle `[r0, r1) x [c0, c1)` of local array indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rect {
    pub r0: usize,
    pub r1: usize,
    pub c0: usize,
    pub c1: usize,
}

impl Rect {
    pub fn rows(&self) -> usize {
        self.r1.saturating_sub(self.r0)
    }

    pub fn cols(&self) -> usize {
        self.c1.saturating_sub(self.c0)
    }

    pub fn is_empty(&self) -> bool {
        self.rows() == 0 || self.cols() == 0
    }

    pub fn points(&self) -> usize {
        self.rows() * self.cols()
    }
}

/// Start and length of part `i` of `n` items split into `parts` as evenly as
/// possible (the first `n % parts` parts get one more).
pub fn split(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let (q, r) = (n / parts, n % parts);
    (i * q + i.min(r), q + usize::from(i < r))
}

/// One rank's share of the global problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decomp {
    pub grid: ProcGrid,
    pub rank: u32,
    /// Global interior, rows x cols (the fixed boundary frame around it excluded).
    pub global: (usize, usize),
    /// Global index of this block's first interior row and column.
    pub offset: (usize, usize),
    /// Interior rows x cols of this block.
    pub local: (usize, usize),
    /// Ghost layers on every side = steps between exchanges.
    pub halo: usize,
    /// The neighbour across each side (indexed by [`Side::index`]); None at the
    /// global boundary.
    pub neighbours: [Option<u32>; 4],
}

impl Decomp {
    /// The block of `rank`. Fails, with the same message on every rank, when some
    /// block is too small for the halo: a neighbour's `h` ghost layers come from `h`
    /// interior layers of this block.
    pub fn new(grid: ProcGrid, rank: u32, global: (usize, usize), halo: usize) -> Result<Decomp, String> {
        if halo == 0 {
            return Err("the halo width must be at least 1".into());
        }
        if rank >= grid.size() {
            return Err(format!("rank {rank} outside the {grid} grid"));
        }
        let (pr, pc) = (grid.rows as usize, grid.cols as usize);
        // The smallest block of the split (all ranks compute the same verdict).
        let (min_r, min_c) = (global.0 / pr, global.1 / pc);
        if min_r == 0 || min_c == 0 {
            return Err(format!(
                "a {}x{} interior cannot be split over a {grid} grid: some rank would get no points",
                global.0, global.1
            ));
        }
        if (pr > 1 && min_r < halo) || (pc > 1 && min_c < halo) {
            return Err(format!(
                "halo {halo} is wider than the smallest block ({min_r}x{min_c} points of a {}x{} interior on a {grid} grid): \
                 use a smaller halo or a larger problem",
                global.0, global.1
            ));
        }
        let (row, col) = grid.coords(rank);
        let (r_off, r_len) = split(global.0, pr, row as usize);
        let (c_off, c_len) = split(global.1, pc, col as usize);
        let mut neighbours = [None; 4];
        neighbours[Side::North.index()] = (row > 0).then(|| grid.rank_at(row - 1, col));
        neighbours[Side::South.index()] = (row + 1 < grid.rows).then(|| grid.rank_at(row + 1, col));
        neighbours[Side::West.index()] = (col > 0).then(|| grid.rank_at(row, col - 1));
        neighbours[Side::East.index()] = (col + 1 < grid.cols).then(|| grid.rank_at(row, col + 1));
        Ok(Decomp { grid, rank, global, offset: (r_off, c_off), local: (r_len, c_len), halo, neighbours })
    }

    /// The whole problem on one rank with one ghost layer: the CPU reference.
    pub fn single(global: (usize, usize)) -> Decomp {
        Decomp::new(ProcGrid { rows: 1, cols: 1 }, 0, global, 1).expect("a 1x1 grid with halo 1 always fits")
    }

    pub fn neighbour(&self, side: Side) -> Option<u32> {
        self.neighbours[side.index()]
    }

    /// Rows of the local array, ghost rows included.
    pub fn padded_rows(&self) -> usize {
        self.local.0 + 2 * self.halo
    }

    /// Elements per row of the local array, ghost columns included.
    pub fn pitch(&self) -> usize {
        self.local.1 + 2 * self.halo
    }

    /// Elements of the local array.
    pub fn len(&self) -> usize {
        self.padded_rows() * self.pitch()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Global coordinates of local index `(i, j)`; outside `0..global` for ghost
    /// cells beyond the global boundary.
    pub fn global_of(&self, i: usize, j: usize) -> (i64, i64) {
        let h = self.halo as i64;
        (self.offset.0 as i64 + i as i64 - h, self.offset.1 as i64 + j as i64 - h)
    }

    /// The rectangle whose distance to the array edge is `margin(has_neighbour)` on
    /// each side.
    fn inset(&self, margin: impl Fn(bool) -> usize) -> Rect {
        let m = |s: Side| margin(self.neighbour(s).is_some());
        Rect {
            r0: m(Side::North),
            r1: self.padded_rows().saturating_sub(m(Side::South)),
            c0: m(Side::West),
            c1: self.pitch().saturating_sub(m(Side::East)),
        }
    }

    /// The interior, without ghost cells.
    pub fn interior(&self) -> Rect {
        let h = self.halo;
        Rect { r0: h, r1: h + self.local.0, c0: h, c1: h + self.local.1 }
    }

    /// What step `k` (0-based, `k < halo`) after an exchange updates: the interior,
    /// plus on neighbour sides the `halo - k - 1` ghost layers still computable from
    /// valid inputs. Boundary sides stop at the interior: their ghost cells are the
    /// fixed boundary.
    pub fn step_region(&self, k: usize) -> Rect {
        debug_assert!(k < self.halo, "step {k} of a batch of {}", self.halo);
        let h = self.halo;
        self.inset(|nb| if nb { k + 1 } else { h })
    }

    /// The part of step 0 that reads no ghost cell a neighbour provides: what the
    /// overlap mode computes while the halos move. Empty when the block is too thin.
    pub fn inner_region(&self) -> Rect {
        let h = self.halo;
        self.inset(|nb| if nb { h + 1 } else { h })
    }

    /// Step 0's region minus [`inner_region`](Self::inner_region), as disjoint
    /// rectangles (north and south strips span the full width), computed once the
    /// halos are in.
    pub fn boundary_strips(&self) -> Vec<Rect> {
        let full = self.step_region(0);
        let inner = self.inner_region();
        if inner.is_empty() {
            return vec![full];
        }
        [
            Rect { r0: full.r0, r1: inner.r0, c0: full.c0, c1: full.c1 },
            Rect { r0: inner.r1, r1: full.r1, c0: full.c0, c1: full.c1 },
            Rect { r0: inner.r0, r1: inner.r1, c0: full.c0, c1: inner.c0 },
            Rect { r0: inner.r0, r1: inner.r1, c0: inner.c1, c1: full.c1 },
        ]
        .into_iter()
        .filter(|r| !r.is_empty())
        .collect()
    }

    /// For a halo message across `side`: the first local row (north/south) or column
    /// (west/east) sent, and the first one received. Both span `halo` layers.
    pub fn halo_layers(&self, side: Side) -> (usize, usize) {
        let h = self.halo;
        let far = match side {
            Side::North | Side::South => self.padded_rows(),
            Side::West | Side::East => self.pitch(),
        };
        match side {
            Side::North | Side::West => (h, 0),
            Side::South | Side::East => (far - 2 * h, far - h),
        }
    }

    /// Elements of one halo message across `side`: `halo` whole rows for north and
    /// south, `halo` columns of every row (ghost rows included, so that corners travel
    /// on) for west and east.
    pub fn message_len(&self, side: Side) -> usize {
        match side {
            Side::North | Side::South => self.halo * self.pitch(),
            Side::West | Side::East => self.halo * self.padded_rows(),
        }
    }

    /// The interior of a local array, row-major without ghost cells.
    pub fn extract_interior<T: Copy>(&self, field: &[T]) -> Vec<T> {
        assert_eq!(field.len(), self.len(), "field of {} elements for a {}-element block", field.len(), self.len());
        let r = self.interior();
        let p = self.pitch();
        (r.r0..r.r1).flat_map(|i| field[i * p + r.c0..i * p + r.c1].iter().copied()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squarest_grids() {
        let g = |n| {
            let p = ProcGrid::squarest(n);
            (p.rows, p.cols)
        };
        assert_eq!(g(1), (1, 1));
        assert_eq!(g(2), (2, 1));
        assert_eq!(g(4), (2, 2));
        assert_eq!(g(6), (3, 2));
        assert_eq!(g(7), (7, 1));
        assert_eq!(g(12), (4, 3));
        assert_eq!(g(16), (4, 4));
        assert_eq!(ProcGrid::parse("1x4"), Ok(ProcGrid { rows: 1, cols: 4 }));
        assert!(ProcGrid::parse("0x4").is_err() && ProcGrid::parse("4").is_err());
    }

    #[test]
    fn split_covers_evenly() {
        for (n, parts) in [(10, 3), (64, 4), (5, 5), (50, 3)] {
            let mut next = 0;
            for i in 0..parts {
                let (o, l) = split(n, parts, i);
                assert_eq!(o, next);
                assert!(l == n / parts || l == n / parts + 1);
                next += l;
            }
            assert_eq!(next, n);
        }
    }

    #[test]
    fn neighbours_of_a_3x2_grid() {
        let g = ProcGrid { rows: 3, cols: 2 };
        let d = Decomp::new(g, 2, (60, 40), 2).unwrap();
        assert_eq!(d.neighbours, [Some(0), Some(4), None, Some(3)]);
        assert_eq!((d.offset, d.local), ((20, 0), (20, 20)));
        let d = Decomp::new(g, 5, (50, 40), 2).unwrap();
        assert_eq!(d.neighbours, [Some(3), None, Some(4), None]);
        assert_eq!((d.offset, d.local), ((34, 20), (16, 20)));
    }

    #[test]
    fn too_small_blocks_are_refused() {
        let g = ProcGrid { rows: 2, cols: 1 };
        assert!(Decomp::new(g, 0, (6, 6), 4).is_err());
        assert!(Decomp::new(g, 0, (8, 2), 4).is_ok(), "a single column of ranks does not split the columns");
        assert!(Decomp::new(g, 0, (1, 8), 1).is_err());
    }

    /// Every cell the stencil reads in step k was written in step k-1 (or is a
    /// received ghost for k = 0, or the fixed boundary): the regions shrink by one.
    #[test]
    fn step_regions_shrink_by_one_layer_on_neighbour_sides() {
        let d = Decomp::new(ProcGrid { rows: 3, cols: 3 }, 1, (30, 30), 3).unwrap();
        // Rank 1: north boundary, neighbours south, west and east.
        let (r, p) = (d.padded_rows(), d.pitch());
        assert_eq!(d.step_region(0), Rect { r0: 3, r1: r - 1, c0: 1, c1: p - 1 });
        assert_eq!(d.step_region(2), Rect { r0: 3, r1: r - 3, c0: 3, c1: p - 3 });
        assert_eq!(d.step_region(2), d.interior());
        for k in 1..3 {
            let (prev, cur) = (d.step_region(k - 1), d.step_region(k));
            if d.neighbour(Side::South).is_some() {
                assert_eq!(cur.r1 + 1, prev.r1);
            }
            assert_eq!(cur.c0 - 1, prev.c0);
        }
    }

    #[test]
    fn strips_and_inner_tile_step_zero() {
        for rank in 0..6 {
            for halo in [1, 2, 4] {
                let d = Decomp::new(ProcGrid { rows: 3, cols: 2 }, rank, (40, 24), halo).unwrap();
                let full = d.step_region(0);
                let mut count = vec![0u8; d.len()];
                let mut parts = d.boundary_strips();
                parts.push(d.inner_region());
                for rect in parts.iter().filter(|r| !r.is_empty()) {
                    for i in rect.r0..rect.r1 {
                        for j in rect.c0..rect.c1 {
                            count[i * d.pitch() + j] += 1;
                        }
                    }
                }
                for i in 0..d.padded_rows() {
                    for j in 0..d.pitch() {
                        let inside = (full.r0..full.r1).contains(&i) && (full.c0..full.c1).contains(&j);
                        assert_eq!(
                            count[i * d.pitch() + j],
                            u8::from(inside),
                            "rank {rank} halo {halo} cell ({i},{j})"
                        );
                    }
                }
                // The inner region reads no ghost cell a neighbour provides.
                let inner = d.inner_region();
                let h = d.halo;
                for side in Side::ALL.into_iter().filter(|s| d.neighbour(*s).is_some()) {
                    match side {
                        Side::North => assert!(inner.r0 > h),
                        Side::South => assert!(inner.r1 < d.padded_rows() - h),
                        Side::West => assert!(inner.c0 > h),
                        Side::East => assert!(inner.c1 < d.pitch() - h),
                    }
                }
            }
        }
    }

    #[test]
    fn halo_layers_and_messages() {
        let d = Decomp::new(ProcGrid { rows: 2, cols: 2 }, 0, (16, 16), 2).unwrap();
        // 8x8 interior, 12x12 padded.
        assert_eq!(d.halo_layers(Side::North), (2, 0));
        assert_eq!(d.halo_layers(Side::South), (8, 10));
        assert_eq!(d.halo_layers(Side::East), (8, 10));
        assert_eq!(d.message_len(Side::South), 24);
        assert_eq!(d.message_len(Side::East), 24);
        let field: Vec<usize> = (0..d.len()).collect();
        let inner = d.extract_interior(&field);
        assert_eq!(inner.len(), 64);
        assert_eq!(inner[0], 2 * 12 + 2);
    }
}
