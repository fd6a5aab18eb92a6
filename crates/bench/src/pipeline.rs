//! The indexing pipeline's figures: replay throughput end to end (load, then quiescence) on
//! a synthetic web of 3000 pages (perc-synth, seed 7), against the bare work of parsing, hashing and extracting links from the
//! same pages with no store (the physical limit); crawl throughput against the same site
//! served on 127.0.0.1; store operations per indexed page.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use perc_observers::model::CrawlScope;
use perc_pipeline::{Backend, Config, Create, Fetching, Pipeline};
use perc_store::{Counted, OpCounts, Store};
use perc_synth::{Spec, Web};
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::table::{rate, scaled, Table};

/// A pipeline as the CLI opens it, on sled in a temporary directory, its store calls counted
/// (32 runs in flight; the collector off unless asked for, so that only indexing is
/// measured).
pub(crate) struct Setup {
    pub dir: tempfile::TempDir,
    pub store: Arc<Counted<Arc<dyn Store>>>,
    pub pipeline: Pipeline,
}

pub(crate) async fn setup(fetching: Fetching, collector: Collector) -> Result<Setup> {
    let dir = tempfile::tempdir()?;
    let (store, pipeline) = open_in(dir.path(), fetching, collector).await?;
    Ok(Setup { dir, store, pipeline })
}

/// Whether the workers collect old versions as they run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Collector {
    /// Not at all: only indexing is measured.
    Off,
    /// As `perc replay` and `perc serve` do (`workers.gc_interval_ms`'s default).
    AsConfigured,
}

/// The same pipeline on the store in `dir`, made there if there is none.
pub(crate) async fn open_in(
    dir: &std::path::Path,
    fetching: Fetching,
    collector: Collector,
) -> Result<(Arc<Counted<Arc<dyn Store>>>, Pipeline)> {
    // The defaults, or what `PERC_<SECTION>_<KEY>` variables set (to measure a setting).
    let env: Vec<(String, String)> = std::env::vars().collect();
    let mut config = perc_pipeline::config::load(None, &env, &[])?;
    config.store.data = dir.display().to_string();
    config.workers.concurrency = 32;
    if collector == Collector::Off {
        config.workers.gc_interval_ms = 0;
    }
    let sled = perc_pipeline::open_store(&config, Create::IfMissing).await?;
    let store = Arc::new(Counted::new(sled));
    let pipeline = Pipeline::builder(config)
        .store(store.clone() as Arc<dyn Store>)
        .fetching(fetching)
        .open()
        .await?;
    Ok((store, pipeline))
}

/// `perc replay FILE` through the front door on each backend, alternately, three times each:
/// the median seconds and the pages indexed, memory first.
async fn memory_against_sled(file: &std::path::Path) -> Result<((f64, usize), (f64, usize))> {
    let mut times = [Vec::new(), Vec::new()];
    let mut pages = [0, 0];
    for _ in 0..3 {
        for (i, backend) in [Backend::Memory, Backend::Sled].into_iter().enumerate() {
            let dir = tempfile::tempdir()?;
            let mut config = Config::defaults();
            config.store.backend = backend;
            config.store.data = dir.path().display().to_string();
            let start = Instant::now();
            let p = Pipeline::open(config, Fetching::Offline, Create::IfMissing).await?;
            let r = p.replay(&[file.to_path_buf()], &CancellationToken::new()).await?;
            p.close().await?;
            times[i].push(start.elapsed().as_secs_f64());
            pages[i] = r.pages;
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(((median(&mut times[0]), pages[0]), (median(&mut times[1]), pages[1])))
}

fn ops_note(before: OpCounts, after: OpCounts, pages: usize) -> String {
    let per = (after.row_ops() - before.row_ops()) as f64 / pages as f64;
    let syncs = (after.sync - before.sync) as f64 / pages as f64;
    let k = |a: u64, b: u64| (a - b) as f64 / pages as f64;
    format!(
        "{per:.1} store calls + {syncs:.1} syncs per indexed page (read_row {:.1}, read_rows {:.1}, check_and_mutate {:.1}, mutate_rows {:.1}, scan {:.1})",
        k(after.read_row, before.read_row),
        k(after.read_rows, before.read_rows),
        k(after.check_and_mutate, before.check_and_mutate),
        k(after.mutate_rows, before.mutate_rows),
        k(after.scan, before.scan),
    )
}

pub fn run(scale: f64) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        println!(
            "# perc-bench pipeline (scale {scale}; 2 worker threads; sled 0.34 in a temp dir)"
        );
        let n = scaled(3_000, scale) as usize;
        let web = Web::new(Spec::new(n, 7));
        let mut t = Table::new();

        let warc_dir = tempfile::tempdir()?;
        let warc = warc_dir.path().join("synth.warc.gz");
        perc_synth::write::warc(&web, &warc)?;

        // The physical limit: read the WARC, parse, hash and extract links, nothing stored.
        let start = Instant::now();
        let mut links = 0usize;
        perc_crawl::warc::read_each(&warc, u64::MAX, |r| {
            links += crate::datapath::bare_work(&r);
        })?;
        let bare = start.elapsed().as_secs_f64();
        t.add(
            format!("bare WARC read + parse + blake3 + links, {n} pages"),
            rate(n as u64, bare),
            format!("{links} links; one thread, no store"),
        );

        // Replay: `perc replay` of the same WARC, to quiescence.
        let s = setup(Fetching::Offline, Collector::Off).await?;
        let before = s.store.counts();
        let start = Instant::now();
        let replayed =
            s.pipeline.replay(std::slice::from_ref(&warc), &CancellationToken::new()).await?;
        let replay = start.elapsed().as_secs_f64();
        let indexed = replayed.pages;
        t.add(
            format!("replay end to end, {n} pages"),
            rate(n as u64, replay),
            format!("{indexed} pages indexed; {}", ops_note(before, s.store.counts(), indexed)),
        );
        t.add("replay / bare throughput", format!("{:.2}", bare / replay), "goal >= 0.5");
        for st in s.pipeline.engine().stats() {
            t.add(
                format!("replay: {} runs per indexed page", st.name),
                format!("{:.2}", st.commits as f64 / indexed as f64),
                format!(
                    "{:.2} skipped, {:.3} conflicts per page; mean run {} µs",
                    st.skipped as f64 / indexed as f64,
                    st.conflicts as f64 / indexed as f64,
                    st.latency_us_mean
                ),
            );
        }

        crawl_row(&mut t, &web, n).await?;
        t.print("the indexing pipeline on sled");
        throwaway_replays(scale, &warc).await
    })
}

/// The crawl's row: the same site served on 127.0.0.1, seeded with every 97th page.
async fn crawl_row(t: &mut Table, web: &Web, n: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    perc_synth::write::site(web, dir.path())?;
    let served = perc_synth::site::serve(dir.path()).await?;
    let base = served.base();
    let s = setup(Fetching::Live { warc_out: None }, Collector::Off).await?;
    let seeds: Vec<Url> =
        (0..n).step_by(97).map(|i| base.join(&format!("p/{i}.html")).unwrap()).collect();
    let scope = CrawlScope {
        seeds: seeds.iter().map(Url::to_string).collect(),
        prefixes: vec![],
        max_depth: 20,
        max_redirects: 5,
    };
    let before = s.store.counts();
    let start = Instant::now();
    let (run, report) = s.pipeline.crawl(&seeds, &scope, &CancellationToken::new()).await?;
    let crawl = start.elapsed().as_secs_f64();
    let (fetched, indexed) = (run.fetched, report.pages);
    t.add(
        format!("crawl of the site on 127.0.0.1, {fetched} URLs fetched"),
        rate(fetched, crawl),
        format!(
            "{indexed} pages indexed; one request at a time per host; {}",
            ops_note(before, s.store.counts(), indexed)
        ),
    );
    Ok(())
}

/// Throwaway replays (`perc replay --expect`): the memory store against sled, on the fixture
/// WARC, a book-sized WARC and the synth WARC at `synth`.
async fn throwaway_replays(scale: f64, synth: &std::path::Path) -> Result<()> {
    let mut t = Table::new();
    let dir = tempfile::tempdir()?;
    let book = dir.path().join("book.warc.gz");
    perc_synth::write::warc(&Web::new(Spec::new(scaled(120, scale).max(10) as usize, 3)), &book)?;
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/crawls/wget-demo.warc.gz");
    for (what, file) in [
        ("the fixture WARC", fixture),
        ("a book-sized WARC", book),
        ("the synth WARC", synth.to_path_buf()),
    ] {
        let (memory, sled) = memory_against_sled(&file).await?;
        t.add(
            format!("replay of {what}, memory store / sled"),
            format!("{:.2}", memory.0 / sled.0),
            format!(
                "{} pages; medians of 3 alternating runs: memory {:.3} s, sled {:.3} s",
                memory.1, memory.0, sled.0
            ),
        );
    }
    t.print("throwaway replays: memory and sled");
    Ok(())
}
