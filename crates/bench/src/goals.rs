//! The storage targets side by side: disk, memory and speed as the store grows, taken from one
//! run of `datapath` and one of `scaling`, each figure beside the target it is held to.
//!
//! `perc-bench goals` runs both suites and prints their tables, then this one; `perc-bench
//! all` prints it after every suite. The million-page run is `scaling --pages 1000000`, on its
//! own (more than two hours and ~30 GB of temporary disk), its export checked on a sample.

use anyhow::Result;

use crate::table::Table;
use crate::{datapath, scaling};

/// Runs `datapath` and `scaling` at `scale` and prints their tables, then the targets'.
pub fn run(scale: f64) -> Result<()> {
    let webs = datapath::run(scale, &[])?;
    let sizes = scaling::run(scale, None, true, None)?;
    print(&webs, &sizes)
}

/// The targets' table from the two suites' figures.
pub fn print(webs: &[datapath::Figures], sizes: &[scaling::Figures]) -> Result<()> {
    // Each web's run with the default configuration (the suite also runs another level).
    let level = perc_pipeline::config::load(None, &[], &[])?.store.zstd_level;
    let web = |name: &str| {
        webs.iter().find(|f| f.zstd_level == level && f.warc.ends_with(&format!("{name}.warc.gz")))
    };
    let mut t = Table::new();
    let disk = |name: &str| {
        web(name).map_or("not measured".to_string(), |f| {
            format!("{:.2}", f.disk_bytes as f64 / f.body_bytes.max(1) as f64)
        })
    };
    t.add(
        "store on disk ÷ HTML after a replay and a collection, default config: \
         std docs / synth / link-heavy",
        format!("{} / {} / {}", disk("std-docs"), disk("synth"), disk("link-heavy")),
        "target ≤ 1.0 / ≤ 1.0 / ≤ 2.0",
    );
    t.add(
        "replay ÷ bare parse loop, std docs",
        web("std-docs")
            .map_or("not measured".to_string(), |f| format!("{:.2}", f.bare_s / f.replay_s)),
        "target ≥ 0.5",
    );
    let at = |pages: usize| sizes.iter().find(|f| f.pages == pages);
    let [small, mid, big] = scaling::SIZES.map(at);
    if let (Some(small), Some(mid), Some(big)) = (small, mid, big) {
        t.add(
            "peak RSS at 100k ÷ at 10k pages",
            format!("{:.2}", big.rss_kb as f64 / mid.rss_kb.max(1) as f64),
            format!(
                "{} / {} MiB; target ≤ 1.3, and ≤ 600 MiB at 100k",
                big.rss_kb / 1024,
                mid.rss_kb / 1024
            ),
        );
        let rate = |f: &scaling::Figures| f.pages as f64 / f.replay_s;
        t.add(
            "replay pages/s at 100k ÷ at 10k",
            format!("{:.2}", rate(big) / rate(mid)),
            format!("{:.0} / {:.0} pages/s; target ≥ 0.8", rate(big), rate(mid)),
        );
        t.add(
            "update p50 at 100k ÷ at 1k",
            format!("{:.2}", big.p50_ms / small.p50_ms),
            format!("{:.1} / {:.1} ms; target ≤ 1.3", big.p50_ms, small.p50_ms),
        );
    } else {
        t.add("the sizes' ratios", "not measured", "they need the 1k, 10k and 100k runs (scale 1)");
    }
    t.add(
        "a 1,000,000-page replay",
        "run alone",
        "perc-bench scaling --pages 1000000; target ≤ 1 h, ≤ 1 GiB peak RSS, store ≤ the HTML",
    );
    t.print("the storage targets (datapath and scaling, this run)");
    Ok(())
}
