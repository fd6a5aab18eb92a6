//! The indexing pipeline's figures: replay throughput end to end (load, then quiescence) on
//! a synthetic web of 3000 pages (perc-synth, seed 7), against the bare work of parsing, hashing and extracting links from the
//! same pages with no store (the physical limit); crawl throughput against the same site
//! served on 127.0.0.1; store operations per indexed page.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use perc_crawl::warc::Recorded;
use perc_crawl::{
    Crawler, FetchLimits, HttpFetcher, Polite, PolitenessConfig, RobotsCache, Source,
};
use perc_notify::{client_for, Engine, NotifyConfig, Workers};
use perc_observers::model::CrawlScope;
use perc_oracle::{LocalOracle, Oracle};
use perc_store::{Counted, OpCounts, SledOptions, SledStore, Store};
use perc_synth::{Spec, Web};
use perc_txn::{Clock, SystemClock, TxnConfig};
use url::Url;

use crate::table::{rate, scaled, Table};

struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<Counted<Arc<dyn Store>>>,
    engine: Arc<Engine>,
    client: perc_txn::Client,
}

async fn setup(source: Arc<dyn Source>) -> Result<Setup> {
    let dir = tempfile::tempdir()?;
    let sled: Arc<dyn Store> =
        Arc::new(SledStore::open(dir.path(), perc_notify::schema(), &SledOptions::default())?);
    let store = Arc::new(Counted::new(sled));
    let dyn_store: Arc<dyn Store> = store.clone();
    let oracle: Arc<dyn Oracle> = Arc::new(LocalOracle::open(dyn_store.clone(), 1_000_000).await?);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let registry = Arc::new(perc_observers::registry(source)?);
    // As in the CLI: observer runs do not flush at their commit point.
    let relaxed = TxnConfig { sync_commits: false, ..TxnConfig::default() };
    let ec =
        client_for(dyn_store.clone(), oracle.clone(), clock.clone(), relaxed, registry.clone())
            .await?;
    let client =
        client_for(dyn_store, oracle, clock, TxnConfig::default(), registry.clone()).await?;
    let config = NotifyConfig { concurrency: 32, gc_interval_ms: 0, ..NotifyConfig::default() };
    Ok(Setup { _dir: dir, store, engine: Arc::new(Engine::new(ec, registry, config)), client })
}

async fn quiesce(s: &Setup) -> Result<()> {
    let workers = Workers::start(s.engine.clone(), &tokio::runtime::Handle::current());
    workers.wait().await?;
    workers.shutdown().await;
    Ok(())
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

        // The physical limit: parse, hash and extract links, nothing stored.
        let start = Instant::now();
        let mut links = 0usize;
        for (url, r) in web.responses() {
            if r.status == 200 {
                let parsed = perc_crawl::parse(&url, &r.body, r.charset.as_deref());
                std::hint::black_box(perc_crawl::content_hash(&r.body));
                links += parsed.links.len();
            }
        }
        let bare = start.elapsed().as_secs_f64();
        t.add(
            format!("bare parse + blake3 + links, {n} pages"),
            rate(n as u64, bare),
            format!("{links} links; one thread, no store"),
        );

        // Replay: load every response, run the pipeline to quiescence.
        let s = setup(Arc::new(perc_crawl::Offline)).await?;
        let recorded: Vec<Recorded> =
            web.responses().map(|(url, response)| Recorded { url, response }).collect();
        let before = s.store.counts();
        let start = Instant::now();
        perc_observers::load_recorded(&s.client, &recorded).await?;
        quiesce(&s).await?;
        let replay = start.elapsed().as_secs_f64();
        let indexed = perc_observers::export(&s.client).await?.len();
        t.add(
            format!("replay end to end, {n} pages"),
            rate(n as u64, replay),
            format!("{indexed} pages indexed; {}", ops_note(before, s.store.counts(), indexed)),
        );
        t.add("replay / bare throughput", format!("{:.2}", bare / replay), "goal >= 0.5");
        for st in s.engine.stats() {
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

        // Crawl: the same site served on 127.0.0.1.
        let dir = tempfile::tempdir()?;
        perc_synth::write::site(&web, dir.path())?;
        let served = perc_cli::site::serve(dir.path()).await?;
        let base = served.base();
        let limits = FetchLimits::default();
        let polite = Arc::new(Polite::new(
            HttpFetcher::new(limits).map_err(|e| anyhow::anyhow!("{e}"))?,
            PolitenessConfig::default(),
        ));
        let robots = RobotsCache::new(polite.clone(), "perc", 3_600_000, 1_000, 3);
        let s = setup(Arc::new(Crawler::new(polite, robots))).await?;
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
        perc_observers::seed(&s.client, &seeds, &scope).await?;
        quiesce(&s).await?;
        let crawl = start.elapsed().as_secs_f64();
        let fetched = s.engine.stats().iter().find(|x| x.name == "fetch").map_or(0, |x| x.commits);
        let indexed = perc_observers::export(&s.client).await?.len();
        t.add(
            format!("crawl of the site on 127.0.0.1, {fetched} URLs fetched"),
            rate(fetched, crawl),
            format!(
                "{indexed} pages indexed; one request at a time per host; {}",
                ops_note(before, s.store.counts(), indexed)
            ),
        );
        t.print("the indexing pipeline on sled");
        Ok(())
    })
}
