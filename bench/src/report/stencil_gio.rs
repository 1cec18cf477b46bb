//! Stencil2D's `gio` mode against the inter-kernel modes (seed 000's comparison, figure
//! 6-8: GIO against Inter-K and Inter-K-Overlap): stencil_gio.csv and its Markdown
//! section, from the `time_per_iter_us` rows of stencil.csv.
//!
//! gain over a mode = (mode - gio) / mode * 100, at the same precision, ranks, size and
//! halo: positive when gio is faster (the paper reports up to 40 % over Inter-K).

use super::stencil::{gain_pct, time, INTER_K, OVERLAP, TIME};
use super::summary::opt;
use super::StencilRow;

pub const GIO: &str = "gio";

pub const GIO_HEADER: &str =
    "precision,ranks,size,halo,inter_k_us,overlap_us,gio_us,gio_vs_inter_k_pct,gio_vs_overlap_pct";

/// One row of stencil_gio.csv, times in us.
#[derive(Clone, Debug, PartialEq)]
pub struct GioRow {
    pub precision: String,
    pub ranks: u32,
    pub size: u64,
    pub halo: u32,
    pub gio: f64,
    pub inter_k: Option<f64>,
    pub overlap: Option<f64>,
}

impl GioRow {
    /// (inter_k - gio) / inter_k * 100.
    pub fn vs_inter_k(&self) -> Option<f64> {
        gain_pct(self.inter_k?, self.gio)
    }

    /// (overlap - gio) / overlap * 100.
    pub fn vs_overlap(&self) -> Option<f64> {
        gain_pct(self.overlap?, self.gio)
    }
}

/// One row per (precision, ranks, size, halo) with a gio time, in the order of the file.
pub fn gio_table(rows: &[StencilRow]) -> Vec<GioRow> {
    let mut out: Vec<GioRow> = Vec::new();
    for r in rows.iter().filter(|r| r.metric == TIME && r.mode == GIO) {
        if out.iter().any(|g| g.precision == r.precision && g.ranks == r.ranks && g.size == r.size && g.halo == r.halo)
        {
            continue;
        }
        let at = |mode| time(rows, &r.precision, mode, r.ranks, r.size, r.halo);
        out.push(GioRow {
            precision: r.precision.clone(),
            ranks: r.ranks,
            size: r.size,
            halo: r.halo,
            gio: r.value,
            inter_k: at(INTER_K),
            overlap: at(OVERLAP),
        });
    }
    out
}

pub fn gio_csv(rows: &[GioRow]) -> String {
    super::csv_text(
        GIO_HEADER,
        rows.iter().map(|r| {
            [
                r.precision.clone(),
                r.ranks.to_string(),
                r.size.to_string(),
                r.halo.to_string(),
                opt(r.inter_k, 3),
                opt(r.overlap, 3),
                format!("{:.3}", r.gio),
                opt(r.vs_inter_k(), 2),
                opt(r.vs_overlap(), 2),
            ]
        }),
    )
}

/// The Markdown section (empty without gio rows).
pub fn markdown(rows: &[GioRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n### Stencil2D: GIO mode (one persistent kernel) against the inter-kernel modes\n\n\
         gain = (mode - gio) / mode: positive when gio takes less time per step (seed 000: up to 40 % over \
         inter-kernel).\n\n\
         | precision | ranks | size | halo | inter-k (us) | overlap (us) | gio (us) | vs inter-k | vs overlap |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let num = |v: Option<f64>| v.map_or_else(|| "—".to_string(), |v| format!("{v:.2}"));
    let pct = |v: Option<f64>| v.map_or_else(|| "—".to_string(), |v| format!("{v:.1} %"));
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {} |\n",
            r.precision,
            r.ranks,
            r.size,
            r.halo,
            num(r.inter_k),
            num(r.overlap),
            r.gio,
            pct(r.vs_inter_k()),
            pct(r.vs_overlap())
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::parse_stencil;
    use super::*;

    const CSV: &str = "bench,mode,precision,ranks,size,halo,metric,value
stencil2d,inter-k,single,2,2048,1,time_per_iter_us,66
stencil2d,inter-k-overlap,single,2,2048,1,time_per_iter_us,55
stencil2d,gio,single,2,2048,1,time_per_iter_us,44
stencil2d,gio,single,2,2048,1,comm_share_pct,5
stencil2d,gio,double,4,4096,4,time_per_iter_us,100
stencil2d,gio,double,4,4096,4,time_per_iter_us,999
";

    #[test]
    fn gio_is_compared_with_both_inter_kernel_modes_at_the_same_point() {
        let t = gio_table(&parse_stencil(CSV).rows);
        assert_eq!(t.len(), 2, "the second gio row of a point is ignored");
        let g = t[0].vs_inter_k().unwrap();
        assert!((g - 100.0 / 3.0).abs() < 1e-9, "{g}");
        assert!((t[0].vs_overlap().unwrap() - 20.0).abs() < 1e-9);
        assert_eq!((t[1].gio, t[1].vs_inter_k()), (100.0, None));
        assert_eq!(
            gio_csv(&t),
            format!("{GIO_HEADER}\nsingle,2,2048,1,66.000,55.000,44.000,33.33,20.00\ndouble,4,4096,4,,,100.000,,\n")
        );
        let md = markdown(&t);
        assert!(md.contains("| single | 2 | 2048 | 1 | 66.00 | 55.00 | 44.00 | 33.3 % | 20.0 % |"), "{md}");
        assert_eq!(markdown(&[]), "");
    }
}
