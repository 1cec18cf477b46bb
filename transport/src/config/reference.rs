//! The configuration reference, `docs/configuration.md`, rendered from the table of
//! settings: one Markdown section per class, and the variables the launcher sets.

use super::variables::{Class, DefaultValue, LAUNCHER_VARIABLES, VARIABLES};

/// The command that writes `docs/configuration.md` from the table.
pub const REGENERATE: &str = "cargo run -p gpulmt --bin gpulmt-run -- --config-table > docs/configuration.md";

const INTRO: &str = "\
Every setting of gpulmt is an environment variable, read when a rank starts
(`Context::init`, `gpulmt_init`, or the PMPI shim's `MPI_Init`); give every rank of a job
the same settings. `gpulmt-info` prints the settings in force and the protocol that `auto`
chooses with them for each message size and placement.

Values:
- sizes are bytes, with binary units: `4096`, `64K`, `2M`, `1GiB`;
- durations take a unit (`ns`, `us`, `ms`, `s`, `m`, `h`): `100us`, `20ms`, `30s`; a plain
  number is in the unit that ends the variable's name (`GPULMT_INIT_TIMEOUT_MS=30000` is 30 s);
- booleans are `1` or `0` (also `on`/`off`, `true`/`false`, `yes`/`no`);
- an empty value counts as unset.

A value of the wrong form or outside its range fails the rank at start, with an error that
names the variable, the value and what is accepted.
";

fn section_intro(class: Class) -> &'static str {
    match class {
        Class::Normal => "## Settings\n",
        Class::Diagnostic => {
            "## Diagnostic settings\n\nFor measurements and comparisons: each turns an optimisation off or changes how \
             copies are issued. The defaults are the ones to run with.\n"
        }
        Class::SimOnly => {
            "## Sim backend\n\nRead only by the sim backend (`GPULMT_DEVICE=sim`, or `auto` on a machine without a \
             GPU), which keeps device memory in POSIX shared memory.\n"
        }
    }
}

/// `docs/configuration.md`: the whole reference, in Markdown.
pub fn reference_markdown() -> String {
    let mut s = format!(
        "# Configuration\n\n<!-- Generated from transport/src/config/variables.rs by `{REGENERATE}`; \
         edit the table there, not this file (a test fails when they differ). -->\n\n{INTRO}"
    );
    for class in Class::ALL {
        s.push('\n');
        s.push_str(section_intro(class));
        s.push_str("\n| Variable | Type | Accepted values | Default | Meaning |\n| --- | --- | --- | --- | --- |\n");
        for v in VARIABLES.iter().filter(|v| v.class == class) {
            let default = match v.default {
                DefaultValue::Text(t) => format!("`{t}`"),
                DefaultValue::Unset(means) => format!("unset: {means}"),
            };
            s.push_str(&format!(
                "| `{}` | {} | {} | {default} | {} |\n",
                v.name,
                v.kind.type_name(),
                v.kind.accepted(),
                v.meaning
            ));
        }
    }
    s.push_str(
        "\n## Set by the launcher\n\n`gpulmt-run` sets these for each rank; they say who the rank is, and are \
         not settings.\n\n| Variable | Meaning |\n| --- | --- |\n",
    );
    for (name, meaning) in LAUNCHER_VARIABLES {
        s.push_str(&format!("| `{name}` | {meaning} |\n"));
    }
    s
}
