//! The Stencil2D outputs from stencil.csv: stencil_table.csv (each mode against host
//! staging), stencil_overlap.csv (how much of the exchange inter-k-overlap hides
//! behind compute) and the Markdown section printed after the key-point table. The
//! plot, stencil.svg, is [`super::plot::stencil_plot`].
//!
//! Only the `time_per_iter_us` rows are used; where a point was measured twice the
//! first row counts (as for the anchors).
//!
//! - gain of a mode = (staged - mode) / staged * 100, at the same precision, ranks,
//!   size and halo: positive when the mode is faster than staging.
//! - hidden_pct = (inter_k - overlap) / (inter_k - compute) * 100: the share of what
//!   the exchange adds to compute alone (`compute`, the 1-rank inter-k time: no
//!   neighbours, no messages) that overlapping takes back. inter_k and overlap are
//!   those of the smallest multi-rank job that has both (2 ranks in the H200 x2 runs:
//!   one rank per GPU, so that each rank computes what the 1-rank job computes); the
//!   CSV has no ranks column, the Markdown names the count.

use super::summary::opt;
use super::table::num;
use super::StencilRow;

pub const TIME: &str = "time_per_iter_us";
pub const STAGED: &str = "staged";
pub const INTER_K: &str = "inter-k";
pub const OVERLAP: &str = "inter-k-overlap";

pub const TABLE_HEADER: &str =
    "precision,ranks,size,halo,staged_us,inter_k_us,overlap_us,inter_k_gain_pct,overlap_gain_pct";
pub const OVERLAP_HEADER: &str = "precision,size,halo,compute_us,inter_k_us,overlap_us,hidden_pct,overlap_vs_compute";

/// The seed paper's Stencil2D gain of DMA-assisted transfers over shared-memory
/// staging (2012 hardware), per precision.
pub const SEED_GAIN_PCT: [(&str, f64); 2] = [("single", 4.7), ("double", 2.3)];

/// The time per iteration of one point, in us.
pub fn time(rows: &[StencilRow], precision: &str, mode: &str, ranks: u32, size: u64, halo: u32) -> Option<f64> {
    rows.iter()
        .find(|r| {
            r.metric == TIME
                && r.mode == mode
                && r.precision == precision
                && r.ranks == ranks
                && r.size == size
                && r.halo == halo
        })
        .map(|r| r.value)
}

/// (staged - mode) / staged * 100; None where staged is not positive.
pub fn gain_pct(staged: f64, mode: f64) -> Option<f64> {
    (staged > 0.0).then(|| (staged - mode) / staged * 100.0)
}

/// single, double, then other precisions by name.
fn precision_rank(p: &str) -> (usize, &str) {
    (["single", "double"].iter().position(|q| *q == p).unwrap_or(2), p)
}

/// One row of stencil_table.csv, times in us.
#[derive(Clone, Debug, PartialEq)]
pub struct GainRow {
    pub precision: String,
    pub ranks: u32,
    pub size: u64,
    pub halo: u32,
    pub staged: f64,
    pub inter_k: Option<f64>,
    pub overlap: Option<f64>,
}

impl GainRow {
    pub fn inter_k_gain_pct(&self) -> Option<f64> {
        gain_pct(self.staged, self.inter_k?)
    }

    pub fn overlap_gain_pct(&self) -> Option<f64> {
        gain_pct(self.staged, self.overlap?)
    }

    /// The gain of `mode` (inter-k or inter-k-overlap).
    pub fn gain_pct(&self, mode: &str) -> Option<f64> {
        match mode {
            INTER_K => self.inter_k_gain_pct(),
            OVERLAP => self.overlap_gain_pct(),
            _ => None,
        }
    }
}

/// One row per (precision, ranks, size, halo) with a staged time, sorted by precision
/// (single first), ranks, size, halo.
pub fn gain_table(rows: &[StencilRow]) -> Vec<GainRow> {
    let mut out: Vec<GainRow> = Vec::new();
    for r in rows.iter().filter(|r| r.metric == TIME && r.mode == STAGED) {
        if out.iter().any(|g| g.precision == r.precision && g.ranks == r.ranks && g.size == r.size && g.halo == r.halo)
        {
            continue;
        }
        let at = |mode| time(rows, &r.precision, mode, r.ranks, r.size, r.halo);
        out.push(GainRow {
            precision: r.precision.clone(),
            ranks: r.ranks,
            size: r.size,
            halo: r.halo,
            staged: r.value,
            inter_k: at(INTER_K),
            overlap: at(OVERLAP),
        });
    }
    out.sort_by(|a, b| {
        (precision_rank(&a.precision), a.ranks, a.size, a.halo).cmp(&(
            precision_rank(&b.precision),
            b.ranks,
            b.size,
            b.halo,
        ))
    });
    out
}

pub fn table_csv(rows: &[GainRow]) -> String {
    super::csv_text(
        TABLE_HEADER,
        rows.iter().map(|r| {
            [
                r.precision.clone(),
                r.ranks.to_string(),
                r.size.to_string(),
                r.halo.to_string(),
                format!("{:.3}", r.staged),
                opt(r.inter_k, 3),
                opt(r.overlap, 3),
                opt(r.inter_k_gain_pct(), 2),
                opt(r.overlap_gain_pct(), 2),
            ]
        }),
    )
}

/// One row of stencil_overlap.csv, times in us.
#[derive(Clone, Debug, PartialEq)]
pub struct OverlapRow {
    pub precision: String,
    pub size: u64,
    pub halo: u32,
    /// The job inter_k and overlap come from.
    pub ranks: u32,
    /// 1 rank, inter-k: compute alone.
    pub compute: f64,
    pub inter_k: f64,
    pub overlap: f64,
}

impl OverlapRow {
    /// (inter_k - overlap) / (inter_k - compute) * 100; None where inter-k costs no
    /// more than compute alone (nothing to hide).
    pub fn hidden_pct(&self) -> Option<f64> {
        let exposed = self.inter_k - self.compute;
        (exposed > 0.0).then(|| (self.inter_k - self.overlap) / exposed * 100.0)
    }

    /// overlap / compute: 1 would be a free exchange.
    pub fn overlap_vs_compute(&self) -> Option<f64> {
        (self.compute > 0.0).then(|| self.overlap / self.compute)
    }
}

/// One row per 1-rank inter-k time (precision, size, halo) for which a multi-rank job
/// has both inter-k and inter-k-overlap times, the smallest such job; sorted as
/// [`gain_table`].
pub fn overlap_table(rows: &[StencilRow]) -> Vec<OverlapRow> {
    let mut out: Vec<OverlapRow> = Vec::new();
    for c in rows.iter().filter(|r| r.metric == TIME && r.mode == INTER_K && r.ranks == 1) {
        if out.iter().any(|o| o.precision == c.precision && o.size == c.size && o.halo == c.halo) {
            continue;
        }
        let mut ranks: Vec<u32> = rows
            .iter()
            .filter(|r| r.ranks > 1 && r.precision == c.precision && r.size == c.size && r.halo == c.halo)
            .map(|r| r.ranks)
            .collect();
        ranks.sort_unstable();
        ranks.dedup();
        let found = ranks.into_iter().find_map(|n| {
            let at = |mode| time(rows, &c.precision, mode, n, c.size, c.halo);
            Some((n, at(INTER_K)?, at(OVERLAP)?))
        });
        if let Some((ranks, inter_k, overlap)) = found {
            out.push(OverlapRow {
                precision: c.precision.clone(),
                size: c.size,
                halo: c.halo,
                ranks,
                compute: c.value,
                inter_k,
                overlap,
            });
        }
    }
    out.sort_by(|a, b| {
        (precision_rank(&a.precision), a.size, a.halo).cmp(&(precision_rank(&b.precision), b.size, b.halo))
    });
    out
}

pub fn overlap_csv(rows: &[OverlapRow]) -> String {
    super::csv_text(
        OVERLAP_HEADER,
        rows.iter().map(|r| {
            [
                r.precision.clone(),
                r.size.to_string(),
                r.halo.to_string(),
                format!("{:.3}", r.compute),
                format!("{:.3}", r.inter_k),
                format!("{:.3}", r.overlap),
                opt(r.hidden_pct(), 2),
                opt(r.overlap_vs_compute(), 3),
            ]
        }),
    )
}

/// The mean gain of `mode` over the rows of one precision that have it, and how many.
pub fn mean_gain(rows: &[GainRow], precision: &str, mode: &str) -> Option<(f64, usize)> {
    let g: Vec<f64> = rows.iter().filter(|r| r.precision == precision).filter_map(|r| r.gain_pct(mode)).collect();
    (!g.is_empty()).then(|| (g.iter().sum::<f64>() / g.len() as f64, g.len()))
}

fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1} %")).unwrap_or_else(|| "—".into())
}

/// The Markdown section (with a trailing newline): mean gains per precision and mode
/// beside the seed paper's, then the overlap table.
pub fn markdown(gains: &[GainRow], overlap: &[OverlapRow]) -> String {
    let mut precisions: Vec<&str> = gains.iter().map(|r| r.precision.as_str()).collect();
    precisions.sort_by_key(|p| precision_rank(p));
    precisions.dedup();
    let mut s = String::from(
        "### Stencil2D: gain over host staging\n\n\
         Mean of (staged - mode) / staged over time per iteration, every ranks/size/halo point \
         of stencil_table.csv.\n\n\
         | precision | inter-k | inter-k-overlap | points | seed paper (2012 hardware) |\n\
         |---|---:|---:|---:|---:|\n",
    );
    for p in precisions {
        let ik = mean_gain(gains, p, INTER_K);
        let ov = mean_gain(gains, p, OVERLAP);
        let n = ik.map_or(0, |g| g.1).max(ov.map_or(0, |g| g.1));
        let seed = SEED_GAIN_PCT.iter().find(|s| s.0 == p).map(|s| s.1);
        s.push_str(&format!("| {p} | {} | {} | {n} | {} |\n", pct(ik.map(|g| g.0)), pct(ov.map(|g| g.0)), pct(seed)));
    }
    s.push_str(
        "\n### Stencil2D: overlap against compute alone (1 rank)\n\n\
         hidden = (inter-k - overlap) / (inter-k - compute): the share of the exchange's cost that \
         overlapping hides.\n\n\
         | precision | size | halo | ranks | compute (us) | inter-k (us) | overlap (us) | hidden | overlap / compute |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in overlap {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.precision,
            r.size,
            r.halo,
            r.ranks,
            num(r.compute),
            num(r.inter_k),
            num(r.overlap),
            pct(r.hidden_pct()),
            r.overlap_vs_compute().map(|v| format!("{v:.3}")).unwrap_or_else(|| "—".into()),
        ));
    }
    if overlap.is_empty() {
        s.push_str("| — | | | | | | | | |\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::parse_stencil;
    use super::*;

    // Single: staged 100, inter-k 90, overlap 80 at 2 ranks; compute alone 70, so the
    // exchange adds 20 and overlapping takes back 10 of it. Double at 4 ranks: no
    // overlap row. A second staged row for the same point is ignored.
    const CSV: &str = "bench,mode,precision,ranks,size,halo,metric,value
stencil2d,staged,single,2,4096,1,time_per_iter_us,100
stencil2d,staged,single,2,4096,1,comm_share_pct,55
stencil2d,inter-k,single,2,4096,1,time_per_iter_us,90
stencil2d,inter-k-overlap,single,2,4096,1,time_per_iter_us,80
stencil2d,staged,single,2,2048,1,time_per_iter_us,50
stencil2d,inter-k,single,2,2048,1,time_per_iter_us,40
stencil2d,inter-k-overlap,single,2,2048,1,time_per_iter_us,45
stencil2d,inter-k,single,4,4096,1,time_per_iter_us,190
stencil2d,inter-k-overlap,single,4,4096,1,time_per_iter_us,150
stencil2d,staged,double,4,4096,1,time_per_iter_us,200
stencil2d,staged,double,4,4096,1,time_per_iter_us,999
stencil2d,inter-k,double,4,4096,1,time_per_iter_us,150
stencil2d,inter-k,single,1,4096,1,time_per_iter_us,70
stencil2d,inter-k,single,1,4096,1,comm_share_pct,0
stencil2d,inter-k,double,1,4096,1,time_per_iter_us,100
stencil2d,inter-k,double,1,2048,4,time_per_iter_us,30
stencil2d,inter-k,double,2,2048,4,time_per_iter_us,30
stencil2d,inter-k-overlap,double,2,2048,4,time_per_iter_us,29
";

    fn rows() -> Vec<StencilRow> {
        parse_stencil(CSV).rows
    }

    fn close(a: Option<f64>, b: f64) {
        let a = a.expect("a value");
        assert!((a - b).abs() < 1e-9, "{a} != {b}");
    }

    #[test]
    fn gains_are_against_staged_at_the_same_point() {
        let t = gain_table(&rows());
        let keys: Vec<_> = t.iter().map(|r| (r.precision.as_str(), r.ranks, r.size, r.halo)).collect();
        assert_eq!(keys, [("single", 2, 2048, 1), ("single", 2, 4096, 1), ("double", 4, 4096, 1)]);
        close(t[1].inter_k_gain_pct(), 10.0);
        close(t[1].overlap_gain_pct(), 20.0);
        close(t[0].inter_k_gain_pct(), 20.0);
        close(t[0].overlap_gain_pct(), 10.0);
        assert_eq!(t[2].staged, 200.0, "the first staged row counts");
        close(t[2].inter_k_gain_pct(), 25.0);
        assert_eq!(t[2].overlap_gain_pct(), None);
        let (m, n) = mean_gain(&t, "single", INTER_K).unwrap();
        assert!((m - 15.0).abs() < 1e-9 && n == 2);
        assert_eq!(mean_gain(&t, "double", OVERLAP), None);
        assert_eq!(
            table_csv(&t),
            format!(
                "{TABLE_HEADER}\nsingle,2,2048,1,50.000,40.000,45.000,20.00,10.00\n\
                 single,2,4096,1,100.000,90.000,80.000,10.00,20.00\n\
                 double,4,4096,1,200.000,150.000,,25.00,\n"
            )
        );
    }

    #[test]
    fn hidden_share_is_of_what_the_exchange_adds_to_compute_alone() {
        let o = overlap_table(&rows());
        // double 4096/1 has no multi-rank overlap row; the smallest job with both wins.
        let keys: Vec<_> = o.iter().map(|r| (r.precision.as_str(), r.size, r.halo, r.ranks)).collect();
        assert_eq!(keys, [("single", 4096, 1, 2), ("double", 2048, 4, 2)]);
        assert_eq!((o[0].compute, o[0].inter_k, o[0].overlap), (70.0, 90.0, 80.0));
        close(o[0].hidden_pct(), 50.0);
        close(o[0].overlap_vs_compute(), 80.0 / 70.0);
        // inter-k no slower than compute alone: nothing to hide.
        assert_eq!(o[1].hidden_pct(), None);
        assert_eq!(
            overlap_csv(&o),
            format!("{OVERLAP_HEADER}\nsingle,4096,1,70.000,90.000,80.000,50.00,1.143\ndouble,2048,4,30.000,30.000,29.000,,0.967\n")
        );
        let md = markdown(&gain_table(&rows()), &o);
        assert!(md.contains("| single | 15.0 % | 15.0 % | 2 | 4.7 % |"), "{md}");
        assert!(md.contains("| double | 25.0 % | — | 1 | 2.3 % |"), "{md}");
        assert!(md.contains("| single | 4096 | 1 | 2 | 70.00 | 90.00 | 80.00 | 50.0 % | 1.143 |"), "{md}");
    }
}
