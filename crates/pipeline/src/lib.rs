//! perc's front door: one process's perc (the store, the oracle, the observers and the
//! workers) assembled from a validated [`Config`], and the run-until-quiescent loop with its
//! progress display. The binary, the benchmarks and the tests open a [`Pipeline`] rather than
//! wiring the layers themselves.

pub mod config;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use perc_crawl::warc::{Recorded, Recorder, WarcIssue};
use perc_crawl::{
    Budget, Crawler, FetchLimits, Fetcher, HttpFetcher, Offline, Polite, PolitenessConfig,
    Recording, RobotsCache, Source,
};
use perc_notify::{client_for, Engine, FailedEntry, ObserverStats, RowLease, StoreLease, Workers};
use perc_observers::model::CrawlScope;
use perc_observers::Report;
use perc_oracle::{LocalOracle, Oracle, RemoteOracle};
use perc_store::{SledOptions, SledStore, Store};
use perc_txn::{Client, Clock, SystemClock, TxnConfig};
use tokio_util::sync::CancellationToken;
use url::Url;

pub use crate::config::{Backend, Config};

/// A run stopped by SIGINT or SIGTERM: what it did is saved, and running the same command
/// again resumes it.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

pub struct Pipeline {
    pub store: Arc<dyn Store>,
    pub client: Client,
    pub engine: Arc<Engine>,
    pub config: Config,
}

/// Where the fetch observer gets pages.
pub enum Fetching {
    /// The live web (robots.txt, politeness), optionally recording a WARC.
    Live { warc_out: Option<Recorder> },
    /// Nothing is fetched: a URL not already loaded is recorded as not available.
    Offline,
}

fn source(config: &Config, fetching: Fetching) -> Result<Arc<dyn Source>> {
    let Fetching::Live { warc_out } = fetching else { return Ok(Arc::new(Offline)) };
    let c = &config.crawl;
    let limits = FetchLimits {
        connect_timeout_ms: c.connect_timeout_ms,
        total_timeout_ms: c.total_timeout_ms,
        body_bytes_max: c.body_bytes_max,
        user_agent: c.user_agent.clone(),
    };
    let politeness = PolitenessConfig {
        concurrency_max: c.concurrency_max,
        host_delay_ms: c.host_delay_ms,
        delay_cap_ms: c.delay_cap_ms,
    };
    let http = HttpFetcher::new(limits).map_err(|e| anyhow!("cannot set up HTTP: {e}"))?;
    let fetcher: Arc<dyn Fetcher> = match warc_out {
        Some(recorder) => Arc::new(Recording::new(http, recorder, c.user_agent.clone())),
        None => Arc::new(http),
    };
    let polite = Arc::new(Polite::new(fetcher, politeness));
    let robots = RobotsCache::new(
        polite.clone(),
        c.user_agent.clone(),
        c.robots_ttl_ms,
        c.robots_retry_ms,
        c.robots_attempts,
    );
    let crawler: Arc<dyn Source> = Arc::new(Crawler::new(polite, robots));
    if c.max_pages == 0 {
        return Ok(crawler);
    }
    Ok(Arc::new(Budget::new(crawler, c.max_pages)))
}

impl Pipeline {
    /// Whether the configured store exists. Only a crawl or a replay should create one: for
    /// any other command a missing store is a mistake (a typo in `--data`), not an empty
    /// index. A shared Bigtable table always counts as existing (perc creates it on open).
    pub fn exists(config: &Config) -> bool {
        config.store.backend != Backend::Sled || SledStore::exists(&config.store.data)
    }

    /// Opens the configured store, creating it if it does not exist, and assembles the
    /// process around it.
    pub async fn open(config: Config, fetching: Fetching) -> Result<Pipeline> {
        if config.store.backend == Backend::Sled && config.workers.scanners == 0 {
            anyhow::bail!(
                "workers.scanners = 0 leaves nobody to run the observers of the embedded store \
                 (store.backend = \"sled\"): it must be at least 1 (0 is for processes that \
                 only load a shared Bigtable store)"
            );
        }
        let store = open_store(&config).await?;
        let oracle = open_oracle(&config, &store).await?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        if config.store.backend == Backend::Sled {
            // The embedded store admits one process: every worker registered in it belongs to
            // a process that ended (killed, most likely), and its locks may go at once.
            let gone =
                perc_txn::Liveness::new(store.clone(), clock.clone(), 0).forget_all().await?;
            if gone > 0 {
                tracing::info!(
                    workers = gone,
                    "cleared the liveness of workers of an ended process"
                );
            }
        }
        let registry = Arc::new(perc_observers::registry(source(&config, fetching)?)?);
        let txn = TxnConfig {
            lock_ttl_ms: config.txn.lock_ttl_ms,
            liveness_ttl_ms: config.txn.liveness_ttl_ms,
            ..TxnConfig::default()
        };
        // Observer runs are acknowledged to nobody: they need not flush at their commit point
        // (see TxnConfig::sync_commits); the loaders' commits do, and `close` syncs the rest.
        let relaxed = TxnConfig { sync_commits: false, ..txn.clone() };
        let engine_client =
            client_for(store.clone(), oracle.clone(), clock.clone(), relaxed, registry.clone())
                .await?;
        let client =
            client_for(store.clone(), oracle, clock.clone(), txn, registry.clone()).await?;
        // Many processes share a Bigtable table: they lease notifications in the store.
        let lease: Arc<dyn RowLease> = match config.store.backend {
            Backend::Sled => Arc::new(perc_notify::LocalLease::default()),
            Backend::Bigtable => Arc::new(StoreLease::new(
                store.clone(),
                clock.clone(),
                config.workers.lease_ttl_ms,
                &engine_client.worker().to_string(),
            )),
        };
        let engine =
            Arc::new(Engine::with_lease(engine_client, registry, config.workers.clone(), lease));
        engine.load_parked().await?;
        Ok(Pipeline { store, client, engine, config })
    }

    /// Runs the workers until no notification is pending; shows progress on a terminal.
    /// When `stop` is cancelled (SIGINT, SIGTERM) it stops taking new work, lets the runs in
    /// flight finish, saves the counters and returns [`Interrupted`].
    pub async fn run_until_quiet(
        &self,
        what: &str,
        stop: &CancellationToken,
    ) -> Result<RunSummary> {
        let started = Instant::now();
        tracing::debug!("starting the workers");
        let workers = Workers::start(self.engine.clone(), &tokio::runtime::Handle::current());
        let bar = if std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new_spinner();
            b.enable_steady_tick(Duration::from_millis(120));
            Some(b)
        } else {
            None
        };
        let mut interrupted = false;
        let mut failed = None;
        {
            let wait = workers.wait();
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    r = &mut wait => { failed = r.err(); break; }
                    _ = stop.cancelled() => { interrupted = true; break; }
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {
                        if let Some(b) = &bar {
                            let s = summarize(&self.engine.stats());
                            let pending = self.engine.pending_count(100_000).await.unwrap_or(0);
                            let rate = s.fetched as f64 / started.elapsed().as_secs_f64().max(0.001);
                            b.set_message(format!("{what}: {} fetched, {} parsed, {pending} notifications pending, {rate:.1} pages/s", s.fetched, s.parsed));
                        }
                    }
                }
            }
        }
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        tracing::debug!(interrupted, "workers stopping");
        workers.shutdown().await;
        if let Some(e) = failed {
            return Err(e.into());
        }
        let summary = summarize(&self.engine.stats());
        self.save_stats().await?;
        if interrupted {
            return Err(Interrupted.into());
        }
        Ok(RunSummary { seconds: started.elapsed().as_secs_f64(), ..summary })
    }

    /// Adds this run's counters to the ones stored (shown by `perc status`). Processes
    /// sharing a store add theirs concurrently: a conflict is retried.
    pub async fn save_stats(&self) -> Result<()> {
        Ok(self.client.retrying(async |_| self.try_save_stats().await).await?)
    }

    async fn try_save_stats(&self) -> Result<(), perc_txn::TxnError> {
        let mut t = self.client.begin().await?;
        // A counter record that cannot be read starts over rather than stopping the run.
        let mut all = decode_stats(t.get(STATS_ROW, STATS_COLUMN).await?).unwrap_or_default();
        for s in self.engine.stats() {
            let e = all.entry(s.name.clone()).or_default();
            for (slot, add) in
                e.iter_mut().zip([s.runs, s.commits, s.skipped, s.conflicts, s.failures, s.parked])
            {
                *slot += add;
            }
        }
        t.set(
            Bytes::from_static(STATS_ROW),
            Bytes::from_static(STATS_COLUMN),
            serde_json::to_vec(&all).expect("serializable"),
        );
        t.commit().await?;
        Ok(())
    }

    pub async fn close(self) -> Result<()> {
        self.client.deregister().await?;
        self.engine.client().deregister().await?;
        // Everything the observers committed without a flush is made durable before exit.
        self.store.sync().await?;
        Ok(())
    }
}

/// The configured store: sled in `store.data`, or the Bigtable table.
pub async fn open_store(config: &Config) -> Result<Arc<dyn Store>> {
    match config.store.backend {
        Backend::Sled => {
            let data = Path::new(&config.store.data);
            std::fs::create_dir_all(data)
                .with_context(|| format!("cannot create the data directory {}", data.display()))?;
            let sled = SledStore::open(
                data,
                perc_notify::schema(),
                &SledOptions { cache_bytes: config.store.cache_bytes, flush_every_ms: 500 },
            )
            .map_err(|e| anyhow!("{e} (is another perc process using {}?)", data.display()))?;
            Ok(Arc::new(sled))
        }
        Backend::Bigtable => open_bigtable(config).await,
    }
}

#[cfg(feature = "bigtable")]
async fn open_bigtable(config: &Config) -> Result<Arc<dyn Store>> {
    let b = &config.bigtable;
    if b.emulator.is_empty() && (b.project.is_empty() || b.instance.is_empty()) {
        anyhow::bail!(
            "store.backend = \"bigtable\" needs bigtable.project and bigtable.instance \
             (or bigtable.emulator for a local emulator)"
        );
    }
    let bt = perc_bigtable::BigtableConfig {
        project: if b.project.is_empty() { "perc".into() } else { b.project.clone() },
        instance: if b.instance.is_empty() { "perc".into() } else { b.instance.clone() },
        table: b.table.clone(),
        emulator: (!b.emulator.is_empty()).then(|| b.emulator.clone()),
        channels: b.channels,
        timeout_ms: b.timeout_ms,
    };
    let store = perc_bigtable::BigtableStore::open(&bt, perc_notify::schema())
        .await
        .with_context(|| format!("cannot open the Bigtable table {}", b.table))?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "bigtable"))]
async fn open_bigtable(_config: &Config) -> Result<Arc<dyn Store>> {
    anyhow::bail!(
        "store.backend = \"bigtable\", but this perc was built without Bigtable support: \
         build it with `cargo build --release -p perc-cli --features bigtable`"
    )
}

/// The configured oracle: a `perc oracle` server, or one in this process (sled only: a shared
/// store needs a single oracle for every process).
pub async fn open_oracle(config: &Config, store: &Arc<dyn Store>) -> Result<Arc<dyn Oracle>> {
    if !config.oracle.server.is_empty() {
        let client = perc_oracle::ClientConfig {
            reconnect_for_ms: config.oracle.reconnect_for_ms,
            ..perc_oracle::ClientConfig::default()
        };
        return Ok(Arc::new(RemoteOracle::connect(&config.oracle.server, client).await?));
    }
    if config.store.backend == Backend::Bigtable {
        anyhow::bail!(
            "store.backend = \"bigtable\" is shared by many processes, which need one timestamp \
             oracle: run `perc oracle --listen HOST:PORT` and set oracle.server to it"
        );
    }
    Ok(Arc::new(LocalOracle::open(store.clone(), config.txn.oracle_block).await?))
}

/// Responses a replay loads per transaction batch.
const REPLAY_BATCH: usize = 256;

/// The crawl's scope from the configured and the given prefixes, and the seeds outside it
/// (fetched, but their links not followed). An error names a prefix that is not an absolute
/// http(s) URL, or says that no seed is inside the prefixes.
pub fn crawl_scope(
    config: &Config,
    seeds: &[Url],
    prefixes: &[String],
) -> Result<(CrawlScope, Vec<Url>)> {
    let mut all_prefixes = config.crawl.prefixes.clone();
    all_prefixes.extend(prefixes.iter().cloned());
    let scope = perc_crawl::Scope::new(seeds, &all_prefixes).map_err(|e| anyhow!(e))?;
    let outside: Vec<Url> = seeds.iter().filter(|s| !scope.contains(s)).cloned().collect();
    if !all_prefixes.is_empty() && outside.len() == seeds.len() {
        anyhow::bail!(
            "no seed is inside the scope prefixes ({}): nothing could be crawled",
            all_prefixes.join(", ")
        );
    }
    let scope = CrawlScope {
        seeds: seeds.iter().map(Url::to_string).collect(),
        prefixes: all_prefixes,
        max_depth: config.crawl.max_depth,
        max_redirects: config.crawl.max_redirects,
    };
    Ok((scope, outside))
}

/// What a replay did.
#[derive(Clone, Debug)]
pub struct Replayed {
    /// Response records loaded.
    pub loaded: usize,
    /// Records that could not be read, each named by file and offset.
    pub issues: Vec<WarcIssue>,
    pub run: RunSummary,
    /// Pages in the export afterwards.
    pub pages: usize,
}

/// What a refetch did.
#[derive(Clone, Debug)]
pub struct Refetched {
    /// Known URLs whose fetch was asked for again.
    pub refetched: usize,
    /// URLs not known to the index: not fetched.
    pub unknown: Vec<Url>,
    pub run: RunSummary,
    /// Pages in the export afterwards.
    pub pages: usize,
}

/// What `perc status` shows.
#[derive(Clone, Debug)]
pub struct Status {
    pub report: Report,
    pub pending: usize,
    /// Every run's counters so far, per observer.
    pub counters: StoredStats,
    pub parked: Vec<FailedEntry>,
}

impl Pipeline {
    /// Starts (or restarts) a crawl from `seeds` within `scope` and runs it to quiescence;
    /// returns the run's summary and the index's report (its `seeds_answered` counts these
    /// seeds).
    pub async fn crawl(
        &self,
        seeds: &[Url],
        scope: &CrawlScope,
        stop: &CancellationToken,
    ) -> Result<(RunSummary, Report)> {
        perc_observers::seed(&self.client, seeds, scope).await?;
        let run = self.run_until_quiet("crawl", stop).await?;
        Ok((run, perc_observers::report(&self.client, seeds).await?))
    }

    /// Loads every response record of `files` and runs the observers to quiescence. Records
    /// stream from a reading thread in batches: memory stays flat in the size of the files.
    pub async fn replay(&self, files: &[PathBuf], stop: &CancellationToken) -> Result<Replayed> {
        let mut issues = Vec::new();
        let mut loaded = 0;
        for f in files {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<Recorded>>(4);
            let (path, max) = (f.clone(), self.config.crawl.body_bytes_max);
            let reading = tokio::task::spawn_blocking(move || {
                let mut batch = Vec::with_capacity(REPLAY_BATCH);
                let issues = perc_crawl::warc::read_each(&path, max, |r| {
                    batch.push(r);
                    if batch.len() == REPLAY_BATCH {
                        let _ = tx.blocking_send(std::mem::take(&mut batch));
                    }
                })?;
                if !batch.is_empty() {
                    let _ = tx.blocking_send(batch);
                }
                Ok::<_, std::io::Error>(issues)
            });
            loop {
                let batch = tokio::select! {
                    b = rx.recv() => b,
                    _ = stop.cancelled() => return Err(Interrupted.into()),
                };
                let Some(batch) = batch else { break };
                loaded += batch.len();
                perc_observers::load_recorded(&self.client, &batch).await?;
            }
            issues.extend(reading.await??);
        }
        let run = self.run_until_quiet("replay", stop).await?;
        let pages = perc_observers::page_count(&self.client).await?;
        Ok(Replayed { loaded, issues, run, pages })
    }

    /// Fetches `targets` again (all known URLs when `None`) and runs the observers to
    /// quiescence.
    pub async fn refetch(
        &self,
        targets: Option<&[Url]>,
        stop: &CancellationToken,
    ) -> Result<Refetched> {
        let all;
        let targets = match targets {
            Some(t) => t,
            None => {
                all = perc_observers::known_urls(&self.client).await?;
                &all
            }
        };
        let unknown = perc_observers::refetch(&self.client, targets).await?;
        let run = self.run_until_quiet("refetch", stop).await?;
        let pages = perc_observers::page_count(&self.client).await?;
        Ok(Refetched { refetched: targets.len() - unknown.len(), unknown, run, pages })
    }

    /// The canonical URL of a page, a duplicate or an alias; `Err` says what the URL is
    /// instead.
    pub async fn canonical(&self, url: &Url) -> Result<Result<String, String>> {
        Ok(perc_observers::canonical(&self.client, url).await?)
    }

    /// What the index knows of one URL.
    pub async fn page(&self, url: &Url) -> Result<perc_observers::PageInfo> {
        Ok(perc_observers::page_info(&self.client, url).await?)
    }

    /// The export, one line at a time in URL order; returns the number of lines.
    pub async fn export(
        &self,
        mut each: impl FnMut(perc_observers::model::ExportLine) -> Result<()>,
    ) -> Result<usize> {
        let mut n = 0;
        perc_observers::export_each(&self.client, |l| {
            n += 1;
            each(l)
        })
        .await?;
        Ok(n)
    }

    /// Runs the observers until `stop` (`perc worker`), then saves the counters.
    pub async fn work(&self, stop: &CancellationToken) -> Result<()> {
        let workers = Workers::start(self.engine.clone(), &tokio::runtime::Handle::current());
        stop.cancelled().await;
        workers.shutdown().await;
        self.save_stats().await
    }

    /// This process's worker id, as other processes see it in locks and leases.
    pub fn worker_id(&self) -> perc_txn::WorkerId {
        self.engine.client().worker()
    }

    /// The index's report, the pending notifications, the stored counters and the parked
    /// notifications.
    pub async fn status(&self) -> Result<Status> {
        let report = perc_observers::report(&self.client, &[]).await?;
        let pending = self.engine.pending_count(1_000_000).await?;
        let t = self.client.begin().await?;
        let counters = decode_stats(t.get(STATS_ROW, STATS_COLUMN).await?)?;
        let parked = self.engine.failed_list().await?;
        Ok(Status { report, pending, counters, parked })
    }
}

/// Where the counters of every run so far are kept, per observer:
/// [runs, commits, skipped, conflicts, failures, parked].
const STATS_ROW: &[u8] = b"m:stats";
const STATS_COLUMN: &[u8] = b"stats:observers";
pub type StoredStats = std::collections::BTreeMap<String, [u64; 6]>;

fn decode_stats(raw: Option<Bytes>) -> Result<StoredStats> {
    match raw {
        Some(v) => serde_json::from_slice(&v).context("the stored observer counters are corrupt"),
        None => Ok(StoredStats::default()),
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RunSummary {
    pub fetched: u64,
    pub parsed: u64,
    pub failures: u64,
    pub seconds: f64,
}

fn summarize(stats: &[ObserverStats]) -> RunSummary {
    let get = |name: &str| stats.iter().find(|s| s.name == name);
    RunSummary {
        fetched: get("fetch").map_or(0, |s| s.commits),
        parsed: get("parse").map_or(0, |s| s.commits),
        failures: stats.iter().map(|s| s.failures).sum(),
        seconds: 0.0,
    }
}
