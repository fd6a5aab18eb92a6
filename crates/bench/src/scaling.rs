//! The paper's claim, measured: an update costs what the update touches, not what the
//! repository holds. On synthetic webs (perc-synth) of 1k, 10k and 100k pages:
//!
//! 1. replay (load every page while the workers index and collect old versions as
//!    `perc replay`'s do, until quiescent): pages/s, store calls per page, peak RSS, store
//!    size on disk; then a collection pass over the whole store;
//! 2. update latency: change one page's content and links, and time until all its effects
//!    are indexed (the workers quiescent again), p50 and p99 over 100 updates;
//! 3. a full rebuild of the 100k pages (the replay from scratch) against one update;
//! 4. peak RSS of the 100k replay;
//! 5. `perc compact`'s rewrite of the store, and the update latency again on the compacted
//!    store, opened anew: whether a store whose nodes sled reads in from one piece each (up
//!    to ten before the rewrite) answers faster.
//!
//! Each size runs in a child process of its own (`perc-bench scaling-one`), so that its peak
//! RSS (VmHWM) is its own. One size alone (`--pages N`, the million-page run) also writes a
//! sample of its export at its end, which another child checks against perc-reference
//! ([`crate::check`]); `--no-compact` leaves out step 5.

use std::time::Instant;

use anyhow::{Context, Result};
use perc_crawl::warc::Recorded;
use perc_notify::Workers;
use perc_pipeline::Fetching;
use perc_synth::{Change, Spec, Web};

use crate::pipeline::Collector;
use crate::table::{in_a_child, rate, scaled, Table};

const UPDATES: usize = 100;
/// Updates run, unmeasured, on a store opened anew before its updates are measured.
const WARM_UPDATES: usize = 20;
const LOAD_BATCH: usize = 256;
/// The synthetic webs' seed.
pub(crate) const SEED: u64 = 11;
/// The sizes the suite measures, in pages (at scale 1).
pub(crate) const SIZES: [usize; 3] = [1_000, 10_000, 100_000];

/// One series of updates: `count` pages that `seed` picks, each changed (content and links)
/// to the version after `before` plus its place in the series.
#[derive(Clone, Copy)]
pub(crate) struct Series {
    seed: u64,
    before: u32,
    count: usize,
}

/// The updates a size runs, in order: measured on the store the replay left; then, on the
/// compacted store opened anew, unmeasured ones to warm it, and measured ones.
const SERIES: [Series; 3] = [
    Series { seed: 5, before: 0, count: UPDATES },
    Series { seed: 7, before: UPDATES as u32, count: WARM_UPDATES },
    Series { seed: 6, before: (UPDATES + WARM_UPDATES) as u32, count: UPDATES },
];

/// The version each page updated by `series` is left at (a later series wins): with the web,
/// what the store holds at the end.
pub(crate) fn versions(web: &Web, series: &[Series]) -> std::collections::BTreeMap<usize, u32> {
    let mut out = std::collections::BTreeMap::new();
    for s in series {
        for (n, (i, _)) in web.change_set(s.count, s.seed).into_iter().enumerate() {
            out.insert(i, s.before + n as u32 + 1);
        }
    }
    out
}

/// One size's figures, as the child prints them (one JSON line).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Figures {
    pub(crate) pages: usize,
    indexed: usize,
    pub(crate) replay_s: f64,
    calls_per_page: f64,
    pub(crate) rss_kb: u64,
    /// The peak resident set by the end of the replay (`rss_kb` also covers the collection
    /// after it and the updates).
    #[serde(default)]
    replay_rss_kb: u64,
    /// One collection pass over the store after the replay, in seconds.
    #[serde(default)]
    gc_s: f64,
    /// The peak resident set by the end of that collection pass.
    #[serde(default)]
    gc_rss_kb: u64,
    /// The write records that pass removed.
    #[serde(default)]
    gc_removed: u64,
    disk_bytes: u64,
    /// The response bodies the replay loaded (uncompressed): the HTML the store holds.
    #[serde(default)]
    html_bytes: u64,
    /// The store's files after `perc compact`'s rewrite (at the end), and its seconds.
    #[serde(default)]
    compacted_bytes: u64,
    #[serde(default)]
    compact_s: f64,
    /// The peak resident set by the rewrite's end (`rss_kb` is the peak before it).
    #[serde(default)]
    compact_rss_kb: u64,
    /// The updates measured first (p50, p99).
    #[serde(default)]
    pub(crate) updates: usize,
    pub(crate) p50_ms: f64,
    p99_ms: f64,
    /// Per update, on average: store calls, and by observer (name, runs, conflicted runs,
    /// mean committed run in µs).
    update_calls: f64,
    /// Of those, reads of the notify family (the scanners' and the quiescence checks').
    #[serde(default)]
    update_notify_scans: f64,
    update_runs: Vec<(String, f64, f64, f64)>,
    /// The same updates' p50 and p99 (other pages) after `perc compact`, on the store opened
    /// anew, and their store calls per update.
    #[serde(default)]
    compacted_p50_ms: f64,
    #[serde(default)]
    compacted_p99_ms: f64,
    #[serde(default)]
    compacted_update_calls: f64,
}

/// The peak resident set of this process, from /proc.
pub(crate) fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// The bytes of every file under `dir`: the store's size on disk.
fn dir_bytes(dir: &std::path::Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { dir_bytes(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}

/// Profiling the updates alone: with `BENCH_PERF_CTL` naming the control FIFO of a
/// `perf record --control fifo:F -D -1` that started this process, the recording is enabled
/// for the updates only (`command` "enable" or "disable").
fn perf_control(command: &str) {
    if let Some(fifo) = std::env::var_os("BENCH_PERF_CTL") {
        if let Err(e) = std::fs::write(&fifo, format!("{command}\n")) {
            eprintln!("perf control {}: {e}", std::path::Path::new(&fifo).display());
        }
    }
}

/// What a size runs beyond the replay and the first updates.
pub(crate) struct Options {
    /// `perc compact`'s rewrite and the updates on the compacted store.
    pub(crate) compact: bool,
    /// Where to write the export's lines of a sample of the pages at the end, for
    /// [`crate::check`] to compare with the reference.
    pub(crate) sample: Option<std::path::PathBuf>,
    /// The first series' updates, if not [`UPDATES`] (a test's shorter run, or
    /// `scaling --updates`).
    pub(crate) updates: Option<usize>,
}

/// The child: one size, start to end.
pub fn one(pages: usize, options: Options) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let f = rt.block_on(measure(pages, options))?;
    println!("{}", serde_json::to_string(&f)?);
    Ok(())
}

pub(crate) async fn measure(pages: usize, options: Options) -> Result<Figures> {
    let crate::pipeline::Setup { dir, store, pipeline } =
        crate::pipeline::setup(Fetching::Offline, Collector::AsConfigured).await?;
    let loader = pipeline.client().clone();
    // Updates arrive while the workers run, as in `perc serve`: they are started here and
    // waited on after each load, rather than run to quiescence per command.
    let workers = Workers::start(pipeline.engine().clone(), &tokio::runtime::Handle::current());
    let web = Web::new(Spec::new(pages, SEED));

    // 1. Replay: stream the web in, the workers indexing as it arrives.
    let before = store.counts();
    let start = Instant::now();
    let mut batch = Vec::with_capacity(LOAD_BATCH);
    let mut html_bytes = 0;
    // No search index drains the queue here: it is bounded as `perc replay` bounds it. The
    // ranks are settled at the end, as `perc replay` settles them.
    perc_observers::rank::defer(&loader).await?;
    for (url, response) in web.responses() {
        html_bytes += response.body.len() as u64;
        batch.push(Recorded { url, response });
        if batch.len() == LOAD_BATCH {
            perc_observers::load_recorded(&loader, &batch).await?;
            workers.kick();
            batch.clear();
            pipeline.bound_search_queue(false).await;
        }
    }
    perc_observers::load_recorded(&loader, &batch).await?;
    workers.wait().await?;
    pipeline.settle_ranks().await?;
    workers.kick();
    workers.wait().await?;
    pipeline.bound_search_queue(true).await;
    let replay_s = start.elapsed().as_secs_f64();
    let replay_rss_kb = peak_rss_kb();
    let calls = store.counts().row_ops() - before.row_ops();
    let indexed = perc_observers::page_count(&loader).await?;
    // The workers collect as `perc replay`'s do (the rows they emptied within seconds, a pass
    // over the store every `gc_interval_ms` at most, a tenth of the time at most); a pass,
    // measured, runs before the updates. It collects below the smallest low watermark the
    // clients published, and the workers publish theirs with each heartbeat: after a replay
    // shorter than its period, the one from their start, and the pass removed nothing (at 1k
    // pages, half the runs; the updates then ran on every version, a p50 of ~22 ms against
    // ~14). So the workers beat first, as a running system's collector does in them.
    workers.engine().client().heartbeat().await?;
    let gc_start = Instant::now();
    let gc = perc_txn::gc::collect(&loader, 4096).await?;
    let gc_s = gc_start.elapsed().as_secs_f64();
    let gc_rss_kb = peak_rss_kb();

    // 2. Update latency: one page's content and links change; wait for every effect.
    perf_control("enable");
    let first = Series { count: options.updates.unwrap_or(UPDATES), ..SERIES[0] };
    let series = [first, SERIES[1], SERIES[2]];
    let measured = updates(&loader, &store, &workers, &web, series[0]).await?;
    perf_control("disable");
    workers.shutdown().await;
    let mut f = Figures {
        pages,
        indexed,
        replay_s,
        calls_per_page: calls as f64 / indexed.max(1) as f64,
        rss_kb: 0,
        compact_rss_kb: 0,
        replay_rss_kb,
        gc_s,
        gc_rss_kb,
        gc_removed: gc.write_records_removed,
        disk_bytes: 0,
        html_bytes,
        compacted_bytes: 0,
        compact_s: 0.0,
        updates: measured.latencies_ms.len(),
        p50_ms: measured.percentile(0.5),
        p99_ms: measured.percentile(0.99),
        update_calls: measured.calls,
        update_notify_scans: measured.notify_scans,
        update_runs: measured.runs,
        compacted_p50_ms: 0.0,
        compacted_p99_ms: 0.0,
        compacted_update_calls: 0.0,
    };
    if !options.compact {
        if let Some(path) = &options.sample {
            crate::check::write_sample(&loader, &web, &series[..1], path).await?;
        }
    }
    let sled_options = perc_pipeline::sled_options(&pipeline.config().store);
    pipeline.close().await?;
    f.disk_bytes = dir_bytes(dir.path())?;
    f.rss_kb = peak_rss_kb();
    if !options.compact {
        return Ok(f);
    }
    // `perc compact`'s rewrite of the files, once nothing holds the store.
    drop((loader, store));
    let start = Instant::now();
    let compacted = perc_store::SledStore::compact(dir.path(), &sled_options, &|| false)?
        .context("the compaction stopped")?;
    f.compact_s = start.elapsed().as_secs_f64();
    f.compact_rss_kb = peak_rss_kb();
    f.compacted_bytes = compacted.bytes_after;

    // 3. The updates again on the compacted store, opened anew as a restarted `perc serve`
    // opens it: other pages, new versions; a few first, unmeasured, to bring its index nodes
    // into the cache as a running process has them.
    let (store, pipeline) =
        crate::pipeline::open_in(dir.path(), Fetching::Offline, Collector::AsConfigured).await?;
    let loader = pipeline.client().clone();
    let workers = Workers::start(pipeline.engine().clone(), &tokio::runtime::Handle::current());
    updates(&loader, &store, &workers, &web, series[1]).await?;
    let after_compact = updates(&loader, &store, &workers, &web, series[2]).await?;
    if let Some(path) = &options.sample {
        crate::check::write_sample(&loader, &web, &series, path).await?;
    }
    workers.shutdown().await;
    pipeline.close().await?;
    f.compacted_p50_ms = after_compact.percentile(0.5);
    f.compacted_p99_ms = after_compact.percentile(0.99);
    f.compacted_update_calls = after_compact.calls;
    Ok(f)
}

/// What a series of updates measured: each one's latency (sorted), and per update, the
/// store calls, the reads of the notify family, and by observer (name, runs, conflicted
/// runs, mean committed run in µs).
struct Updates {
    latencies_ms: Vec<f64>,
    calls: f64,
    notify_scans: f64,
    runs: Vec<(String, f64, f64, f64)>,
}

impl Updates {
    fn percentile(&self, p: f64) -> f64 {
        self.latencies_ms[((self.latencies_ms.len() - 1) as f64 * p).round() as usize]
    }
}

/// The updates of `series`, one at a time, each timed from its load until the workers are
/// quiescent again (every effect indexed).
async fn updates(
    loader: &perc_txn::Client,
    store: &perc_store::Counted<std::sync::Arc<dyn perc_store::Store>>,
    workers: &Workers,
    web: &Web,
    series: Series,
) -> Result<Updates> {
    let Series { seed, before: versions_before, count } = series;
    let mut latencies_ms = Vec::with_capacity(count);
    let calls_before = store.counts().row_ops();
    let notify_scans_before = store.scans_of(perc_txn::actions::NOTIFY.name);
    let runs_before = workers.engine().stats();
    for (n, (i, _)) in web.change_set(count, seed).into_iter().enumerate() {
        let update = Recorded {
            url: web.url(i),
            response: web.changed(i, versions_before + n as u32 + 1, Change::ContentAndLinks),
        };
        let t = Instant::now();
        perc_observers::load_recorded(loader, std::slice::from_ref(&update)).await?;
        workers.wait().await?;
        latencies_ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let count = latencies_ms.len().max(1) as f64;
    let calls = (store.counts().row_ops() - calls_before) as f64 / count;
    let notify_scans =
        (store.scans_of(perc_txn::actions::NOTIFY.name) - notify_scans_before) as f64 / count;
    let runs = workers
        .engine()
        .stats()
        .into_iter()
        .zip(runs_before)
        .map(|(after, before)| {
            let commits = (after.commits - before.commits).max(1) as f64;
            let runs = (after.runs - before.runs) as f64 / count;
            let conflicts = (after.conflicts - before.conflicts) as f64 / count;
            (
                after.name.clone(),
                runs,
                conflicts,
                (after.latency_us_total - before.latency_us_total) as f64 / commits,
            )
        })
        .filter(|(_, runs, _, _)| *runs > 0.0)
        .collect();
    latencies_ms.sort_by(f64::total_cmp);
    Ok(Updates { latencies_ms, calls, notify_scans, runs })
}

/// The parent: every size in a child, then the tables. The three sizes (1k, 10k and 100k
/// pages, scaled); or, with `pages`, that size alone (the million-page run: `perc-bench
/// scaling --pages 1000000`), its export then checked on a sample (crate::check).
pub fn run(
    scale: f64,
    pages: Option<u64>,
    compact: bool,
    updates: Option<usize>,
) -> Result<Vec<Figures>> {
    println!("# perc-bench scaling (scale {scale}; 2 worker threads; sled 0.34 in a temp dir)");
    let sizes = match pages {
        Some(n) => vec![n],
        None => SIZES.iter().map(|&n| scaled(n as u64, scale)).collect(),
    };
    let samples = tempfile::tempdir()?;
    let sample = samples.path().join("sample.jsonl");
    let mut all: Vec<Figures> = Vec::new();
    for n in sizes {
        let mut args = vec!["scaling-one".to_string(), "--pages".into(), n.to_string()];
        if !compact {
            args.push("--no-compact".into());
        }
        if pages.is_some() {
            args.extend(["--sample".into(), sample.display().to_string()]);
        }
        if let Some(u) = updates {
            args.extend(["--updates".into(), u.to_string()]);
        }
        all.push(in_a_child(&args, &[])?);
    }
    let mut t = Table::new();
    if pages.is_some() {
        let c: crate::check::Checked =
            in_a_child(&["scaling-check".to_string(), sample.display().to_string()], &[])?;
        t.add(
            "export of a sample against the reference",
            format!("{} / {}", c.equal, c.sampled),
            format!(
                "lines equal to perc-reference's, of {} sampled URLs ({} of them pages; \
                 pagerank at most {:.6} from the exact, {:.2} of its bound); the reference \
                 parsed the web in {:.0} s and made the lines in {:.0} s, peak RSS {} MiB{}",
                c.sampled,
                c.lines,
                c.pagerank_error,
                c.pagerank_share,
                c.parse_s,
                c.lines_s,
                c.rss_kb / 1024,
                if c.differences.is_empty() {
                    String::new()
                } else {
                    format!("; differences: {}", c.differences.join(" / "))
                }
            ),
        );
    }
    add_sizes(&mut t, &all);
    if all.len() > 1 {
        add_ratios(&mut t, &all);
    }
    t.print("scaling on synthetic webs");
    Ok(all)
}

/// The rows of each size: the replay, the update latency, and the same after `perc compact`.
fn add_sizes(t: &mut Table, all: &[Figures]) {
    for f in all {
        t.add(
            format!("replay, {} pages", f.pages),
            rate(f.pages as u64, f.replay_s),
            format!(
                "{} indexed in {:.1} s; {:.1} store calls per page; peak RSS {} MiB; store {} MiB on disk \
                 ({:.2} × the HTML, {} MiB); a collection pass {:.1} s ({} write records removed){}",
                f.indexed,
                f.replay_s,
                f.calls_per_page,
                f.rss_kb / 1024,
                f.disk_bytes >> 20,
                f.disk_bytes as f64 / f.html_bytes.max(1) as f64,
                f.html_bytes >> 20,
                f.gc_s,
                f.gc_removed,
                if compacted(f) {
                    format!(
                        "; after the updates, perc compact's rewrite {:.1} s, to {} MiB (peak RSS \
                         by its end {} MiB)",
                        f.compact_s,
                        f.compacted_bytes >> 20,
                        f.compact_rss_kb / 1024
                    )
                } else {
                    String::new()
                }
            ),
        );
    }
    for f in all {
        t.add(
            format!("update latency, {} pages", f.pages),
            format!("p50 {:.1} ms", f.p50_ms),
            format!(
                "p99 {:.1} ms over {} updates (content and links of one page); per update \
                 {:.0} store calls ({:.0} reads of the notify family), observer runs (of which \
                 conflicted): {}",
                f.p99_ms,
                f.updates,
                f.update_calls,
                f.update_notify_scans,
                f.update_runs
                    .iter()
                    .map(|(name, runs, conflicts, us)| {
                        format!("{name} {runs:.1} ({conflicts:.1}; {us:.0} µs)")
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    for f in all.iter().filter(|f| compacted(f)) {
        t.add(
            format!("update latency after perc compact, {} pages", f.pages),
            format!("p50 {:.1} ms", f.compacted_p50_ms),
            format!(
                "p99 {:.1} ms over {UPDATES} updates of other pages, on the compacted store \
                 opened anew ({WARM_UPDATES} updates before, unmeasured); per update {:.0} \
                 store calls",
                f.compacted_p99_ms, f.compacted_update_calls
            ),
        );
    }
}

/// Whether the size ran `perc compact` and the updates after it.
fn compacted(f: &Figures) -> bool {
    f.compacted_bytes > 0
}

/// The rows that compare the largest size with the smallest.
fn add_ratios(t: &mut Table, all: &[Figures]) {
    let (small, big) = (&all[0], &all[all.len() - 1]);
    t.add(
        format!("p50 update latency at {} / at {} pages", big.pages, small.pages),
        format!("{:.2}", big.p50_ms / small.p50_ms),
        "target <= 1.3 (perc-bench goals)",
    );
    // An update of one page at 100k pages has more effects than at 1k (its old and new links
    // share fewer targets): the same ratio per observer run an update caused.
    let runs = |f: &Figures| f.update_runs.iter().map(|(_, runs, _, _)| runs).sum::<f64>();
    t.add(
        format!("p50 update latency per observer run, at {} / at {} pages", big.pages, small.pages),
        format!("{:.2}", (big.p50_ms / runs(big)) / (small.p50_ms / runs(small))),
        format!(
            "{:.1} runs an update at {} pages, {:.1} at {}",
            runs(big),
            big.pages,
            runs(small),
            small.pages
        ),
    );
    t.add(
        format!(
            "p50 update latency at {} / at {} pages, after perc compact",
            big.pages, small.pages
        ),
        format!("{:.2}", big.compacted_p50_ms / small.compacted_p50_ms),
        "target <= 1.3 (perc-bench goals)",
    );
    t.add(
        format!("full rebuild of {} pages / one update", big.pages),
        format!("{:.0}x", big.replay_s * 1000.0 / big.p50_ms),
        format!("rebuild {:.1} s against p50 {:.1} ms (goal >= 1000x)", big.replay_s, big.p50_ms),
    );
    t.add(
        format!("peak RSS, {} pages", big.pages),
        format!("{} MiB", big.rss_kb / 1024),
        format!(
            "{} MiB by the replay's end, {} MiB by the collection pass's end; {} MiB at {} pages, \
             {} MiB at {} (goal <= 1024 MiB, flat)",
            big.replay_rss_kb / 1024,
            big.gc_rss_kb / 1024,
            small.rss_kb / 1024,
            small.pages,
            all[1.min(all.len() - 1)].rss_kb / 1024,
            all[1.min(all.len() - 1)].pages
        ),
    );
}
