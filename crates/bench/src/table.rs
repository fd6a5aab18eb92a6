//! Printing figures as Markdown tables, and the helpers every suite shares.

pub fn scaled(n: u64, scale: f64) -> u64 {
    ((n as f64 * scale) as u64).max(10)
}

pub struct Table {
    rows: Vec<(String, String, String)>,
}

impl Table {
    pub fn new() -> Table {
        Table { rows: Vec::new() }
    }
    pub fn add(
        &mut self,
        what: impl Into<String>,
        figure: impl Into<String>,
        note: impl Into<String>,
    ) {
        self.rows.push((what.into(), figure.into(), note.into()));
    }
    pub fn print(&self, title: &str) {
        println!("\n## {title}\n");
        println!("| measurement | figure | note |");
        println!("|---|---:|---|");
        for (a, b, c) in &self.rows {
            println!("| {a} | {b} | {c} |");
        }
    }
}

pub fn rate(n: u64, secs: f64) -> String {
    let r = n as f64 / secs;
    if r >= 1e6 {
        format!("{:.2} M/s", r / 1e6)
    } else if r >= 1e3 {
        format!("{:.1} k/s", r / 1e3)
    } else {
        format!("{r:.0} /s")
    }
}

/// Runs this binary again with `args` (and `env`) and reads the figures the child prints as
/// its last line of JSON: each measurement in a process of its own, so that its peak RSS is
/// its own.
pub(crate) fn in_a_child<T: serde::de::DeserializeOwned>(
    args: &[impl AsRef<std::ffi::OsStr>],
    env: &[(&str, &str)],
) -> anyhow::Result<T> {
    use anyhow::Context;
    let args: Vec<&std::ffi::OsStr> = args.iter().map(AsRef::as_ref).collect();
    let name = args.first().map_or("".into(), |a| a.to_string_lossy());
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(&args)
        .envs(env.iter().copied())
        .output()
        .with_context(|| format!("run perc-bench {name}"))?;
    if !out.status.success() {
        anyhow::bail!("perc-bench {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().with_context(|| format!("{name} printed nothing"))?;
    serde_json::from_str(line).with_context(|| format!("{name}'s figures"))
}
