//! Assembling a [`Pipeline`]: the configured store (sled, Bigtable or memory), the timestamp
//! oracle, the fetching source, the two transaction clients (the loaders' and queries' one and
//! the observers' one), the observer registry and the notification engine. The CLI
//! calls [`Pipeline::open`]; benchmarks and tests use [`Builder`] to put in a store, an oracle,
//! a source or a clock of their own.

use std::path::Path;
use std::sync::Arc;

use perc_crawl::warc::Recorder;
use perc_crawl::{
    Budget, Crawler, FetchLimits, Fetcher, HttpFetcher, Offline, PolitenessConfig, Recording,
    RobotsCache, Source,
};
use perc_notify::{client_for, Engine, RowLease, StoreLease};
use perc_oracle::{LocalOracle, Oracle, RemoteOracle};
use perc_store::{Coalesced, MemStore, SledOptions, SledStore, Store, StoreError};
use perc_txn::{Clock, SystemClock, TxnConfig};

use crate::config::{Backend, Config, MEMORY};
use crate::error::{PipelineError, Result};
use crate::Pipeline;

/// The politeness layer of a live pipeline.
pub(crate) type Polite = perc_crawl::Polite<Arc<dyn Fetcher>>;

/// A source, and its politeness layer when it fetches.
type Sourced = (Arc<dyn Source>, Option<Arc<Polite>>);

/// Where the fetch observer gets pages.
pub enum Fetching {
    /// The live web (robots.txt, politeness), optionally recording a WARC.
    Live { warc_out: Option<Recorder> },
    /// Nothing is fetched: a URL not already loaded is recorded as not available.
    Offline,
}

/// Whether opening may create the store. Only a crawl or a replay should: for any other
/// command a missing store is a mistake (a typo in `--data`), not an empty index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Create {
    IfMissing,
    /// A missing store is [`PipelineError::NoStore`]. A shared Bigtable table always counts
    /// as existing; a memory store never does (it is new and empty at every open).
    No,
}

/// A [`Pipeline`] with parts put in by the caller; the rest comes from the configuration.
pub struct Builder {
    config: Config,
    fetching: Fetching,
    create: Create,
    store: Option<Arc<dyn Store>>,
    oracle: Option<Arc<dyn Oracle>>,
    source: Option<Arc<dyn Source>>,
    clock: Option<Arc<dyn Clock>>,
    kind: &'static str,
}

impl Pipeline {
    /// Opens the configured store (creating it only with [`Create::IfMissing`]) and
    /// assembles the process around it.
    pub async fn open(config: Config, fetching: Fetching, create: Create) -> Result<Pipeline> {
        Pipeline::builder(config).fetching(fetching).create(create).open().await
    }

    pub fn builder(config: Config) -> Builder {
        Builder {
            config,
            fetching: Fetching::Offline,
            create: Create::IfMissing,
            store: None,
            oracle: None,
            source: None,
            clock: None,
            kind: "",
        }
    }
}

impl Builder {
    pub fn fetching(mut self, fetching: Fetching) -> Builder {
        self.fetching = fetching;
        self
    }

    pub fn create(mut self, create: Create) -> Builder {
        self.create = create;
        self
    }

    /// This store instead of the configured one (a wrapped or shared one); the configured
    /// backend still decides how processes share it (leases, forgetting ended workers).
    pub fn store(mut self, store: Arc<dyn Store>) -> Builder {
        self.store = Some(store);
        self
    }

    /// This oracle instead of the configured one.
    pub fn oracle(mut self, oracle: Arc<dyn Oracle>) -> Builder {
        self.oracle = Some(oracle);
        self
    }

    /// Pages come from `source` instead of from [`Fetching`].
    pub fn source(mut self, source: Arc<dyn Source>) -> Builder {
        self.source = Some(source);
        self
    }

    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Builder {
        self.clock = Some(clock);
        self
    }

    /// What this process is, in a word ("crawl", "worker", "serve"): the liveness registry
    /// publishes it, and `perc status` names each process by it.
    pub fn kind(mut self, kind: &'static str) -> Builder {
        self.kind = kind;
        self
    }

    pub async fn open(self) -> Result<Pipeline> {
        let config = self.config;
        if config.store.backend != Backend::Bigtable && config.workers.scanners == 0 {
            return Err(PipelineError::Setup(
                "workers.scanners = 0 leaves nobody to run the observers of a store only this \
                 process uses: it must be at least 1 (0 is for processes that only load a \
                 shared Bigtable store)"
                    .into(),
            ));
        }
        let store = match self.store {
            Some(s) => s,
            None => open_store(&config, self.create).await?,
        };
        // The calls that reach the backend (RPCs on Bigtable), counted for the metrics.
        let calls = Arc::new(perc_store::Counted::new(store));
        // Concurrent runs' small unconditional writes (notify cells, notification clears,
        // secondary commits) share calls: one RPC for many on Bigtable.
        let store: Arc<dyn Store> = Arc::new(Coalesced::with_lanes(
            calls.clone() as Arc<dyn Store>,
            config.store.write_lanes,
        ));
        let oracle = match self.oracle {
            Some(o) => o,
            None => open_oracle(&config, &store).await?,
        };
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        if config.store.backend == Backend::Sled {
            forget_ended_processes(&store, &clock).await?;
        }
        let (source, polite) = match self.source {
            Some(s) => (s, None),
            None => source(&config, self.fetching)?,
        };
        let registry = Arc::new(
            perc_observers::registry_with(
                source.clone(),
                config.recrawl.schedule()?,
                config.index.indegree_fold_max as usize,
            )
            .map_err(|e| PipelineError::Setup(e.to_string()))?,
        );
        let txn = TxnConfig {
            lock_ttl_ms: config.txn.lock_ttl_ms,
            liveness_ttl_ms: config.txn.liveness_ttl_ms,
            ..TxnConfig::default()
        };
        // The observers' runs flush at their commit point as the loaders' commits do (see
        // the commit in perc-txn): a run's notification is cleared after its commit, and sled
        // may recover a later write without an earlier one it did not flush.
        let engine_client =
            client_for(store.clone(), oracle.clone(), clock.clone(), txn.clone(), registry.clone())
                .await?;
        let client =
            client_for(store.clone(), oracle, clock.clone(), txn, registry.clone()).await?;
        // One process, two clients: the registry shows them as the engine's process.
        client.set_process(engine_client.id());
        for c in [&client, &engine_client] {
            c.set_kind(perc_txn::ProcessKind::new(self.kind));
        }
        client.heartbeat().await?;
        upgrade(&client).await?;
        perc_observers::cluster::keep_rule(&client, config.index.canonical_by).await?;
        // Many processes share a Bigtable table: they lease notifications in the store.
        let lease: Arc<dyn RowLease> = match config.store.backend {
            Backend::Sled | Backend::Memory => Arc::new(perc_notify::LocalLease::default()),
            Backend::Bigtable => Arc::new(StoreLease::new(
                store.clone(),
                clock.clone(),
                config.workers.lease_ttl_ms,
                engine_client.id(),
                engine_client.liveness().clone(),
            )),
        };
        let engine =
            Arc::new(Engine::with_lease(engine_client, registry, config.workers.clone(), lease));
        engine.load_parked().await?;
        Ok(Pipeline {
            store,
            calls,
            client,
            engine,
            config,
            polite,
            source,
            saved: Default::default(),
            hosts_saved: Default::default(),
            queue_checked: Default::default(),
            pace: Default::default(),
        })
    }
}

/// The embedded store admits one process: every worker registered in it belongs to a process
/// that ended (killed, most likely), and its locks may go at once.
async fn forget_ended_processes(store: &Arc<dyn Store>, clock: &Arc<dyn Clock>) -> Result<()> {
    let gone = perc_txn::Liveness::new(store.clone(), clock.clone(), 0).forget_all().await?;
    if gone > 0 {
        tracing::info!(workers = gone, "cleared the liveness of workers of an ended process");
    }
    Ok(())
}

/// A store an earlier perc wrote is brought to this one's layout before any run.
async fn upgrade(client: &perc_txn::Client) -> Result<()> {
    let upgraded = perc_observers::upgrade(client).await?;
    if upgraded.moved > 0 {
        tracing::info!(
            from = upgraded.from,
            to = perc_observers::LAYOUT,
            urls = upgraded.moved,
            "upgraded the store's layout"
        );
    }
    Ok(())
}

/// The fetching source: the crawler (politeness, robots.txt, a page budget, a recording), or
/// nothing; and the politeness layer, which counts the requests to each host.
fn source(config: &Config, fetching: Fetching) -> Result<Sourced> {
    let Fetching::Live { warc_out } = fetching else { return Ok((Arc::new(Offline), None)) };
    let c = &config.crawl;
    let limits = FetchLimits {
        connect_timeout_ms: c.connect_timeout_ms,
        total_timeout_ms: c.total_timeout_ms,
        body_bytes_max: c.body_bytes_max,
        user_agent: c.user_agent.clone(),
    };
    let politeness = PolitenessConfig {
        concurrency_max: c.concurrency_max,
        per_host: c.per_host,
        host_delay_ms: c.host_delay_ms,
        delay_cap_ms: c.delay_cap_ms,
    };
    let http = HttpFetcher::new(limits)
        .map_err(|e| PipelineError::Setup(format!("cannot set up HTTP: {e}")))?;
    let fetcher: Arc<dyn Fetcher> = match warc_out {
        Some(recorder) => Arc::new(Recording::new(http, recorder, c.user_agent.clone())),
        None => Arc::new(http),
    };
    let polite = Arc::new(perc_crawl::Polite::new(fetcher, politeness));
    let robots = RobotsCache::new(
        polite.clone(),
        c.user_agent.clone(),
        c.robots_ttl_ms,
        c.robots_retry_ms,
        c.robots_attempts,
        c.robots_give_up_ms,
    );
    let crawler: Arc<dyn Source> = Arc::new(Crawler::new(polite.clone(), robots));
    if c.max_pages == 0 {
        return Ok((crawler, Some(polite)));
    }
    Ok((Arc::new(Budget::new(crawler, c.max_pages)), Some(polite)))
}

/// sled's options as the configuration sets them.
pub fn sled_options(store: &crate::config::Store) -> SledOptions {
    SledOptions {
        cache_bytes: store.cache_bytes,
        zstd_level: i32::try_from(store.zstd_level).unwrap_or(0),
        ..SledOptions::default()
    }
}

/// The configured store: sled in `store.data`, the Bigtable table, or a new memory store.
pub async fn open_store(config: &Config, create: Create) -> Result<Arc<dyn Store>> {
    match config.store.backend {
        Backend::Sled => {
            let data = Path::new(&config.store.data);
            if create == Create::No && !SledStore::exists(data) {
                return Err(PipelineError::NoStore { dir: config.store.data.clone() });
            }
            std::fs::create_dir_all(data).map_err(PipelineError::io(format!(
                "cannot create the data directory {}",
                data.display()
            )))?;
            let sled = SledStore::open(data, perc_notify::schema(), &sled_options(&config.store))
                .map_err(|e| match e {
                e @ StoreError::OutOfSpace { .. } => e.into(),
                e @ StoreError::InUse { .. } => PipelineError::InUse(format!(
                    "{e} (is another perc process using {}?)",
                    data.display()
                )),
                e => PipelineError::Setup(format!(
                    "{e} (is another perc process using {}?)",
                    data.display()
                )),
            })?;
            Ok(Arc::new(sled))
        }
        // A memory store begins empty: only a command that fills it may open one.
        Backend::Memory if create == Create::No => {
            Err(PipelineError::NoStore { dir: MEMORY.into() })
        }
        Backend::Memory => Ok(Arc::new(MemStore::new(perc_notify::schema()))),
        Backend::Bigtable => open_bigtable(config).await,
    }
}

#[cfg(feature = "bigtable")]
async fn open_bigtable(config: &Config) -> Result<Arc<dyn Store>> {
    let b = &config.bigtable;
    if b.emulator.is_empty() && (b.project.is_empty() || b.instance.is_empty()) {
        return Err(PipelineError::Setup(
            "store.backend = \"bigtable\" needs bigtable.project and bigtable.instance \
             (or bigtable.emulator for a local emulator)"
                .into(),
        ));
    }
    let bt = perc_bigtable::BigtableConfig {
        project: if b.project.is_empty() { "perc".into() } else { b.project.clone() },
        instance: if b.instance.is_empty() { "perc".into() } else { b.instance.clone() },
        table: b.table.clone(),
        emulator: (!b.emulator.is_empty()).then(|| b.emulator.clone()),
        channels: b.channels,
        timeout_ms: b.timeout_ms,
    };
    let what = match &bt.emulator {
        Some(addr) => format!("the Bigtable emulator at {addr}"),
        None => format!("Cloud Bigtable ({}/{})", bt.project, bt.instance),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(b.connect_for_ms);
    let mut pause_ms = 50;
    let mut said = false;
    loop {
        match perc_bigtable::BigtableStore::open(&bt, perc_notify::schema()).await {
            Ok(store) => {
                if said {
                    tracing::info!("reached {what}");
                }
                return Ok(Arc::new(store));
            }
            Err(perc_bigtable::Error::Unreachable(e)) if std::time::Instant::now() < deadline => {
                if !said {
                    tracing::warn!(
                        "waiting for {what} ({e}); trying again for up to {} s \
                         (bigtable.connect_for_ms)",
                        b.connect_for_ms / 1000
                    );
                    said = true;
                }
                tokio::time::sleep(std::time::Duration::from_millis(pause_ms)).await;
                pause_ms = (pause_ms * 2).min(1_000);
            }
            Err(e @ perc_bigtable::Error::Unreachable(_)) => {
                return Err(PipelineError::Unavailable(format!(
                    "cannot open the Bigtable table {}: {e} (waited {} s: \
                     bigtable.connect_for_ms)",
                    b.table,
                    b.connect_for_ms / 1000
                )))
            }
            Err(e) => {
                return Err(PipelineError::Setup(format!(
                    "cannot open the Bigtable table {}: {e}",
                    b.table
                )))
            }
        }
    }
}

#[cfg(not(feature = "bigtable"))]
async fn open_bigtable(_config: &Config) -> Result<Arc<dyn Store>> {
    Err(PipelineError::Setup(
        "store.backend = \"bigtable\", but this perc was built without Bigtable support: \
         build it with `cargo build --release -p perc-cli --features bigtable`"
            .into(),
    ))
}

/// The timestamp oracle that `perc oracle` serves to every process sharing the configured
/// store: a [`LocalOracle`] keeping its high-water mark in that store.
pub async fn shared_oracle(config: &Config) -> Result<Arc<LocalOracle>> {
    let store = open_store(config, Create::IfMissing).await?;
    Ok(Arc::new(LocalOracle::open(store, config.oracle.block).await?))
}

/// The configured oracle: a `perc oracle` server, or one in this process (sled and memory
/// only: a shared store needs a single oracle for every process).
async fn open_oracle(config: &Config, store: &Arc<dyn Store>) -> Result<Arc<dyn Oracle>> {
    if !config.oracle.server.is_empty() {
        let client = perc_oracle::ClientConfig {
            reconnect_for_ms: config.oracle.reconnect_for_ms,
            ..perc_oracle::ClientConfig::default()
        };
        return Ok(Arc::new(RemoteOracle::connect(&config.oracle.server, client).await?));
    }
    if config.store.backend == Backend::Bigtable {
        return Err(PipelineError::Setup(
            "store.backend = \"bigtable\" is shared by many processes, which need one timestamp \
             oracle: run `perc oracle --listen HOST:PORT` and set oracle.server to it"
                .into(),
        ));
    }
    Ok(Arc::new(LocalOracle::open(store.clone(), config.oracle.block).await?))
}
