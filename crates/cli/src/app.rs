//! One process's perc: the store, the oracle, the observers and the workers, assembled from
//! the configuration, and the run-until-quiescent loop with its progress display.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use perc_crawl::warc::Recorder;
use perc_crawl::{
    Crawler, FetchError, FetchLimits, Fetched, Fetcher, HttpFetcher, Polite, PolitenessConfig,
    Response, RobotsCache, Source,
};
use perc_notify::{client_for, Engine, ObserverStats, Workers};
use perc_oracle::{LocalOracle, Oracle};
use perc_store::{SledOptions, SledStore, Store};
use perc_txn::{Client, Clock, SystemClock, TxnConfig};
use url::Url;

use crate::config::Config;

pub struct App {
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

struct Offline;

#[async_trait]
impl Source for Offline {
    async fn get(&self, _url: &Url) -> Fetched {
        Fetched::Failed("not fetched: this run only replays recorded responses".into())
    }
}

/// A source with a budget: after `max` fetches in this run, the rest are recorded as not
/// fetched.
struct Budget {
    inner: Arc<dyn Source>,
    left: std::sync::atomic::AtomicU64,
    max: u64,
}

#[async_trait]
impl Source for Budget {
    async fn get(&self, url: &Url) -> Fetched {
        use std::sync::atomic::Ordering;
        let granted = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !granted {
            return Fetched::Failed(format!(
                "not fetched: this run reached crawl.max_pages = {}",
                self.max
            ));
        }
        self.inner.get(url).await
    }
}

/// A fetcher that writes every response it gets into a WARC.
struct Recording<F> {
    inner: F,
    recorder: Mutex<Recorder>,
    user_agent: String,
}

#[async_trait]
impl<F: Fetcher> Fetcher for Recording<F> {
    async fn fetch(&self, url: &Url) -> Result<Response, FetchError> {
        let r = self.inner.fetch(url).await?;
        let mut rec = self.recorder.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = rec.record(url, &self.user_agent, &r) {
            tracing::error!(file = %rec.path().display(), error = %e, "cannot write the WARC");
        }
        Ok(r)
    }
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
        Some(recorder) => Arc::new(Recording {
            inner: http,
            recorder: Mutex::new(recorder),
            user_agent: c.user_agent.clone(),
        }),
        None => Arc::new(http),
    };
    let polite = Arc::new(Polite::new(fetcher, politeness));
    let robots =
        RobotsCache::new(polite.clone(), c.user_agent.clone(), c.robots_ttl_ms, c.robots_retry_ms);
    let crawler: Arc<dyn Source> = Arc::new(Crawler::new(polite, robots));
    if c.max_pages == 0 {
        return Ok(crawler);
    }
    let left = std::sync::atomic::AtomicU64::new(c.max_pages);
    Ok(Arc::new(Budget { inner: crawler, left, max: c.max_pages }))
}

impl App {
    pub async fn open(config: Config, fetching: Fetching) -> Result<App> {
        let data = Path::new(&config.store.data);
        std::fs::create_dir_all(data)
            .with_context(|| format!("cannot create the data directory {}", data.display()))?;
        let sled = SledStore::open(
            data,
            perc_notify::schema(),
            &SledOptions { cache_bytes: config.store.cache_bytes, flush_every_ms: 500 },
        )
        .map_err(|e| anyhow!("{e} (is another perc process using {}?)", data.display()))?;
        let store: Arc<dyn Store> = Arc::new(sled);
        let oracle: Arc<dyn Oracle> =
            Arc::new(LocalOracle::open(store.clone(), config.txn.oracle_block).await?);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
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
        let client = client_for(store.clone(), oracle, clock, txn, registry.clone()).await?;
        let engine = Arc::new(Engine::new(engine_client, registry, config.workers.clone()));
        engine.load_parked().await?;
        Ok(App { store, client, engine, config })
    }

    /// Runs the workers until no notification is pending; shows progress on a terminal.
    pub async fn run_until_quiet(&self, what: &str) -> Result<RunSummary> {
        let started = Instant::now();
        let workers = Workers::start(self.engine.clone(), &tokio::runtime::Handle::current());
        let bar = if std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new_spinner();
            b.enable_steady_tick(Duration::from_millis(120));
            Some(b)
        } else {
            None
        };
        {
            let wait = workers.wait();
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    r = &mut wait => { r?; break; }
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
        workers.shutdown().await;
        let summary = summarize(&self.engine.stats());
        self.save_stats().await?;
        Ok(RunSummary { seconds: started.elapsed().as_secs_f64(), ..summary })
    }

    /// Adds this run's counters to the ones stored (shown by `perc status`).
    async fn save_stats(&self) -> Result<()> {
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
            serde_json::to_vec(&all)?,
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

/// Where the counters of every run so far are kept, per observer:
/// [runs, commits, skipped, conflicts, failures, parked].
pub const STATS_ROW: &[u8] = b"m:stats";
pub const STATS_COLUMN: &[u8] = b"stats:observers";
pub type StoredStats = std::collections::BTreeMap<String, [u64; 6]>;

pub fn decode_stats(raw: Option<Bytes>) -> Result<StoredStats> {
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
