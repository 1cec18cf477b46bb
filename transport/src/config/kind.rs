//! What values a setting takes and how its text is read: booleans, counts, sizes in
//! bytes (`64K`, `2M`, `1GiB`), durations (`100us`, `30s`; a plain number keeps the
//! variable's historical unit), named choices, device ordinals, and free-form syntaxes
//! that another module reads.
//!
//! A value is checked against its range here, so that every error names the variable,
//! the value and what is accepted.

use std::time::Duration;

/// A power of two, written the way the documentation writes sizes.
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

/// The unit of a duration written as a plain number (`GPULMT_INIT_TIMEOUT_MS=30000`):
/// the unit the variable had before units were accepted, so old settings keep working.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeUnit {
    Nanos,
    Micros,
    Millis,
}

impl TimeUnit {
    fn of(self, n: u64) -> Duration {
        match self {
            TimeUnit::Nanos => Duration::from_nanos(n),
            TimeUnit::Micros => Duration::from_micros(n),
            TimeUnit::Millis => Duration::from_millis(n),
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            TimeUnit::Nanos => "ns",
            TimeUnit::Micros => "us",
            TimeUnit::Millis => "ms",
        }
    }
}

/// What values a variable takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `1`/`0`, `on`/`off`, `true`/`false`, `yes`/`no`.
    Bool,
    /// A whole number in `min..=max` (a power of two when `power_of_two`).
    Count { min: u64, max: u64, power_of_two: bool },
    /// A number of bytes in `min..=max` and a multiple of `multiple_of`, or 0 when
    /// `zero_is_off`; `never` (stored as `u64::MAX`) when `never` is allowed.
    Size { min: u64, max: u64, multiple_of: u64, zero_is_off: bool, never: bool },
    /// A duration in `min..=max`; a plain number is in `plain`.
    Duration { plain: TimeUnit, min: Duration, max: Duration },
    /// One of the named choices (case-insensitive); the first is the default.
    Choice(&'static [&'static str]),
    /// A device ordinal (checked against the device count when the backend is up).
    Device,
    /// A list of CPUs as taskset and `/sys` write them: `8`, `8-11`, `0,2,4-7`.
    CpuList,
    /// Read by another module, which checks it: the text says what it accepts.
    Syntax(&'static str),
}

/// A value read by its kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Bool(bool),
    Count(u64),
    /// Bytes; `u64::MAX` for `never`.
    Size(u64),
    Duration(Duration),
    /// The choice as the table spells it.
    Choice(&'static str),
    Device(u32),
    /// CPUs in the order given, ranges expanded.
    CpuList(Vec<u32>),
    /// A syntax another module reads, as given.
    Text(String),
}

/// The most CPUs a [`Kind::CpuList`] may name (and the highest CPU number + 1).
pub const MAX_CPUS: u32 = 1 << 16;

/// Parses a CPU list (`8`, `8-11`, `0,2,4-7`), ranges expanded in order; `None` for
/// anything else, a range that runs backwards, or a CPU past [`MAX_CPUS`].
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in s.split(',') {
        let (lo, hi) = match part.trim().split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?),
            None => {
                let n = part.trim().parse::<u32>().ok()?;
                (n, n)
            }
        };
        if lo > hi || hi >= MAX_CPUS || cpus.len() + (hi - lo) as usize >= MAX_CPUS as usize {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    Some(cpus)
}

/// Parses a byte size: `4096`, `64K`, `1M`, `2G`, `1MiB`, `1mb` (binary units: K is
/// 1024 bytes).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => KIB,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => GIB,
        "t" | "tb" | "tib" => TIB,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Parses a duration: a whole number with a unit (`ns`, `us` or `µs`, `ms`, `s`, `m`,
/// `h`), or a plain whole number in `plain`.
pub fn parse_duration(s: &str, plain: TimeUnit) -> Option<Duration> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let secs = |mult: u64| n.checked_mul(mult).map(Duration::from_secs);
    match unit.trim().to_ascii_lowercase().as_str() {
        "" => Some(plain.of(n)),
        "ns" => Some(Duration::from_nanos(n)),
        "us" | "µs" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => secs(1),
        "m" | "min" => secs(60),
        "h" => secs(3600),
        _ => None,
    }
}

/// A size as the documentation writes it: `4 KiB`, `2 MiB`, `4097 B`.
// `is_multiple_of` needs Rust 1.87; the workspace supports 1.80.
#[allow(clippy::manual_is_multiple_of)]
pub fn show_size(n: u64) -> String {
    for (unit, name) in [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
        if n >= unit && n % unit == 0 {
            return format!("{} {name}", n / unit);
        }
    }
    format!("{n} B")
}

/// A duration as the documentation writes it: `20 ms`, `30 s`, `2 us`.
// `is_multiple_of` needs Rust 1.87; the workspace supports 1.80.
#[allow(clippy::manual_is_multiple_of)]
pub fn show_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    for (unit, name) in [(3_600_000_000_000u128, "h"), (1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")] {
        if ns >= unit && ns % unit == 0 {
            return format!("{} {name}", ns / unit);
        }
    }
    format!("{ns} ns")
}

fn quoted_list(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match q.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => q.concat(),
    }
}

impl Kind {
    /// The type, in one word or two: the documentation's "type" column.
    pub fn type_name(&self) -> &'static str {
        match self {
            Kind::Bool => "bool",
            Kind::Count { .. } => "count",
            Kind::Size { .. } => "size",
            Kind::Duration { .. } => "duration",
            Kind::Choice(_) => "choice",
            Kind::Device => "device",
            Kind::CpuList => "CPU list",
            Kind::Syntax(_) => "text",
        }
    }

    /// The values accepted, as the documentation and the error messages say them.
    pub fn accepted(&self) -> String {
        match *self {
            Kind::Bool => "`1` or `0` (also `on`/`off`, `true`/`false`, `yes`/`no`)".into(),
            Kind::Count { min, max, power_of_two } => {
                let pow = if power_of_two { "a power of two " } else { "" };
                format!("{pow}from {min} to {max}")
            }
            Kind::Size { min, max, multiple_of, zero_is_off, never } => {
                let mut s = if max == u64::MAX {
                    format!("at least {}", show_size(min))
                } else {
                    format!("{} to {}", show_size(min), show_size(max))
                };
                if min == 0 && max == u64::MAX {
                    s = "any size".into();
                }
                if multiple_of > 1 {
                    s.push_str(&format!(", a multiple of {}", show_size(multiple_of)));
                }
                if zero_is_off {
                    s = format!("`0` (off) or {s}");
                }
                if never {
                    s.push_str(", or `never`");
                }
                s
            }
            Kind::Duration { plain, min, max } => {
                format!("{} to {} (a plain number is in {})", show_duration(min), show_duration(max), plain.suffix())
            }
            Kind::Choice(names) => quoted_list(names),
            Kind::Device => "a device ordinal: 0 to the device count - 1".into(),
            Kind::CpuList => {
                format!("CPUs and ranges of CPUs, comma-separated (`8`, `8-11`, `0,2,4-7`), at most {MAX_CPUS}")
            }
            Kind::Syntax(text) => text.into(),
        }
    }

    /// Reads `text` (already known not to be empty), or says what is accepted.
    pub fn parse(&self, text: &str) -> Result<Value, String> {
        let t = text.trim();
        let expected = |what: &str| Err(format!("expected {what}"));
        match *self {
            Kind::Bool => match t.to_ascii_lowercase().as_str() {
                "1" | "on" | "true" | "yes" => Ok(Value::Bool(true)),
                "0" | "off" | "false" | "no" => Ok(Value::Bool(false)),
                _ => expected("1 or 0"),
            },
            Kind::Count { min, max, power_of_two } => match t.parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) && (!power_of_two || n.is_power_of_two()) => Ok(Value::Count(n)),
                _ => expected(&format!("a whole number, {}", self.accepted())),
            },
            Kind::Size { min, max, multiple_of, zero_is_off, never } => {
                if never && t.eq_ignore_ascii_case("never") {
                    return Ok(Value::Size(u64::MAX));
                }
                let sizes = "a size such as 8192, 64K, 2M or 1GiB";
                match parse_size(t) {
                    Some(0) if zero_is_off => Ok(Value::Size(0)),
                    Some(n) if (min..=max).contains(&n) && n % multiple_of.max(1) == 0 => Ok(Value::Size(n)),
                    Some(_) => expected(&self.accepted()),
                    None => expected(&format!("{sizes}: {}", self.accepted())),
                }
            }
            Kind::Duration { plain, min, max } => match parse_duration(t, plain) {
                Some(d) if (min..=max).contains(&d) => Ok(Value::Duration(d)),
                Some(_) => expected(&self.accepted()),
                None => expected(&format!("a duration such as 100us, 20ms or 30s: {}", self.accepted())),
            },
            Kind::Choice(names) => {
                let lower = t.to_ascii_lowercase();
                match names.iter().find(|n| **n == lower) {
                    Some(n) => Ok(Value::Choice(n)),
                    None => expected(&format!("one of {}", names.join(", "))),
                }
            }
            Kind::Device => t.parse().map(Value::Device).or_else(|_| expected("a device ordinal")),
            Kind::CpuList => {
                parse_cpu_list(t).map(Value::CpuList).ok_or_else(|| format!("expected {}", self.accepted()))
            }
            Kind::Syntax(_) => Ok(Value::Text(t.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_expand_ranges_in_order() {
        assert_eq!(parse_cpu_list("8"), Some(vec![8]));
        assert_eq!(parse_cpu_list("8-11"), Some(vec![8, 9, 10, 11]));
        assert_eq!(parse_cpu_list(" 0, 2 ,4-5"), Some(vec![0, 2, 4, 5]));
        assert_eq!(parse_cpu_list("3-1"), None, "backwards");
        assert_eq!(parse_cpu_list("1,,2"), None);
        assert_eq!(parse_cpu_list("a"), None);
        assert_eq!(parse_cpu_list("0-70000"), None, "past MAX_CPUS");
        let e = Kind::CpuList.parse("8-x").unwrap_err();
        assert!(e.contains("8-11"), "{e}");
    }

    #[test]
    fn sizes_and_durations_read_their_units() {
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("1MiB"), Some(1 << 20));
        assert_eq!(parse_size("2g"), Some(2 << 30));
        assert_eq!(parse_size(" 4096 "), Some(4096));
        assert_eq!(parse_size("12x"), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("99999999999T"), None, "overflow");
        assert_eq!(parse_duration("100us", TimeUnit::Millis), Some(Duration::from_micros(100)));
        assert_eq!(parse_duration("30s", TimeUnit::Nanos), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("20ms", TimeUnit::Micros), Some(Duration::from_millis(20)));
        assert_eq!(parse_duration("2000", TimeUnit::Nanos), Some(Duration::from_nanos(2000)));
        assert_eq!(parse_duration("2000", TimeUnit::Millis), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s", TimeUnit::Millis), None);
        assert_eq!(parse_duration("5 fortnights", TimeUnit::Millis), None);
    }

    #[test]
    fn values_outside_their_range_are_refused_with_the_range() {
        let chunk = Kind::Size { min: 4096, max: 1 << 30, multiple_of: 4096, zero_is_off: false, never: false };
        assert_eq!(chunk.parse("64K"), Ok(Value::Size(65536)));
        for bad in ["1", "6", "0", "4097", "2G"] {
            let e = chunk.parse(bad).unwrap_err();
            assert!(e.contains("4 KiB to 1 GiB, a multiple of 4 KiB"), "{bad}: {e}");
        }
        let split = Kind::Size { min: 4096, max: u64::MAX, multiple_of: 1, zero_is_off: true, never: false };
        assert_eq!(split.parse("0"), Ok(Value::Size(0)));
        assert!(split.parse("100").unwrap_err().contains("`0` (off) or at least 4 KiB"));
        let min = Kind::Size { min: 0, max: u64::MAX, multiple_of: 1, zero_is_off: false, never: true };
        assert_eq!(min.parse("Never"), Ok(Value::Size(u64::MAX)));
        let slots = Kind::Count { min: 2, max: 1 << 16, power_of_two: true };
        assert_eq!(slots.parse("64"), Ok(Value::Count(64)));
        assert_eq!(slots.parse("3").unwrap_err(), "expected a whole number, a power of two from 2 to 65536");
        let wait = Kind::Duration { plain: TimeUnit::Nanos, min: Duration::ZERO, max: Duration::from_secs(1) };
        assert_eq!(wait.parse("2us"), Ok(Value::Duration(Duration::from_micros(2))));
        assert_eq!(wait.parse("2s").unwrap_err(), "expected 0 ns to 1 s (a plain number is in ns)");
        assert_eq!(Kind::Bool.parse("ON"), Ok(Value::Bool(true)));
        assert_eq!(Kind::Bool.parse("2").unwrap_err(), "expected 1 or 0");
        assert_eq!(Kind::Choice(&["auto", "cuda"]).parse(" CUDA "), Ok(Value::Choice("cuda")));
    }

    #[test]
    fn sizes_and_durations_are_shown_in_their_largest_whole_unit() {
        assert_eq!(show_size(64 << 30), "64 GiB");
        assert_eq!(show_size(8448), "8448 B");
        assert_eq!(show_size(4096), "4 KiB");
        assert_eq!(show_duration(Duration::from_millis(30_000)), "30 s");
        assert_eq!(show_duration(Duration::from_nanos(2000)), "2 us");
        assert_eq!(show_duration(Duration::ZERO), "0 ns");
    }
}
