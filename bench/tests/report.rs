//! bench-report on two early 2x H200 runs kept as test data in tests/data (copied to a temp
//! dir first): run1 (the first full run) and run4 (its Stencil2D table).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpulmt-bench-report-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

fn copy_dir(from: &Path, to: &Path) {
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn report_on_h200x2_run1() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/h200x2_run1");
    let dir = temp_dir("in");
    copy_dir(&src, &dir);
    let out = temp_dir("out");
    let o = Command::new(env!("CARGO_BIN_EXE_bench-report")).arg(&dir).arg("--out").arg(&out).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&o.stderr));

    let summary = fs::read_to_string(out.join("summary.csv")).unwrap();
    let mut lines = summary.lines();
    assert_eq!(lines.next(), Some("bench,placement,protocol,bytes,metric,value,anchor,anchor_value,ratio"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(rows.iter().all(|r| r.len() == 9));
    let ce4m: Vec<&Vec<&str>> =
        rows.iter().filter(|r| r[0] == "osu_bw" && r[1] == "D D" && r[3] == "4194304" && r[6] == "ce_peer").collect();
    assert!(!ce4m.is_empty(), "no ce_peer row at 4194304");
    for r in &ce4m {
        assert_eq!(r[4], "GBps");
        let (v, a, ratio): (f64, f64, f64) = (r[5].parse().unwrap(), r[7].parse().unwrap(), r[8].parse().unwrap());
        assert!((a - 320.601).abs() < 1e-9, "ce_peer at 4 MiB in anchors.csv is 320.601");
        assert!(v > 1.0 && v < 1000.0, "GB/s, not MB/s: {v}");
        assert!((ratio - v / a).abs() < 0.001);
    }
    // Every gpulmt point has at least one row; rows without an anchor have empty fields.
    let points = fs::read_to_string(dir.join("gpulmt.csv")).unwrap().lines().count() - 1;
    assert!(rows.len() >= points);
    assert!(rows.iter().any(|r| r[6].is_empty() && r[7].is_empty() && r[8].is_empty()));
    assert!(rows.iter().any(|r| r[1] == "H H" && r[3] == "8" && r[6] == "mpi_sm"));
    assert!(rows.iter().any(|r| r[2] == "shm" && r[6] == "staging"));

    let protos = fs::read_to_string(out.join("protocols.csv")).unwrap();
    assert!(protos.starts_with("bytes,get,put,coop,auto,split,best,auto_vs_best\n"));
    for svg in ["latency.svg", "bandwidth.svg", "bibw.svg"] {
        let t = fs::read_to_string(out.join(svg)).unwrap();
        assert!(t.starts_with("<svg") && t.contains("gpulmt auto"), "{svg}");
    }
    assert!(stdout.contains("| point |") && stdout.contains("ce_peer"), "{stdout}");
    // Inputs left as they were: nothing written into DIR when --out is given.
    assert!(!dir.join("summary.csv").exists());
    let _ = fs::remove_dir_all(&dir);
    let _ = fs::remove_dir_all(&out);
}

#[test]
fn report_on_h200x2_run4_stencil() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/h200x2_run4");
    let dir = temp_dir("stencil-in");
    copy_dir(&src, &dir);
    // Only the inputs: outputs an earlier report left in run4 are not read.
    for name in ["stencil_table.csv", "stencil_overlap.csv", "stencil.svg"] {
        let _ = fs::remove_file(dir.join(name));
    }
    let o = Command::new(env!("CARGO_BIN_EXE_bench-report")).arg(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&o.stderr));

    let table = fs::read_to_string(dir.join("stencil_table.csv")).unwrap();
    let mut lines = table.lines();
    assert_eq!(
        lines.next(),
        Some("precision,ranks,size,halo,staged_us,inter_k_us,overlap_us,inter_k_gain_pct,overlap_gain_pct")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    // 2 precisions x 2 job sizes (2, 4 ranks) x 3 sizes x 2 halos, each with a staged row.
    assert_eq!(rows.len(), 24);
    assert!(rows.iter().all(|r| r.len() == 9 && r.iter().all(|c| !c.is_empty())));
    let r = rows.iter().find(|r| r[..4] == ["single", "2", "2048", "1"]).unwrap();
    let (staged, ik, gain): (f64, f64, f64) = (r[4].parse().unwrap(), r[5].parse().unwrap(), r[7].parse().unwrap());
    assert!((gain - (staged - ik) / staged * 100.0).abs() < 0.01);

    let overlap = fs::read_to_string(dir.join("stencil_overlap.csv")).unwrap();
    let mut lines = overlap.lines();
    assert_eq!(
        lines.next(),
        Some("precision,size,halo,compute_us,inter_k_us,overlap_us,hidden_pct,overlap_vs_compute")
    );
    // The 1-rank (compute alone) rows: 4096, both precisions, halo 1 and 4.
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|r| r.len() == 8 && r[1] == "4096"));

    let svg = fs::read_to_string(dir.join("stencil.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("single precision, halo 1"));
    assert!(stdout.contains("### Stencil2D") && stdout.contains("4.7 %") && stdout.contains("2.3 %"), "{stdout}");
    // No gpulmt.csv in run4: no point-to-point outputs.
    assert!(!dir.join("summary.csv").exists());
    let _ = fs::remove_dir_all(&dir);
}
