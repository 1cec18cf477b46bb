//! The Markdown table of key points printed to stdout: 8 B latency, osu_bw and
//! osu_bibw at 1 MiB / 4 MiB / 64 MiB / 1 GiB, shm from 16 MiB on, H H 8 B. Each
//! line shows protocol auto against its anchor, and the best fixed protocol (get,
//! put, coop) at that point.

use super::SummaryRow;

const MIB: u64 = 1 << 20;

/// 1 B, 4 KiB, 16 MiB, ...; sizes that are no power of two in bytes.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (u, name) in UNITS {
        if b >= u && b & (u - 1) == 0 {
            return format!("{} {name}", b / u);
        }
    }
    format!("{b} B")
}

/// Three significant digits or so: 10.3, 318.2, 0.411, 1.056.
pub(super) fn num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

struct Key {
    what: &'static str,
    bench: &'static str,
    placement: &'static str,
    protocol: &'static str,
    anchor: &'static str,
    bytes: Vec<u64>,
    lower_is_better: bool,
}

fn keys(rows: &[SummaryRow]) -> Vec<Key> {
    let big = [MIB, 4 * MIB, 64 * MIB, 1024 * MIB];
    let mut shm: Vec<u64> = rows
        .iter()
        .filter(|r| r.bench == "osu_bw" && r.placement == "D D" && r.protocol == "shm" && r.bytes >= 16 * MIB)
        .map(|r| r.bytes)
        .collect();
    shm.sort_unstable();
    shm.dedup();
    let key = |what, bench, placement, protocol, anchor, bytes: Vec<u64>, lower_is_better| Key {
        what,
        bench,
        placement,
        protocol,
        anchor,
        bytes,
        lower_is_better,
    };
    vec![
        key("latency D D (us)", "osu_latency", "D D", "auto", "ce_latency", vec![8], true),
        key("latency D D (us)", "osu_latency", "D D", "auto", "copy_pingpong", vec![8], true),
        key("latency D D (us)", "osu_latency", "D D", "auto", "nccl", vec![8], true),
        key("osu_bw D D (GB/s)", "osu_bw", "D D", "auto", "ce_peer", big.to_vec(), false),
        key("osu_bibw D D (GB/s)", "osu_bibw", "D D", "auto", "ce_peer_bi", big.to_vec(), false),
        key("osu_bw D D shm (GB/s)", "osu_bw", "D D", "shm", "staging", shm, false),
        key("latency H H (us)", "osu_latency", "H H", "auto", "mpi_sm", vec![8], true),
    ]
}

fn anchor_label(r: &SummaryRow) -> String {
    let a = r.anchor.as_ref().expect("rows with an anchor only");
    let name = match a.name.as_str() {
        "ce_latency" => "ce_latency peer".to_string(),
        "staging" => "staging d2h".to_string(),
        n => n.to_string(),
    };
    if a.bytes != r.bytes {
        format!("{name} @{}", human_bytes(a.bytes))
    } else {
        name
    }
}

/// The Markdown table (with a trailing newline); key points the rows lack are left out.
pub fn markdown(rows: &[SummaryRow]) -> String {
    let mut s = String::from(
        "| point | size | gpulmt | anchor | anchor value | ratio | best of get/put/coop | best ratio |\n\
         |---|---:|---:|---|---:|---:|---:|---:|\n",
    );
    for k in keys(rows) {
        for &bytes in &k.bytes {
            let at = |r: &&SummaryRow| {
                r.bench == k.bench
                    && r.placement == k.placement
                    && r.bytes == bytes
                    && r.anchor.as_ref().is_some_and(|a| a.name == k.anchor)
            };
            let Some(main) = rows.iter().find(|r| at(r) && r.protocol == k.protocol) else { continue };
            let anchor = main.anchor.as_ref().unwrap();
            let best = if k.protocol == "auto" {
                rows.iter().filter(|r| at(r) && matches!(r.protocol.as_str(), "get" | "put" | "coop")).reduce(|a, b| {
                    let b_wins = if k.lower_is_better { b.value < a.value } else { b.value > a.value };
                    if b_wins {
                        b
                    } else {
                        a
                    }
                })
            } else {
                None
            };
            let (best_cell, best_ratio) = match best {
                Some(b) => (format!("{} {}", b.protocol, num(b.value)), b.ratio().map(|v| format!("{v:.3}"))),
                None => ("—".to_string(), None),
            };
            s.push_str(&format!(
                "| {} | {} | {} {} | {} | {} | {} | {} | {} |\n",
                k.what,
                human_bytes(bytes),
                main.protocol,
                num(main.value),
                anchor_label(main),
                num(anchor.value),
                main.ratio().map(|v| format!("{v:.3}")).unwrap_or_else(|| "—".into()),
                best_cell,
                best_ratio.unwrap_or_else(|| "—".into()),
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_binary_units() {
        assert_eq!(human_bytes(8), "8 B");
        assert_eq!(human_bytes(4096), "4 KiB");
        assert_eq!(human_bytes(1 << 30), "1 GiB");
        assert_eq!(human_bytes(3 << 20), "3 MiB");
        assert_eq!(human_bytes(1000), "1000 B");
    }
}
