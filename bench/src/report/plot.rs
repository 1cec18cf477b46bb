//! The SVG plots: latency.svg (log-log), bandwidth.svg and bibw.svg (log x, GB/s),
//! and stencil.svg (Stencil2D time per iteration against grid size, log-log).
//!
//! The x axis is log2(x) on a linear axis, labelled in binary units (bytes) or as
//! plain numbers (grid sides), so ticks fall on powers of two. gpulmt's own series
//! are solid (or dashed) lines with markers; anchors are dashed. Anchors are clipped to the sizes gpulmt's series cover. Text is left
//! to the SVG viewer's sans-serif font (plotters is built without font support).

use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::prelude::*;

use super::stencil::{INTER_K, OVERLAP, STAGED, TIME};
use super::table::human_bytes;
use super::{Inputs, Point, ReportError, StencilRow};

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 700;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    /// A gpulmt series: solid line with markers.
    Ours,
    /// A second gpulmt series of the same colour: dashed line with markers.
    OursDashed,
    /// A reference: dashed line.
    Anchor,
    /// A single reference point: a large marker.
    AnchorPoint,
}

#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub kind: Kind,
    pub color: RGBColor,
    /// (x, y), x > 0 (bytes, or a grid side), sorted by x.
    pub points: Vec<(u64, f64)>,
}

/// What the (log2) x axis counts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum XAxis {
    /// Message size: ticks 1K, 1M, ..., points named 4 KiB.
    Bytes,
    /// Stencil2D grid side: ticks and points as plain numbers.
    GridSide,
}

impl XAxis {
    fn desc(self) -> &'static str {
        match self {
            XAxis::Bytes => "message size (bytes, log scale)",
            XAxis::GridSide => "grid size N (N x N points per rank, log scale)",
        }
    }

    /// A tick at log2(x) = v; empty between powers of two.
    fn tick(self, v: f64) -> String {
        let r = v.round();
        if (v - r).abs() > 1e-6 || r < 0.0 {
            return String::new();
        }
        let b = 1u64 << (r as u32).min(62);
        match self {
            XAxis::GridSide => b.to_string(),
            XAxis::Bytes => match b {
                b if b >= 1 << 30 => format!("{}G", b >> 30),
                b if b >= 1 << 20 => format!("{}M", b >> 20),
                b if b >= 1 << 10 => format!("{}K", b >> 10),
                b => b.to_string(),
            },
        }
    }

    /// One x value in a legend label.
    fn point(self, x: u64) -> String {
        match self {
            XAxis::Bytes => human_bytes(x),
            XAxis::GridSide => x.to_string(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Plot {
    pub title: String,
    pub x: XAxis,
    pub y_desc: String,
    pub log_y: bool,
    pub series: Vec<Series>,
}

const RED: RGBColor = RGBColor(214, 39, 40);

fn protocol_color(p: &str) -> RGBColor {
    match p {
        "auto" => RGBColor(0, 0, 0),
        "get" => RGBColor(31, 119, 180),
        "put" => RGBColor(255, 127, 14),
        "coop" => RGBColor(44, 160, 44),
        "shm" => RGBColor(148, 103, 189),
        "split" => RGBColor(140, 86, 75),
        _ => RGBColor(227, 119, 194),
    }
}

fn protocol_label(p: &str) -> String {
    match p {
        "get" => "gpulmt GET".into(),
        "put" => "gpulmt PUT".into(),
        "coop" => "gpulmt COOPERATE".into(),
        "shm" => "gpulmt shm (host staging)".into(),
        other => format!("gpulmt {other}"),
    }
}

/// One series per protocol of (bench, D D), in the order auto, get, put, coop, then
/// others as they appear; `skip` protocols are left out. MB/s become GB/s.
fn ours(points: &[Point], bench: &str, skip: &[&str]) -> Vec<Series> {
    let mut protos: Vec<&str> = Vec::new();
    for p in points.iter().filter(|p| p.bench == bench && p.placement == "D D") {
        if !protos.contains(&p.protocol.as_str()) && !skip.contains(&p.protocol.as_str()) {
            protos.push(&p.protocol);
        }
    }
    let rank = |p: &str| ["auto", "get", "put", "coop"].iter().position(|q| *q == p).unwrap_or(9);
    protos.sort_by_key(|p| rank(p));
    protos
        .into_iter()
        .map(|proto| Series {
            label: protocol_label(proto),
            kind: Kind::Ours,
            color: protocol_color(proto),
            points: of(points, bench, proto),
        })
        .collect()
}

fn of(points: &[Point], bench: &str, proto: &str) -> Vec<(u64, f64)> {
    let mut v: Vec<(u64, f64)> = points
        .iter()
        .filter(|p| p.bench == bench && p.placement == "D D" && p.protocol == proto && p.bytes > 0)
        .map(|p| (p.bytes, if p.metric.eq_ignore_ascii_case("MBps") { p.value / 1000.0 } else { p.value }))
        .collect();
    v.sort_by_key(|p| p.0);
    v.dedup_by_key(|p| p.0);
    v
}

fn anchor(inputs: &Inputs, name: &str, metric: &str, label: &str, color: RGBColor) -> Series {
    let points: Vec<(u64, f64)> = inputs.anchors.series(name, metric).into_iter().filter(|p| p.0 > 0).collect();
    let kind = if points.len() == 1 { Kind::AnchorPoint } else { Kind::Anchor };
    Series { label: label.into(), kind, color, points }
}

pub fn latency_plot(inputs: &Inputs) -> Plot {
    let mut series = ours(&inputs.points, "osu_latency", &[]);
    series.push(anchor(inputs, "nccl", "half_rtt_us", "NCCL send/recv (half RTT)", RGBColor(23, 190, 207)));
    series.push(anchor(
        inputs,
        "staged_mpi",
        "half_rtt_us",
        "MPI staged through host (half RTT)",
        RGBColor(188, 189, 34),
    ));
    series.push(anchor(inputs, "ce_latency", "peer_us", "cudaMemcpyPeer latency (copy engine)", RED));
    series.push(anchor(
        inputs,
        "copy_pingpong",
        "half_rtt_us",
        "copy-engine ping-pong floor (half RTT)",
        RGBColor(140, 86, 75),
    ));
    Plot {
        title: format!("osu_latency, D D: gpulmt vs anchors ({})", inputs.source),
        x: XAxis::Bytes,
        y_desc: "latency (us, log)".into(),
        log_y: true,
        series,
    }
}

pub fn bandwidth_plot(inputs: &Inputs) -> Plot {
    let mut series = ours(&inputs.points, "osu_bw", &["shm"]);
    if let Some(split) = &inputs.split {
        for proto in split.iter().filter(|p| p.bench == "osu_bw").map(|p| p.protocol.clone()).fold(
            Vec::<String>::new(),
            |mut v, p| {
                if !v.contains(&p) {
                    v.push(p);
                }
                v
            },
        ) {
            series.push(Series {
                label: format!("gpulmt split copies over lanes ({proto})"),
                kind: Kind::Ours,
                color: protocol_color("split"),
                points: of(split, "osu_bw", &proto),
            });
        }
    }
    let shm = of(&inputs.points, "osu_bw", "shm");
    if !shm.is_empty() {
        series.push(Series {
            label: protocol_label("shm"),
            kind: Kind::Ours,
            color: protocol_color("shm"),
            points: shm,
        });
    }
    series.push(anchor(inputs, "ce_peer", "GBps", "cudaMemcpyPeer (copy engine)", RED));
    series.push(anchor(inputs, "staging", "d2h_GBps", "staging copy D→H", RGBColor(127, 127, 127)));
    series.push(anchor(inputs, "staging", "h2d_GBps", "staging copy H→D", RGBColor(90, 90, 90)));
    series.push(anchor(inputs, "staged_mpi", "GBps", "MPI staged through host", RGBColor(188, 189, 34)));
    Plot {
        title: format!("osu_bw, D D: gpulmt vs anchors ({})", inputs.source),
        x: XAxis::Bytes,
        y_desc: "bandwidth (GB/s = 10^9 B/s)".into(),
        log_y: false,
        series,
    }
}

pub fn bibw_plot(inputs: &Inputs) -> Plot {
    let mut series = ours(&inputs.points, "osu_bibw", &[]);
    series.push(anchor(inputs, "ce_peer_bi", "GBps", "cudaMemcpyPeer both ways (copy engine)", RED));
    Plot {
        title: format!("osu_bibw, D D: gpulmt vs anchors ({})", inputs.source),
        x: XAxis::Bytes,
        y_desc: "bi-directional bandwidth (GB/s, both directions)".into(),
        log_y: false,
        series,
    }
}

fn mode_color(mode: &str) -> RGBColor {
    match mode {
        STAGED => RGBColor(127, 127, 127),
        INTER_K => RGBColor(31, 119, 180),
        OVERLAP => RGBColor(255, 127, 14),
        _ => RGBColor(227, 119, 194),
    }
}

/// The precision and halo stencil.svg shows.
pub const STENCIL_PLOT: (&str, u32) = ("single", 1);

/// stencil.svg: time per iteration against size, one series per (mode, ranks) at
/// [`STENCIL_PLOT`]'s precision and halo. A colour per mode (staged, inter-k,
/// inter-k-overlap, then others as they appear); the smallest multi-rank job solid,
/// larger ones dashed; a 1-rank job measured at one size only (compute alone) is a
/// single marker.
pub fn stencil_plot(rows: &[StencilRow], source: &str) -> Plot {
    let (precision, halo) = STENCIL_PLOT;
    let rows: Vec<&StencilRow> =
        rows.iter().filter(|r| r.metric == TIME && r.precision == precision && r.halo == halo && r.size > 0).collect();
    let mut keys: Vec<(&str, u32)> = Vec::new();
    for r in &rows {
        if !keys.contains(&(r.mode.as_str(), r.ranks)) {
            keys.push((&r.mode, r.ranks));
        }
    }
    let rank = |m: &str| [STAGED, INTER_K, OVERLAP].iter().position(|q| *q == m).unwrap_or(9);
    keys.sort_by_key(|&(m, n)| (n == 1, rank(m), n));
    let first_multi = keys.iter().map(|k| k.1).filter(|&n| n > 1).min();
    let series = keys
        .into_iter()
        .map(|(mode, ranks)| {
            let mut points: Vec<(u64, f64)> =
                rows.iter().filter(|r| r.mode == mode && r.ranks == ranks).map(|r| (r.size, r.value)).collect();
            points.sort_by_key(|p| p.0);
            points.dedup_by_key(|p| p.0);
            let (label, kind) = if ranks == 1 {
                let kind = if points.len() == 1 { Kind::AnchorPoint } else { Kind::Ours };
                (format!("{mode}, 1 rank: compute alone"), kind)
            } else {
                let kind = if Some(ranks) == first_multi { Kind::Ours } else { Kind::OursDashed };
                (format!("{mode}, {ranks} ranks"), kind)
            };
            Series { label, kind, color: mode_color(mode), points }
        })
        .collect();
    Plot {
        title: format!("Stencil2D, {precision} precision, halo {halo}: time per iteration ({source})"),
        x: XAxis::GridSide,
        y_desc: "time per iteration (us, log scale)".into(),
        log_y: true,
        series,
    }
}

/// Renders the three plots: (file name, SVG text).
pub fn all(inputs: &Inputs) -> Result<Vec<(&'static str, String)>, ReportError> {
    Ok(vec![
        ("latency.svg", render(&latency_plot(inputs))?),
        ("bandwidth.svg", render(&bandwidth_plot(inputs))?),
        ("bibw.svg", render(&bibw_plot(inputs))?),
    ])
}

fn lg(b: u64) -> f64 {
    (b as f64).log2()
}

/// Draws a plot into SVG text. Series are clipped to the sizes gpulmt's series
/// cover; empty series are left out.
pub fn render(plot: &Plot) -> Result<String, ReportError> {
    let ours: Vec<u64> = plot
        .series
        .iter()
        .filter(|s| matches!(s.kind, Kind::Ours | Kind::OursDashed))
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    let (lo, hi) = match (ours.iter().min(), ours.iter().max()) {
        (Some(&lo), Some(&hi)) => (lo, hi),
        _ => {
            let all: Vec<u64> = plot.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
            (all.iter().copied().min().unwrap_or(1), all.iter().copied().max().unwrap_or(2))
        }
    };
    let series: Vec<Series> = plot
        .series
        .iter()
        .map(|s| Series {
            points: s
                .points
                .iter()
                .copied()
                .filter(|&(b, y)| b >= lo && b <= hi && y.is_finite() && (!plot.log_y || y > 0.0))
                .collect(),
            ..s.clone()
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    let x = lg(lo).floor()..lg(hi).ceil().max(lg(lo).floor() + 1.0);
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (ymin, ymax) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| (a.min(y), b.max(y)));
    let (ymin, ymax) = if ymin.is_finite() { (ymin, ymax) } else { (1.0, 10.0) };
    if plot.log_y {
        let lo = 10f64.powf((ymin.log10() - 0.05).floor());
        let hi = 10f64.powf((ymax.log10() + 0.05).ceil());
        draw(plot, &series, x, (lo..hi).log_scale())
    } else {
        draw(plot, &series, x, 0.0..(ymax * 1.08).max(1e-9))
    }
}

fn y_label(v: &f64) -> String {
    let v = *v;
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1.0 && (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn err<E: std::fmt::Debug>(what: &str) -> impl Fn(E) -> ReportError + '_ {
    move |e| ReportError(format!("plot '{what}': {e:?}"))
}

fn draw<Y>(plot: &Plot, series: &[Series], x: std::ops::Range<f64>, y: Y) -> Result<String, ReportError>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let e = err(&plot.title);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(&e)?;
        let x_ticks = (x.end - x.start) as usize + 1;
        let x_axis = plot.x;
        let x_label = move |v: &f64| x_axis.tick(*v);
        let mut chart = ChartBuilder::on(&root)
            .caption(&plot.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(x, y)
            .map_err(&e)?;
        chart
            .configure_mesh()
            .x_labels(x_ticks)
            .x_label_formatter(&x_label)
            .y_label_formatter(&y_label)
            .x_desc(plot.x.desc())
            .y_desc(plot.y_desc.as_str())
            .axis_desc_style(("sans-serif", 17))
            .label_style(("sans-serif", 14))
            .light_line_style(RGBColor(235, 235, 235))
            .bold_line_style(RGBColor(205, 205, 205))
            .draw()
            .map_err(&e)?;
        for s in series {
            let color = s.color;
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(b, y)| (lg(b), y)).collect();
            match s.kind {
                Kind::Ours => {
                    chart
                        .draw_series(LineSeries::new(pts, color.stroke_width(2)).point_size(3))
                        .map_err(&e)?
                        .label(s.label.as_str())
                        .legend(move |(x, y)| {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (22, 0)], color.stroke_width(2))
                                + Circle::new((11, 0), 3, color.filled())
                        });
                }
                Kind::OursDashed => {
                    chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(&e)?;
                    chart
                        .draw_series(DashedLineSeries::new(pts, 8, 5, color.stroke_width(2)))
                        .map_err(&e)?
                        .label(s.label.as_str())
                        .legend(move |(x, y)| {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (5, 0)], color.stroke_width(2))
                                + PathElement::new(vec![(17, 0), (22, 0)], color.stroke_width(2))
                                + Circle::new((11, 0), 3, color.filled())
                        });
                }
                Kind::Anchor => {
                    chart
                        .draw_series(DashedLineSeries::new(pts, 8, 5, color.stroke_width(2)))
                        .map_err(&e)?
                        .label(s.label.as_str())
                        .legend(move |(x, y)| {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (8, 0)], color.stroke_width(2))
                                + PathElement::new(vec![(13, 0), (22, 0)], color.stroke_width(2))
                        });
                }
                Kind::AnchorPoint => {
                    let label = format!("{} ({} at {})", s.label, y_label(&s.points[0].1), plot.x.point(s.points[0].0));
                    chart
                        .draw_series(pts.into_iter().map(|p| TriangleMarker::new(p, 9, color.filled())))
                        .map_err(&e)?
                        .label(label)
                        .legend(move |(x, y)| TriangleMarker::new((x + 11, y), 6, color.filled()));
                }
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .margin(12)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.9))
            .border_style(RGBColor(160, 160, 160))
            .draw()
            .map_err(&e)?;
        root.present().map_err(&e)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::super::{parse_anchors, parse_points, Anchors};
    use super::*;

    #[test]
    fn plots_render_with_labels_and_legend() {
        let inputs = Inputs {
            points: parse_points(
                "osu_latency,D D,auto,0,us,1.0\nosu_latency,D D,auto,8,us,10.3\nosu_latency,D D,auto,1048576,us,14\n\
                 osu_bw,D D,get,65536,MBps,12000\nosu_bw,D D,get,1048576,MBps,180000\nosu_bw,D D,shm,1048576,MBps,18000\n",
            )
            .rows,
            split: None,
            stencil: None,
            anchors: Anchors::new(
                parse_anchors("ce_latency,peer_us,8,7.8\nnccl,half_rtt_us,4,21.6\nnccl,half_rtt_us,1048576,27.9\nce_peer,GBps,1,0.0\nce_peer,GBps,1048576,213\n").rows,
            ),
            source: "t/run".into(),
        };
        let lat = render(&latency_plot(&inputs)).unwrap();
        assert!(lat.starts_with("<svg"));
        for text in ["osu_latency, D D", "latency (us, log)", "gpulmt auto", "NCCL", "cudaMemcpyPeer latency", "1M"] {
            assert!(lat.contains(text), "latency.svg lacks {text}");
        }
        let bw = render(&bandwidth_plot(&inputs)).unwrap();
        for text in ["GB/s", "gpulmt GET", "shm", "cudaMemcpyPeer (copy engine)", "64K"] {
            assert!(bw.contains(text), "bandwidth.svg lacks {text}");
        }
        // No osu_bibw points: still an (empty but labelled) plot.
        assert!(render(&bibw_plot(&inputs)).unwrap().contains("osu_bibw"));
    }

    #[test]
    fn stencil_plot_has_a_series_per_mode_and_ranks_at_single_halo_1() {
        let rows = super::super::parse_stencil(
            "stencil2d,staged,single,2,2048,1,time_per_iter_us,53\n\
             stencil2d,staged,single,2,4096,1,time_per_iter_us,113\n\
             stencil2d,staged,single,2,4096,1,comm_share_pct,57\n\
             stencil2d,inter-k,single,4,2048,1,time_per_iter_us,92\n\
             stencil2d,inter-k,single,4,4096,1,time_per_iter_us,202\n\
             stencil2d,inter-k,single,1,4096,1,time_per_iter_us,77.5\n\
             stencil2d,inter-k,single,2,4096,4,time_per_iter_us,1\n\
             stencil2d,inter-k,double,2,4096,1,time_per_iter_us,1\n",
        )
        .rows;
        let p = stencil_plot(&rows, "t/run");
        let got: Vec<_> = p.series.iter().map(|s| (s.label.as_str(), s.kind, s.points.clone())).collect();
        assert_eq!(
            got,
            [
                ("staged, 2 ranks", Kind::Ours, vec![(2048, 53.0), (4096, 113.0)]),
                ("inter-k, 4 ranks", Kind::OursDashed, vec![(2048, 92.0), (4096, 202.0)]),
                ("inter-k, 1 rank: compute alone", Kind::AnchorPoint, vec![(4096, 77.5)]),
            ]
        );
        let svg = render(&p).unwrap();
        for text in [
            "Stencil2D, single precision, halo 1",
            "time per iteration (us, log scale)",
            "grid size N",
            "staged, 2 ranks",
            "inter-k, 4 ranks",
            "compute alone (77.5 at 4096)",
            ">\n2048\n<",
        ] {
            assert!(svg.contains(text), "stencil.svg lacks {text}");
        }
    }
}
