//! The lower-triangular matrix of SpTS: CSR storage, the synthetic generator, the
//! MatrixMarket reader, the dependency levels and the serial reference solve.
//!
//! Every row stores its off-diagonal entries first, in increasing column order, and its
//! diagonal last. A row's value is computed in exactly that order ([`row_value`]), with
//! one rounding per multiplication and per subtraction: the CUDA kernels do the same with
//! `__dmul_rn` / `__dsub_rn` / `__ddiv_rn`, so every mode's result is bit-identical to
//! [`reference()`].
//!
//! Values stay bounded whatever the structure: each row's off-diagonal magnitudes add up
//! to at most 1/2 and its diagonal lies in [1, 2), so |x| <= 2 max |b|.

use std::collections::BTreeSet;

/// A square lower-triangular matrix in CSR form, diagonal last in each row.
#[derive(Clone, Debug, PartialEq)]
pub struct Csr {
    pub n: usize,
    /// Row `i`'s entries are `ptr[i]..ptr[i + 1]`; the last of them is the diagonal.
    pub ptr: Vec<usize>,
    pub col: Vec<u32>,
    pub val: Vec<f64>,
}

/// What the synthetic generator makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub n: usize,
    /// Off-diagonal entries per row (fewer in the first rows).
    pub offdiag: usize,
    /// Near entries lie within this many columns left of the diagonal.
    pub band: usize,
    /// Of every 8 off-diagonal entries, how many are long-range (anywhere left of the
    /// diagonal) rather than near.
    pub far_eighths: u32,
    pub seed: u64,
}

/// SplitMix64's output for `x`: the generator's deterministic hash.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A number in [0, 1) from the seed, the row and a salt (53 bits: exact in f64).
fn unit(seed: u64, row: usize, salt: u64) -> f64 {
    (mix(seed ^ mix(row as u64).wrapping_add(salt)) >> 11) as f64 / (1u64 << 53) as f64
}

impl Csr {
    /// The synthetic matrix of `s`: per row, near entries (the previous rows, which chain
    /// rows into many dependency levels) and long-range ones (which, with rows spread over
    /// ranks, depend on other ranks irregularly).
    pub fn generate(s: &Shape) -> Csr {
        let mut cols = Vec::with_capacity(s.n);
        for i in 0..s.n {
            let mut row = BTreeSet::new();
            for k in 0..s.offdiag.min(i) as u64 {
                let r = mix(s.seed ^ mix((i as u64) << 16 | k));
                let far = (r >> 61) < u64::from(s.far_eighths);
                let span = if far { i } else { s.band.clamp(1, i) };
                row.insert((i - 1 - (r as usize >> 3) % span) as u32);
            }
            cols.push(row.into_iter().collect::<Vec<u32>>());
        }
        Csr::with_values(cols, s.seed)
    }

    /// The matrix whose sparsity pattern is the lower triangle (diagonal included, added
    /// where missing) of the MatrixMarket coordinate file `text`; the values are generated
    /// from `seed` as for synthetic matrices, so that the solve stays bounded (a file's own
    /// lower triangle is rarely well-conditioned).
    pub fn from_matrix_market(text: &str, seed: u64) -> Result<Csr, String> {
        let mut lines = text.lines();
        let banner = lines.next().ok_or("empty MatrixMarket file")?;
        let b = banner.to_ascii_lowercase();
        if !b.starts_with("%%matrixmarket matrix coordinate") {
            return Err(format!("not a MatrixMarket coordinate matrix (first line: {banner:?})"));
        }
        let mut body = lines.map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('%'));
        let size = body.next().ok_or("MatrixMarket: no size line")?;
        let dims: Vec<usize> = size
            .split_whitespace()
            .map(|t| t.parse().map_err(|_| format!("bad size line {size:?}")))
            .collect::<Result<_, _>>()?;
        let [rows, cols_n, nnz] = dims[..] else { return Err(format!("bad size line {size:?}: rows cols nonzeros")) };
        if rows != cols_n {
            return Err(format!("the matrix is {rows}x{cols_n}: a triangular solve needs a square one"));
        }
        let mut cols = vec![BTreeSet::new(); rows];
        let mut seen = 0;
        for l in body {
            let mut f = l.split_whitespace().map(str::parse::<usize>);
            let (Some(Ok(i)), Some(Ok(j))) = (f.next(), f.next()) else {
                return Err(format!("MatrixMarket: bad entry line {l:?}"));
            };
            if i == 0 || j == 0 || i > rows || j > rows {
                return Err(format!("MatrixMarket: entry ({i},{j}) outside the {rows}x{rows} matrix"));
            }
            // A symmetric file lists the lower triangle; a general one both: keep the lower.
            let (i, j) = (i.max(j) - 1, i.min(j) - 1);
            if i != j {
                cols[i].insert(j as u32);
            }
            seen += 1;
        }
        if seen != nnz {
            return Err(format!("MatrixMarket: the size line says {nnz} entries, the file has {seen}"));
        }
        Ok(Csr::with_values(cols.into_iter().map(|c| c.into_iter().collect()).collect(), seed))
    }

    /// The CSR matrix of these off-diagonal columns per row (increasing), with values
    /// from `seed`: off-diagonals whose magnitudes add up to at most 1/2, a diagonal in
    /// [1, 2).
    fn with_values(cols: Vec<Vec<u32>>, seed: u64) -> Csr {
        let n = cols.len();
        let mut m = Csr { n, ptr: Vec::with_capacity(n + 1), col: Vec::new(), val: Vec::new() };
        m.ptr.push(0);
        for (i, row) in cols.into_iter().enumerate() {
            let scale = 0.5 / row.len().max(1) as f64;
            for (k, &j) in row.iter().enumerate() {
                m.col.push(j);
                m.val.push(scale * (2.0 * unit(seed, i, k as u64 + 1) - 1.0));
            }
            m.col.push(i as u32);
            m.val.push(1.0 + unit(seed, i, 0));
            m.ptr.push(m.col.len());
        }
        m
    }

    pub fn nnz(&self) -> usize {
        self.col.len()
    }

    /// Row `i`'s off-diagonal entries (columns and values, increasing columns).
    pub fn offdiag(&self, i: usize) -> (&[u32], &[f64]) {
        let (a, b) = (self.ptr[i], self.ptr[i + 1] - 1);
        (&self.col[a..b], &self.val[a..b])
    }

    pub fn diag(&self, i: usize) -> f64 {
        self.val[self.ptr[i + 1] - 1]
    }

    /// Each row's dependency level: 0 without off-diagonals, else one more than the
    /// highest of its columns' (rows of one level can be solved at once).
    pub fn levels(&self) -> Vec<u32> {
        let mut lv = vec![0u32; self.n];
        for i in 0..self.n {
            lv[i] = self.offdiag(i).0.iter().map(|&j| lv[j as usize] + 1).max().unwrap_or(0);
        }
        lv
    }
}

/// The right-hand side: values in [1, 2) from the seed.
pub fn rhs(n: usize, seed: u64) -> Vec<f64> {
    (0..n).map(|i| 1.0 + unit(seed ^ 0xB, i, 0)).collect()
}

/// Row `i`'s solution from the final values of its columns, `x(j)`: `b`, minus each
/// off-diagonal product in CSR order, over the diagonal; every operation rounded once
/// (no fused multiply-add: Rust never contracts), as `spts_row_value` in kernels.cu.
pub fn row_value(b: f64, vals: &[f64], cols: &[u32], diag: f64, mut x: impl FnMut(u32) -> f64) -> f64 {
    let mut s = b;
    for (&a, &j) in vals.iter().zip(cols) {
        s -= a * x(j);
    }
    s / diag
}

/// The serial solve of `m x = b`, row by row.
pub fn reference(m: &Csr, b: &[f64]) -> Vec<f64> {
    let mut x = vec![0.0; m.n];
    for i in 0..m.n {
        let (cols, vals) = m.offdiag(i);
        x[i] = row_value(b[i], vals, cols, m.diag(i), |j| x[j as usize]);
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: usize) -> Shape {
        Shape { n, offdiag: 4, band: 16, far_eighths: 2, seed: 7 }
    }

    #[test]
    fn the_generator_is_deterministic_lower_triangular_and_sorted() {
        let m = Csr::generate(&shape(500));
        assert_eq!(m, Csr::generate(&shape(500)));
        assert_ne!(m, Csr::generate(&Shape { seed: 8, ..shape(500) }));
        for i in 0..m.n {
            let (cols, vals) = m.offdiag(i);
            assert!(cols.windows(2).all(|w| w[0] < w[1]), "row {i} sorted");
            assert!(cols.iter().all(|&j| (j as usize) < i), "row {i} strictly lower");
            assert!(vals.iter().map(|v| v.abs()).sum::<f64>() <= 0.5);
            assert!((1.0..2.0).contains(&m.diag(i)));
            assert_eq!(m.col[m.ptr[i + 1] - 1] as usize, i, "diagonal last");
        }
        assert!(m.offdiag(400).0.len() >= 2, "later rows get several entries");
        // Some entries lie far from the diagonal.
        assert!((100..500).any(|i| m.offdiag(i).0.first().is_some_and(|&j| (j as usize) + 16 < i)));
    }

    #[test]
    fn levels_follow_the_dependencies_and_there_are_many() {
        let m = Csr::generate(&shape(2000));
        let lv = m.levels();
        for i in 0..m.n {
            for &j in m.offdiag(i).0 {
                assert!(lv[j as usize] < lv[i]);
            }
        }
        let depth = *lv.iter().max().unwrap();
        assert!(depth > 50 && depth < 2000, "{depth} levels");
    }

    #[test]
    fn the_reference_solves_the_system() {
        let m = Csr::generate(&shape(300));
        let b = rhs(m.n, 7);
        let x = reference(&m, &b);
        for i in 0..m.n {
            let (cols, vals) = m.offdiag(i);
            let lx: f64 = vals.iter().zip(cols).map(|(a, &j)| a * x[j as usize]).sum::<f64>() + m.diag(i) * x[i];
            assert!((lx - b[i]).abs() < 1e-12, "row {i}: {lx} vs {}", b[i]);
            assert!(x[i].abs() <= 4.0);
        }
    }

    #[test]
    fn matrix_market_gives_the_lower_pattern() {
        let text =
            "%%MatrixMarket matrix coordinate real general\n% c\n4 4 6\n1 1 2.0\n2 1 1\n1 3 5\n4 2 1\n4 3 1\n3 3 1\n";
        let m = Csr::from_matrix_market(text, 1).unwrap();
        assert_eq!(m.n, 4);
        assert_eq!(m.offdiag(0).0, &[] as &[u32]);
        assert_eq!(m.offdiag(1).0, &[0]);
        assert_eq!(m.offdiag(2).0, &[0], "(1,3) of a general file counts as (3,1)");
        assert_eq!(m.offdiag(3).0, &[1, 2]);
        assert_eq!(m.nnz(), 4 + 4);
        assert!(Csr::from_matrix_market("%%MatrixMarket matrix coordinate real general\n2 3 0\n", 1).is_err());
        assert!(Csr::from_matrix_market("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 1\n", 1).is_err());
    }
}
