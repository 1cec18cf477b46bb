//! `bench-report`: turns one results directory (what `bench/gpu/run.sh` leaves:
//! gpulmt.csv, anchors.csv, staged_mpi.csv, mpi_sm.csv, optional split.csv) into
//! summary.csv (each gpulmt point beside its anchor), protocols.csv (osu_bw per
//! protocol), three SVG plots and a short Markdown table of the key points; and,
//! where the directory has a stencil.csv (what its `stencil` mode leaves),
//! stencil_table.csv, stencil_overlap.csv, stencil.svg and a Markdown section on them
//! (see [`stencil`]), and with `gio` rows stencil_gio.csv ([`stencil_gio`]). A directory may hold stencil.csv alone: then only the stencil
//! outputs are written.
//!
//! Files are read and written with the csv crate. Reading is lenient on purpose: the
//! anchor files can hold lines that are not CSV rows (notes a tool printed), so any line
//! that does not parse as a row of the expected shape is skipped and counted.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

pub mod plot;
pub mod stencil;
pub mod stencil_gio;
pub mod summary;
pub mod table;

pub use summary::{protocol_table, summarize, AnchorMatch, ProtoRow, SummaryRow};

/// One gpulmt benchmark point: a row of gpulmt.csv or split.csv.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub bench: String,
    pub placement: String,
    pub protocol: String,
    pub bytes: u64,
    /// `us` or `MBps` (10^6 bytes per second).
    pub metric: String,
    pub value: f64,
}

/// One reference measurement: a row of anchors.csv, staged_mpi.csv or mpi_sm.csv.
#[derive(Clone, Debug, PartialEq)]
pub struct Anchor {
    pub anchor: String,
    pub metric: String,
    pub bytes: u64,
    pub value: f64,
}

/// Rows of one file, and how many non-empty lines (the header not counted) did not
/// parse as rows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed<T> {
    pub rows: Vec<T>,
    pub skipped: usize,
}

/// One Stencil2D measurement: a row of stencil.csv.
#[derive(Clone, Debug, PartialEq)]
pub struct StencilRow {
    pub bench: String,
    /// `staged`, `inter-k` or `inter-k-overlap`.
    pub mode: String,
    /// `single` or `double`.
    pub precision: String,
    pub ranks: u32,
    /// Grid points per rank side (weak scaling) or the global side (strong).
    pub size: u64,
    /// Ghost layers: steps between exchanges.
    pub halo: u32,
    /// `time_per_iter_us`, `comm_share_pct`, ...
    pub metric: String,
    pub value: f64,
}

pub const POINTS_HEADER: &str = "bench,placement,protocol,bytes,metric,value";
pub const ANCHORS_HEADER: &str = "anchor,metric,bytes,value";
pub const STENCIL_HEADER: &str = "bench,mode,precision,ranks,size,halo,metric,value";

fn number(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Reads CSV text with the csv crate, row by row: fields trimmed, any number of them per
/// line (so that notes a tool printed come through as rows `row` refuses), blank lines and
/// repeats of `header` passed over.
fn parse_lines<T>(text: &str, header: &str, row: impl Fn(&[&str]) -> Option<T>) -> Parsed<T> {
    let mut out = Parsed { rows: Vec::new(), skipped: 0 };
    let header: Vec<&str> = header.split(',').collect();
    let mut reader =
        csv::ReaderBuilder::new().has_headers(false).flexible(true).trim(csv::Trim::All).from_reader(text.as_bytes());
    for record in reader.records() {
        let Ok(record) = record else {
            out.skipped += 1;
            continue;
        };
        let fields: Vec<&str> = record.iter().collect();
        if fields.iter().all(|f| f.is_empty()) || fields == header {
            continue;
        }
        match row(&fields) {
            Some(r) => out.rows.push(r),
            None => out.skipped += 1,
        }
    }
    out
}

/// CSV text with the csv crate: the `header` constant's names, then one line per record.
pub(crate) fn csv_text<R: IntoIterator<Item = String>>(header: &str, records: impl IntoIterator<Item = R>) -> String {
    let mut w = csv::Writer::from_writer(Vec::new());
    // Writing into a Vec cannot fail, and every field is a String (UTF-8).
    w.write_record(header.split(',')).expect("CSV into memory");
    for r in records {
        w.write_record(r).expect("CSV into memory");
    }
    String::from_utf8(w.into_inner().expect("CSV into memory")).expect("CSV of UTF-8 fields")
}

/// Parses gpulmt.csv / split.csv text: `bench,placement,protocol,bytes,metric,value`.
pub fn parse_points(text: &str) -> Parsed<Point> {
    parse_lines(text, POINTS_HEADER, |f| {
        if f.len() != 6 || f[0].is_empty() {
            return None;
        }
        Some(Point {
            bench: f[0].to_string(),
            placement: f[1].to_string(),
            protocol: f[2].to_string(),
            bytes: f[3].parse().ok()?,
            metric: f[4].to_string(),
            value: number(f[5])?,
        })
    })
}

/// Parses anchors.csv / staged_mpi.csv / mpi_sm.csv text: `anchor,metric,bytes,value`.
pub fn parse_anchors(text: &str) -> Parsed<Anchor> {
    parse_lines(text, ANCHORS_HEADER, |f| {
        if f.len() != 4 || f[0].is_empty() || f[1].is_empty() {
            return None;
        }
        Some(Anchor {
            anchor: f[0].to_string(),
            metric: f[1].to_string(),
            bytes: f[2].parse().ok()?,
            value: number(f[3])?,
        })
    })
}

/// Parses stencil.csv text: `bench,mode,precision,ranks,size,halo,metric,value`.
pub fn parse_stencil(text: &str) -> Parsed<StencilRow> {
    parse_lines(text, STENCIL_HEADER, |f| {
        if f.len() != 8 || f[..3].iter().chain(&f[6..7]).any(|s| s.is_empty()) {
            return None;
        }
        Some(StencilRow {
            bench: f[0].to_string(),
            mode: f[1].to_string(),
            precision: f[2].to_string(),
            ranks: f[3].parse().ok()?,
            size: f[4].parse().ok()?,
            halo: f[5].parse().ok()?,
            metric: f[6].to_string(),
            value: number(f[7])?,
        })
    })
}

/// All reference measurements of one directory, looked up by (anchor, metric, bytes).
#[derive(Clone, Debug, Default)]
pub struct Anchors {
    rows: Vec<Anchor>,
}

impl Anchors {
    pub fn new(rows: Vec<Anchor>) -> Self {
        Anchors { rows }
    }

    pub fn extend(&mut self, rows: Vec<Anchor>) {
        self.rows.extend(rows);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The value measured at exactly `bytes` (the first such row).
    pub fn exact(&self, anchor: &str, metric: &str, bytes: u64) -> Option<f64> {
        self.rows.iter().find(|a| a.anchor == anchor && a.metric == metric && a.bytes == bytes).map(|a| a.value)
    }

    /// The value at the largest size at or below `bytes`, with that size.
    pub fn at_or_below(&self, anchor: &str, metric: &str, bytes: u64) -> Option<(u64, f64)> {
        self.rows
            .iter()
            .filter(|a| a.anchor == anchor && a.metric == metric && a.bytes <= bytes)
            .fold(None, |best: Option<&Anchor>, a| match best {
                Some(b) if b.bytes >= a.bytes => Some(b),
                _ => Some(a),
            })
            .map(|a| (a.bytes, a.value))
    }

    /// (bytes, value) sorted by size, one value per size.
    pub fn series(&self, anchor: &str, metric: &str) -> Vec<(u64, f64)> {
        let mut v: Vec<(u64, f64)> = Vec::new();
        for a in self.rows.iter().filter(|a| a.anchor == anchor && a.metric == metric) {
            if !v.iter().any(|(b, _)| *b == a.bytes) {
                v.push((a.bytes, a.value));
            }
        }
        v.sort_by_key(|p| p.0);
        v
    }
}

/// Everything read from one results directory.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    /// gpulmt.csv; empty only where the directory has stencil.csv and no gpulmt.csv.
    pub points: Vec<Point>,
    /// split.csv, when the directory has one.
    pub split: Option<Vec<Point>>,
    pub anchors: Anchors,
    /// stencil.csv, when the directory has one.
    pub stencil: Option<Vec<StencilRow>>,
    /// A name for titles: the last two components of the directory.
    pub source: String,
}

#[derive(Debug)]
pub struct ReportError(pub String);

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReportError {}

impl From<String> for ReportError {
    fn from(s: String) -> Self {
        ReportError(s)
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, ReportError> {
    match fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ReportError(format!("{}: {e}", path.display()))),
    }
}

fn note_skipped(path: &Path, skipped: usize) {
    if skipped > 0 {
        eprintln!("bench-report: {}: skipped {skipped} line(s) that are not rows", path.display());
    }
}

fn source_name(dir: &Path) -> String {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let parts: Vec<String> =
        dir.components().rev().take(2).map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

/// Reads a results directory. gpulmt.csv must be there unless stencil.csv is (which
/// then must have rows); a missing anchor file only leaves its anchors out (with a
/// note on stderr).
pub fn load(dir: &Path) -> Result<Inputs, ReportError> {
    let stencil_path = dir.join("stencil.csv");
    let stencil = match read_optional(&stencil_path)? {
        Some(t) => {
            let p = parse_stencil(&t);
            note_skipped(&stencil_path, p.skipped);
            if p.rows.is_empty() {
                return Err(ReportError(format!("{}: no stencil rows", stencil_path.display())));
            }
            Some(p.rows)
        }
        None => None,
    };
    let gp = dir.join("gpulmt.csv");
    let Some(text) = read_optional(&gp)? else {
        if let Some(stencil) = stencil {
            eprintln!("bench-report: {} not found: stencil outputs only", gp.display());
            return Ok(Inputs { stencil: Some(stencil), source: source_name(dir), ..Default::default() });
        }
        return Err(ReportError(format!("{}: not found (and no stencil.csv)", gp.display())));
    };
    let points = parse_points(&text);
    note_skipped(&gp, points.skipped);
    if points.rows.is_empty() {
        return Err(ReportError(format!("{}: no benchmark rows", gp.display())));
    }
    let mut anchors = Anchors::default();
    for name in ["anchors.csv", "staged_mpi.csv", "mpi_sm.csv", "copy_pingpong.csv"] {
        let path = dir.join(name);
        match read_optional(&path)? {
            Some(t) => {
                let p = parse_anchors(&t);
                note_skipped(&path, p.skipped);
                anchors.extend(p.rows);
            }
            None => eprintln!("bench-report: {} not found: its anchors are left out", path.display()),
        }
    }
    let split_path = dir.join("split.csv");
    let split = read_optional(&split_path)?.map(|t| {
        let p = parse_points(&t);
        note_skipped(&split_path, p.skipped);
        p.rows
    });
    Ok(Inputs { points: points.rows, split, anchors, stencil, source: source_name(dir) })
}

/// What one run wrote.
#[derive(Clone, Debug)]
pub struct Outputs {
    pub files: Vec<PathBuf>,
    /// The Markdown table of key points; empty without gpulmt.csv.
    pub table: String,
    /// The Markdown section on stencil.csv, when the directory has one.
    pub stencil: Option<String>,
}

/// Reads `dir`, writes summary.csv, protocols.csv, latency.svg, bandwidth.svg and
/// bibw.svg (when it has gpulmt.csv) and stencil_table.csv, stencil_overlap.csv and
/// stencil.svg (when it has stencil.csv) into `out` (created when missing) and
/// returns the Markdown.
pub fn run(dir: &Path, out: &Path) -> Result<Outputs, ReportError> {
    let inputs = load(dir)?;
    fs::create_dir_all(out).map_err(|e| ReportError(format!("{}: {e}", out.display())))?;
    let write = |name: &str, text: String| -> Result<PathBuf, ReportError> {
        let path = out.join(name);
        fs::write(&path, text).map_err(|e| ReportError(format!("{}: {e}", path.display())))?;
        Ok(path)
    };
    let mut files = Vec::new();
    let mut table = String::new();
    if !inputs.points.is_empty() {
        let rows = summarize(&inputs.points, &inputs.anchors);
        let protos = protocol_table(&inputs.points, inputs.split.as_deref());
        files.push(write("summary.csv", summary::summary_csv(&rows))?);
        files.push(write("protocols.csv", summary::protocols_csv(&protos))?);
        for (name, svg) in plot::all(&inputs)? {
            files.push(write(name, svg)?);
        }
        table = table::markdown(&rows);
    }
    let stencil = match &inputs.stencil {
        Some(rows) => {
            let gains = stencil::gain_table(rows);
            let overlap = stencil::overlap_table(rows);
            files.push(write("stencil_table.csv", stencil::table_csv(&gains))?);
            files.push(write("stencil_overlap.csv", stencil::overlap_csv(&overlap))?);
            files.push(write("stencil.svg", plot::render(&plot::stencil_plot(rows, &inputs.source))?)?);
            let gio = stencil_gio::gio_table(rows);
            if !gio.is_empty() {
                files.push(write("stencil_gio.csv", stencil_gio::gio_csv(&gio))?);
            }
            Some(stencil::markdown(&gains, &overlap) + &stencil_gio::markdown(&gio))
        }
        None => None,
    };
    Ok(Outputs { files, table, stencil })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_parse_and_bad_lines_are_skipped() {
        let p = parse_points(
            "bench,placement,protocol,bytes,metric,value\n\
             osu_bw,D D,auto,4194304,MBps,292355.5086\n\
             \n\
             # a comment\n\
             osu_bw,D D,auto,notanumber,MBps,1\n\
             osu_latency,H H,auto,8,us,1.0559\r\n\
             osu_latency,H H,auto,16,us,nan\n\
             osu_latency,H H,auto,16,us\n",
        );
        assert_eq!(p.skipped, 4);
        assert_eq!(p.rows.len(), 2);
        assert_eq!(
            p.rows[0],
            Point {
                bench: "osu_bw".into(),
                placement: "D D".into(),
                protocol: "auto".into(),
                bytes: 4194304,
                metric: "MBps".into(),
                value: 292355.5086
            }
        );
        assert_eq!(p.rows[1].placement, "H H");
        assert_eq!(p.rows[1].value, 1.0559);
    }

    #[test]
    fn quoted_fields_read_as_csv_and_written_fields_round_trip() {
        let p = parse_points("osu_bw,\"D D\",auto,8,MBps,1.5\n\"osu_bw\",D D,auto,\"16\",MBps,2\n");
        assert_eq!(p.skipped, 0);
        assert_eq!(
            p.rows.iter().map(|r| (r.placement.as_str(), r.bytes)).collect::<Vec<_>>(),
            [("D D", 8), ("D D", 16)]
        );
        let text = csv_text(POINTS_HEADER, [["osu_bw", "D D", "a,b", "8", "us", "1"].map(String::from)]);
        assert_eq!(text, "bench,placement,protocol,bytes,metric,value\nosu_bw,D D,\"a,b\",8,us,1\n");
        assert_eq!(parse_points(&text).rows[0].protocol, "a,b");
    }

    #[test]
    fn anchors_parse_skipping_non_csv_lines() {
        let p = parse_anchors(
            "anchor,metric,bytes,value\n\
             staged_mpi,half_rtt_us,8,16.056\n\
             # OSU MPI-CUDA Latency Test v7.4\n\
             Warning: something the MPI library printed\n\
             staged_mpi,GBps,8,0.001\n\
             ,GBps,8,1\n",
        );
        assert_eq!(p.skipped, 3);
        assert_eq!(p.rows.len(), 2);
        assert_eq!(p.rows[1], Anchor { anchor: "staged_mpi".into(), metric: "GBps".into(), bytes: 8, value: 0.001 });
        let a = Anchors::new(p.rows);
        assert_eq!(a.exact("staged_mpi", "half_rtt_us", 8), Some(16.056));
        assert_eq!(a.exact("staged_mpi", "half_rtt_us", 16), None);
        assert_eq!(a.exact("staged_mpi", "GBps", 8), Some(0.001));
        assert_eq!(a.series("staged_mpi", "GBps"), vec![(8, 0.001)]);
    }

    #[test]
    fn stencil_rows_parse_and_bad_lines_are_skipped() {
        let p = parse_stencil(
            "bench,mode,precision,ranks,size,halo,metric,value\n\
             stencil2d,inter-k-overlap,single,2,4096,1,time_per_iter_us,84.61222\n\
             stencil2d,staged,single,two,4096,1,time_per_iter_us,1\n\
             stencil2d,staged,single,2,4096,1,,1\n\
             stencil2d,staged,single,2,4096,1,time_per_iter_us\n",
        );
        assert_eq!(p.skipped, 3);
        assert_eq!(
            p.rows,
            [StencilRow {
                bench: "stencil2d".into(),
                mode: "inter-k-overlap".into(),
                precision: "single".into(),
                ranks: 2,
                size: 4096,
                halo: 1,
                metric: "time_per_iter_us".into(),
                value: 84.61222
            }]
        );
    }
}
