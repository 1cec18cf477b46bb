//! summary.csv (each gpulmt point beside its anchor) and protocols.csv (osu_bw GB/s
//! per protocol and size).
//!
//! Which anchor a point is compared with:
//! - osu_bw D D, any protocol: ce_peer GBps at the same size; protocol shm also
//!   staging d2h_GBps at the largest size at or below (a second row);
//! - osu_bibw D D: ce_peer_bi GBps at the same size;
//! - osu_latency D D: nccl half_rtt_us at the same size, ce_latency peer_us at the
//!   same size (it is measured at 8 B only), and copy_pingpong half_rtt_us at the same
//!   size (the floor of a copy-engine ping-pong, from copy_pingpong.csv);
//! - osu_latency H H: mpi_sm half_rtt_us at the same size (8 B, and the other sizes
//!   mpi_sm.csv has).
//!
//! A point gets one row per anchor found; a point with none gets one row with empty
//! anchor fields. Bandwidths are written in GB/s (MB/s / 1000, metric `GBps`);
//! ratio = ours / anchor for both kinds (above 1 is better for bandwidth, worse for
//! latency).

use super::{Anchors, Point};

/// The anchor a summary row is compared with.
#[derive(Clone, Debug, PartialEq)]
pub struct AnchorMatch {
    /// The anchor's name as its file spells it (ce_peer, nccl, staging, ...).
    pub name: String,
    /// The size the anchor was measured at (below the point's for staging).
    pub bytes: u64,
    pub value: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SummaryRow {
    pub bench: String,
    pub placement: String,
    pub protocol: String,
    pub bytes: u64,
    /// `us`, or `GBps` for what gpulmt.csv has in MBps.
    pub metric: String,
    pub value: f64,
    pub anchor: Option<AnchorMatch>,
}

impl SummaryRow {
    /// ours / anchor; None without an anchor or when the anchor is not positive.
    pub fn ratio(&self) -> Option<f64> {
        self.anchor.as_ref().filter(|a| a.value > 0.0).map(|a| self.value / a.value)
    }
}

pub const SUMMARY_HEADER: &str = "bench,placement,protocol,bytes,metric,value,anchor,anchor_value,ratio";
pub const PROTOCOLS_HEADER: &str = "bytes,get,put,coop,auto,split,best,auto_vs_best";

enum Lookup {
    Exact,
    AtOrBelow,
}

/// (anchor, metric, lookup) for each anchor a point is compared with.
fn rules(p: &Point) -> Vec<(&'static str, &'static str, Lookup)> {
    match (p.bench.as_str(), p.placement.as_str()) {
        ("osu_bw", "D D") => {
            let mut r = vec![("ce_peer", "GBps", Lookup::Exact)];
            if p.protocol == "shm" {
                r.push(("staging", "d2h_GBps", Lookup::AtOrBelow));
            }
            r
        }
        ("osu_bibw", "D D") => vec![("ce_peer_bi", "GBps", Lookup::Exact)],
        ("osu_latency", "D D") => {
            vec![
                ("nccl", "half_rtt_us", Lookup::Exact),
                ("ce_latency", "peer_us", Lookup::Exact),
                ("copy_pingpong", "half_rtt_us", Lookup::Exact),
            ]
        }
        ("osu_latency", "H H") => vec![("mpi_sm", "half_rtt_us", Lookup::Exact)],
        _ => Vec::new(),
    }
}

/// The point's value in the summary's unit: MBps becomes GBps.
pub fn in_summary_unit(p: &Point) -> (String, f64) {
    if p.metric.eq_ignore_ascii_case("MBps") {
        ("GBps".to_string(), p.value / 1000.0)
    } else {
        (p.metric.clone(), p.value)
    }
}

/// One row per (point, anchor found), in the points' order; a point without any
/// anchor gets one row with `anchor: None`.
pub fn summarize(points: &[Point], anchors: &Anchors) -> Vec<SummaryRow> {
    let mut out = Vec::new();
    for p in points {
        let (metric, value) = in_summary_unit(p);
        let row = |anchor| SummaryRow {
            bench: p.bench.clone(),
            placement: p.placement.clone(),
            protocol: p.protocol.clone(),
            bytes: p.bytes,
            metric: metric.clone(),
            value,
            anchor,
        };
        let found: Vec<AnchorMatch> = rules(p)
            .into_iter()
            .filter_map(|(name, m, lookup)| {
                let (bytes, value) = match lookup {
                    Lookup::Exact => (p.bytes, anchors.exact(name, m, p.bytes)?),
                    Lookup::AtOrBelow => anchors.at_or_below(name, m, p.bytes)?,
                };
                Some(AnchorMatch { name: name.to_string(), bytes, value })
            })
            .collect();
        if found.is_empty() {
            out.push(row(None));
        } else {
            out.extend(found.into_iter().map(|a| row(Some(a))));
        }
    }
    out
}

fn fmt_value(metric: &str, v: f64) -> String {
    if metric == "us" {
        format!("{v:.4}")
    } else {
        format!("{v:.3}")
    }
}

pub(super) fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}")).unwrap_or_default()
}

pub fn summary_csv(rows: &[SummaryRow]) -> String {
    super::csv_text(
        SUMMARY_HEADER,
        rows.iter().map(|r| {
            let (name, av) = match &r.anchor {
                Some(a) => (a.name.clone(), format!("{:.3}", a.value)),
                None => (String::new(), String::new()),
            };
            [
                r.bench.clone(),
                r.placement.clone(),
                r.protocol.clone(),
                r.bytes.to_string(),
                r.metric.clone(),
                fmt_value(&r.metric, r.value),
                name,
                av,
                opt(r.ratio(), 3),
            ]
        }),
    )
}

/// One size of protocols.csv, bandwidths in GB/s.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProtoRow {
    pub bytes: u64,
    pub get: Option<f64>,
    pub put: Option<f64>,
    pub coop: Option<f64>,
    pub auto: Option<f64>,
    /// From split.csv (split copies over lanes).
    pub split: Option<f64>,
}

impl ProtoRow {
    /// The best of the fixed choices (get, put, coop, split): what auto is measured
    /// against.
    pub fn best(&self) -> Option<f64> {
        [self.get, self.put, self.coop, self.split].into_iter().flatten().reduce(f64::max)
    }

    pub fn auto_vs_best(&self) -> Option<f64> {
        match (self.auto, self.best()) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        }
    }
}

fn is_dd_bw(p: &Point) -> bool {
    p.bench == "osu_bw" && p.placement == "D D" && p.metric.eq_ignore_ascii_case("MBps")
}

/// osu_bw D D in GB/s per protocol for every size any of them has, sorted by size.
/// Split comes from split.csv's osu_bw D D rows (whatever protocol they name). A cell
/// measured by several runs holds their median: at 64 KiB - 1 MiB two runs of one
/// protocol differ by 5-25 % on 2x H200, more than the choices between protocols.
pub fn protocol_table(points: &[Point], split: Option<&[Point]>) -> Vec<ProtoRow> {
    let mut rows: Vec<ProtoRow> = Vec::new();
    let mut slot = |bytes: u64| -> usize {
        match rows.iter().position(|r| r.bytes == bytes) {
            Some(i) => i,
            None => {
                rows.push(ProtoRow { bytes, ..Default::default() });
                rows.len() - 1
            }
        }
    };
    let mut cells: Vec<(usize, &str, f64)> = Vec::new();
    for p in points.iter().filter(|p| is_dd_bw(p)) {
        if matches!(p.protocol.as_str(), "get" | "put" | "coop" | "auto") {
            cells.push((slot(p.bytes), p.protocol.as_str(), p.value / 1000.0));
        }
    }
    for p in split.unwrap_or(&[]).iter().filter(|p| is_dd_bw(p)) {
        cells.push((slot(p.bytes), "split", p.value / 1000.0));
    }
    // The runs of each cell, in order of appearance.
    let mut runs: Vec<((usize, &str), Vec<f64>)> = Vec::new();
    for (i, col, v) in cells {
        match runs.iter_mut().find(|(k, _)| *k == (i, col)) {
            Some((_, vs)) => vs.push(v),
            None => runs.push(((i, col), vec![v])),
        }
    }
    for ((i, col), vs) in runs {
        let r = &mut rows[i];
        let cell = match col {
            "get" => &mut r.get,
            "put" => &mut r.put,
            "coop" => &mut r.coop,
            "auto" => &mut r.auto,
            _ => &mut r.split,
        };
        *cell = Some(median(vs));
    }
    rows.sort_by_key(|r| r.bytes);
    rows
}

/// The median of a non-empty list (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn protocols_csv(rows: &[ProtoRow]) -> String {
    super::csv_text(
        PROTOCOLS_HEADER,
        rows.iter().map(|r| {
            [
                r.bytes.to_string(),
                opt(r.get, 3),
                opt(r.put, 3),
                opt(r.coop, 3),
                opt(r.auto, 3),
                opt(r.split, 3),
                opt(r.best(), 3),
                opt(r.auto_vs_best(), 3),
            ]
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::super::{parse_anchors, parse_points, Anchors};
    use super::*;

    const POINTS: &str = "bench,placement,protocol,bytes,metric,value
osu_bw,D D,auto,4194304,MBps,318200.0
osu_bw,D D,auto,8192,MBps,3000.0
osu_bw,D D,shm,4194304,MBps,33791.3899
osu_bw,D D,shm,65536,MBps,3172.3
osu_bibw,D D,get,4194304,MBps,530000
osu_latency,D D,auto,8,us,10.3050
osu_latency,D D,put,4,us,10.2
osu_latency,D D,put,2,us,10.1
osu_latency,H H,auto,8,us,1.0559
osu_latency,H D,auto,8,us,2.0
";

    const ANCHORS: &str = "anchor,metric,bytes,value
ce_peer,GBps,4194304,324.0
ce_peer_bi,GBps,4194304,640.0
ce_latency,peer_us,8,7.833
nccl,half_rtt_us,4,21.595
staging,d2h_GBps,1048576,41.743
staging,d2h_GBps,16777216,54.626
mpi_sm,half_rtt_us,8,0.411
copy_pingpong,half_rtt_us,8,7.405
";

    fn rows() -> Vec<SummaryRow> {
        summarize(&parse_points(POINTS).rows, &Anchors::new(parse_anchors(ANCHORS).rows))
    }

    fn find<'a>(rows: &'a [SummaryRow], bench: &str, proto: &str, bytes: u64) -> Vec<&'a SummaryRow> {
        rows.iter().filter(|r| r.bench == bench && r.protocol == proto && r.bytes == bytes).collect()
    }

    #[test]
    fn bandwidth_is_converted_to_gbps_and_compared_with_ce_peer() {
        let rows = rows();
        let r = find(&rows, "osu_bw", "auto", 4194304);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].metric, "GBps");
        assert!((r[0].value - 318.2).abs() < 1e-9);
        let a = r[0].anchor.as_ref().unwrap();
        assert_eq!((a.name.as_str(), a.value), ("ce_peer", 324.0));
        assert!((r[0].ratio().unwrap() - 318.2 / 324.0).abs() < 1e-12);
        let csv = summary_csv(&rows);
        assert!(csv.starts_with(SUMMARY_HEADER));
        assert!(csv.contains("\nosu_bw,D D,auto,4194304,GBps,318.200,ce_peer,324.000,0.982\n"), "{csv}");
        let bi = find(&rows, "osu_bibw", "get", 4194304);
        assert_eq!(bi[0].anchor.as_ref().unwrap().name, "ce_peer_bi");
        assert!((bi[0].ratio().unwrap() - 530.0 / 640.0).abs() < 1e-12);
    }

    #[test]
    fn a_point_without_anchor_gets_one_row_with_empty_anchor_fields() {
        let rows = rows();
        let r = find(&rows, "osu_bw", "auto", 8192);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].anchor, None);
        assert_eq!(r[0].ratio(), None);
        assert!(summary_csv(&rows).contains("\nosu_bw,D D,auto,8192,GBps,3.000,,,\n"));
        // Latency at 2 B: neither nccl nor ce_latency; placement H D: no rule at all.
        assert_eq!(find(&rows, "osu_latency", "put", 2)[0].anchor, None);
        let hd: Vec<_> = rows.iter().filter(|r| r.placement == "H D").collect();
        assert_eq!(hd.len(), 1);
        assert_eq!(hd[0].anchor, None);
    }

    #[test]
    fn shm_is_compared_with_staging_at_the_nearest_size_at_or_below() {
        let rows = rows();
        let r = find(&rows, "osu_bw", "shm", 4194304);
        let names: Vec<_> = r.iter().map(|r| r.anchor.as_ref().unwrap().name.as_str()).collect();
        assert_eq!(names, ["ce_peer", "staging"]);
        let st = r[1].anchor.as_ref().unwrap();
        assert_eq!((st.bytes, st.value), (1048576, 41.743));
        assert!((r[1].ratio().unwrap() - 33.7913899 / 41.743).abs() < 1e-9);
        // Below the smallest staging size: nothing to compare with.
        let small = find(&rows, "osu_bw", "shm", 65536);
        assert_eq!(small.len(), 1);
        assert_eq!(small[0].anchor, None);
        let a = Anchors::new(parse_anchors(ANCHORS).rows);
        assert_eq!(a.at_or_below("staging", "d2h_GBps", 16777216), Some((16777216, 54.626)));
        assert_eq!(a.at_or_below("staging", "d2h_GBps", 1 << 30), Some((16777216, 54.626)));
        assert_eq!(a.at_or_below("staging", "d2h_GBps", 1048575), None);
    }

    #[test]
    fn latency_rows_compare_with_nccl_ce_latency_copy_pingpong_and_mpi_sm() {
        let rows = rows();
        let r8 = find(&rows, "osu_latency", "auto", 8);
        let dd: Vec<_> = r8.iter().filter(|r| r.placement == "D D").collect();
        let names: Vec<_> = dd.iter().map(|r| r.anchor.as_ref().unwrap().name.as_str()).collect();
        assert_eq!(names, ["ce_latency", "copy_pingpong"], "no nccl at 8 B");
        assert!(dd.iter().all(|r| r.metric == "us"));
        assert!((dd[1].ratio().unwrap() - 10.305 / 7.405).abs() < 1e-12);
        let r4 = find(&rows, "osu_latency", "put", 4);
        assert_eq!(r4[0].anchor.as_ref().unwrap().name, "nccl");
        assert!((r4[0].ratio().unwrap() - 10.2 / 21.595).abs() < 1e-12);
        let hh: Vec<_> = r8.iter().filter(|r| r.placement == "H H").collect();
        assert_eq!(hh[0].anchor.as_ref().unwrap().name, "mpi_sm");
        assert!((hh[0].ratio().unwrap() - 1.0559 / 0.411).abs() < 1e-12);
    }

    #[test]
    fn protocol_table_has_every_size_and_auto_against_the_best_fixed_choice() {
        let pts = parse_points(
            "osu_bw,D D,get,1024,MBps,1000
osu_bw,D D,put,1024,MBps,2000
osu_bw,D D,coop,1024,MBps,1500
osu_bw,D D,auto,1024,MBps,1900
osu_bw,D D,auto,512,MBps,700
osu_bw,D D,shm,1024,MBps,99999
osu_bibw,D D,get,1024,MBps,99999
",
        )
        .rows;
        let split = parse_points("osu_bw,D D,get,1024,MBps,2500\n").rows;
        let t = protocol_table(&pts, Some(&split));
        assert_eq!(t.iter().map(|r| r.bytes).collect::<Vec<_>>(), [512, 1024]);
        assert_eq!(t[1].best(), Some(2.5));
        assert!((t[1].auto_vs_best().unwrap() - 1.9 / 2.5).abs() < 1e-12);
        assert_eq!(t[0].best(), None);
        let csv = protocols_csv(&t);
        assert_eq!(
            csv,
            format!("{PROTOCOLS_HEADER}\n512,,,,0.700,,,\n1024,1.000,2.000,1.500,1.900,2.500,2.500,0.760\n")
        );
        // Repeated runs of a cell give its median.
        let repeated = parse_points(
            "osu_bw,D D,get,1024,MBps,1000
osu_bw,D D,get,1024,MBps,3000
osu_bw,D D,get,1024,MBps,2000
osu_bw,D D,auto,1024,MBps,1000
osu_bw,D D,auto,1024,MBps,2000
",
        )
        .rows;
        let t = protocol_table(&repeated, None);
        assert_eq!((t[0].get, t[0].auto), (Some(2.0), Some(1.5)));
        let no_split = protocol_table(&pts, None);
        assert_eq!(no_split[1].best(), Some(2.0));
    }
}
