//! perc's front door: one process's perc (the store, the oracle, the observers and the
//! workers) assembled from a validated [`Config`], and the run-until-quiescent loop with its
//! progress display. The binary, the benchmarks and the tests open a [`Pipeline`] rather than
//! wiring the layers themselves.
//!
//! Here: the verbs (`crawl`, `replay`, `refetch`, `canonical`, `page`, `export`, `status`,
//! `work`, `run_until_quiet`, `wait`, `close`); in [`config`] the configuration and its
//! checks; in `open` the assembly ([`Pipeline::open`], [`Builder`]); in `error` [`PipelineError`]; in
//! [`diff`] the semantic diff of two exports (`perc diff`, `perc replay --expect`).

mod compact;
pub mod config;
pub mod diff;
mod error;
mod open;
pub mod status_text;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use perc_crawl::warc::{Recorded, WarcIssue};
use perc_notify::{Engine, FailedEntry, ObserverStats, Workers};
use perc_observers::IndexError;
use perc_store::Store;
use perc_txn::Client;
use tokio_util::sync::CancellationToken;
use url::Url;

pub use crate::compact::{compact, Compaction};
pub use crate::config::{Backend, Config, ConfigError, MEMORY};
pub use crate::error::{PipelineError, Result};
pub use crate::open::{open_store, shared_oracle, sled_options, Builder, Create, Fetching};
/// What a process around the pipeline needs of the layers below it: the URL rules a seed or
/// a request's URL is checked by, the WARC recorder a crawl writes through, and the server
/// of the timestamp oracle (`perc oracle`).
pub use perc_crawl::urls::had_userinfo;
pub use perc_crawl::{normalize, warc::Recorder};
/// What the verbs hand back, from the layer that defines them.
pub use perc_observers::model::{CrawlScope, ExportLine};
pub use perc_observers::search::{Queued, SearchDoc};
pub use perc_observers::{PageInfo, Report};
pub use perc_oracle::{serve as serve_oracle, OracleError};

/// One process's indexing system over one store: what [`Pipeline::open`] assembles, and
/// the verbs the binary, the server, the benchmarks and the tests call. Its parts are
/// reached through [`Pipeline::client`], [`Pipeline::engine`] and [`Pipeline::store`] by the
/// layers that work below the verbs (the benchmarks, the tests).
pub struct Pipeline {
    store: Arc<dyn Store>,
    /// The calls that reached the store backend from this process, by kind.
    calls: Arc<perc_store::Counted<Arc<dyn Store>>>,
    client: Client,
    engine: Arc<Engine>,
    config: Config,
    /// The live fetcher's politeness layer, which counts requests per host (none offline).
    polite: Option<Arc<open::Polite>>,
    /// Where pages come from (the fetch observer's source): sitemaps are read through it.
    source: Arc<dyn perc_crawl::Source>,
    /// This process's counters as far as they have been added to the stored ones.
    saved: std::sync::Mutex<StoredStats>,
    hosts_saved: std::sync::Mutex<StoredHosts>,
    /// When the search queue's size was last checked ([`Pipeline::bound_search_queue`]).
    queue_checked: std::sync::Mutex<Option<Instant>>,
}

/// How often a process that runs observers looks whether an error stopped them.
const FATAL_CHECK_EVERY: Duration = Duration::from_millis(250);

/// How often a running process checks the search queue's size.
const QUEUE_CHECK_EVERY: Duration = Duration::from_secs(60);

impl Pipeline {
    /// Runs the workers until no notification is pending; shows progress on a terminal.
    /// When `stop` is cancelled (SIGINT, SIGTERM) it stops taking new work, lets the runs in
    /// flight finish, saves the counters and returns [`PipelineError::Interrupted`].
    pub async fn run_until_quiet(
        &self,
        what: &str,
        stop: &CancellationToken,
    ) -> Result<RunSummary> {
        // A loader whose work other processes do waits on them.
        self.run_quiet(what, self.config.workers.scanners == 0, stop).await
    }

    /// `perc wait`: joins in the work until nothing is pending, and (off a terminal) says the
    /// backlog as it waits, as a loader that only watches does.
    pub async fn wait(&self, stop: &CancellationToken) -> Result<RunSummary> {
        self.run_quiet("wait", true, stop).await
    }

    /// [`Pipeline::run_until_quiet`]; `watching`: off a terminal, print the backlog every
    /// [`BACKLOG_LINE_EVERY`].
    async fn run_quiet(
        &self,
        what: &str,
        watching: bool,
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
        let mut nobody = Nobody::default();
        let mut last = Reported::new(&self.engine);
        let mut backlog_said = Instant::now();
        // The progress lines are written beside the wait, not in a branch of a select over
        // it: a report awaits the engine's clear lock, which the wait may hold or be queued
        // for, and a wait left unpolled meanwhile would never let it go (see [`alongside`]).
        let ticking = async {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                if self.config.workers.scanners == 0 {
                    self.check_somebody_works(&mut nobody).await;
                }
                let every = self.config.workers.report_ms;
                if every > 0 && last.at.elapsed() >= Duration::from_millis(every) {
                    self.report(&mut last).await;
                }
                if let Some(b) = &bar {
                    let s = summarize(&self.engine.stats());
                    let backlog = self.backlog().await;
                    let rate = s.fetched as f64 / started.elapsed().as_secs_f64().max(0.001);
                    b.set_message(format!(
                        "{what}: {backlog}; here {} fetched, {} parsed, {rate:.1} pages/s",
                        s.fetched, s.parsed
                    ));
                } else if watching && backlog_said.elapsed() >= BACKLOG_LINE_EVERY {
                    // Off a terminal, a process waiting on others says what it waits for now
                    // and then (a closed stderr is no reason to stop).
                    backlog_said = Instant::now();
                    let backlog = self.backlog().await;
                    let _ = writeln!(std::io::stderr(), "perc {what}: {backlog}");
                }
            }
        };
        let waited = alongside(
            async {
                tokio::select! {
                    r = workers.wait() => Some(r),
                    _ = stop.cancelled() => None,
                }
            },
            ticking,
        )
        .await;
        let (interrupted, failed) = match waited {
            Some(r) => (false, r.err()),
            None => (true, None),
        };
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
            return Err(PipelineError::Interrupted);
        }
        self.bound_search_queue(true).await;
        Ok(RunSummary { seconds: started.elapsed().as_secs_f64(), ..summary })
    }

    /// For a process that only watches (`workers.scanners = 0`): says so, once, when
    /// notifications wait and no process that runs observers has been alive for
    /// [`NOBODY_SAID_AFTER`], and again when one is.
    async fn check_somebody_works(&self, nobody: &mut Nobody) {
        let now = Instant::now();
        if nobody.checked.is_some_and(|at| now.duration_since(at) < Duration::from_secs(1)) {
            return;
        }
        nobody.checked = Some(now);
        let working = match self.client.liveness().workers().await {
            Ok(all) => all.iter().filter(|(w, alive)| *alive && w.about.scanners > 0).count(),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the liveness registry");
                return;
            }
        };
        if working > 0 {
            if nobody.said {
                tracing::warn!("{working} worker(s) alive now; waiting for them to finish");
            }
            *nobody = Nobody { checked: nobody.checked, ..Nobody::default() };
            return;
        }
        let since = *nobody.since.get_or_insert(now);
        if !nobody.said && now.duration_since(since) >= NOBODY_SAID_AFTER {
            let pending = self.engine.has_pending().await.unwrap_or(true);
            if pending {
                tracing::warn!(
                    "notifications are waiting, but no worker is alive on this store, and this \
                     process only watches (workers.scanners = 0): start one with `perc \
                     --config FILE worker`, or run this command without workers.scanners = 0 \
                     to do the work here"
                );
                nobody.said = true;
            }
        }
    }

    /// Adds this process's counters, as far as not added before, to the ones stored (shown
    /// by `perc status`). Processes sharing a store add theirs concurrently: a conflict is
    /// retried.
    pub async fn save_stats(&self) -> Result<()> {
        let u = self.unsaved();
        if u.delta.is_empty() && u.hosts_delta.is_empty() {
            return Ok(());
        }
        self.client.retrying(|_| self.try_save_stats(&u.delta, &u.hosts_delta)).await?;
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = u.now;
        *self.hosts_saved.lock().unwrap_or_else(|e| e.into_inner()) = u.hosts_now;
        Ok(())
    }

    /// This process's counters now, and what of them is not added to the stored ones yet.
    fn unsaved(&self) -> Unsaved {
        let now: StoredStats = self
            .engine
            .stats()
            .into_iter()
            .map(|s| (s.name, [s.runs, s.commits, s.skipped, s.conflicts, s.failures, s.parked]))
            .collect();
        let delta: StoredStats = {
            let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
            now.iter()
                .map(|(name, counts)| {
                    let before = saved.get(name).copied().unwrap_or_default();
                    (name.clone(), std::array::from_fn(|i| counts[i].saturating_sub(before[i])))
                })
                .filter(|(_, d): &(String, [u64; 6])| d.iter().any(|n| *n > 0))
                .collect()
        };
        let hosts_now: StoredHosts = self.polite.as_ref().map_or_else(Default::default, |p| {
            p.host_counts()
                .into_iter()
                .map(|(host, c)| (host, [c.requests, c.failed, c.first_ms, c.last_ms]))
                .collect()
        });
        let hosts_delta: StoredHosts = {
            let saved = self.hosts_saved.lock().unwrap_or_else(|e| e.into_inner());
            hosts_now
                .iter()
                .filter(|(host, c)| saved.get(*host).is_none_or(|s| s[0] < c[0]))
                .map(|(host, c)| {
                    let s = saved.get(host).copied().unwrap_or_default();
                    (host.clone(), [c[0] - s[0], c[1] - s[1], c[2], c[3]])
                })
                .collect()
        };
        Unsaved { now, delta, hosts_now, hosts_delta }
    }

    async fn try_save_stats(
        &self,
        delta: &StoredStats,
        hosts_delta: &StoredHosts,
    ) -> Result<(), perc_txn::TxnError> {
        let mut t = self.client.begin().await?;
        // A counter record that cannot be read starts over rather than stopping the run.
        let raw = t.get(STATS_ROW, STATS_COLUMN).await?;
        let mut all: StoredStats = decode_stored(raw, OBSERVER_COUNTERS).unwrap_or_default();
        add_stats(&mut all, delta);
        if !hosts_delta.is_empty() {
            let raw = t.get(STATS_ROW, HOSTS_COLUMN).await?;
            let mut hosts: StoredHosts = decode_stored(raw, HOST_COUNTERS).unwrap_or_default();
            add_hosts(&mut hosts, hosts_delta);
            t.set(
                Bytes::from_static(STATS_ROW),
                Bytes::from_static(HOSTS_COLUMN),
                serde_json::to_vec(&hosts).expect("serializable"),
            );
        }
        t.set(
            Bytes::from_static(STATS_ROW),
            Bytes::from_static(STATS_COLUMN),
            serde_json::to_vec(&all).expect("serializable"),
        );
        t.commit().await?;
        Ok(())
    }

    /// One pass of the collector over the whole store, as the workers make one every
    /// `workers.gc_interval_ms` (`workers.scan_batch` cells a scan): the versions no reader
    /// can need any more are removed.
    pub async fn collect(&self) -> Result<perc_txn::gc::GcReport> {
        Ok(perc_txn::gc::collect(&self.client, self.engine.config().scan_batch).await?)
    }

    /// Deregisters this process's clients and makes every commit durable.
    pub async fn close(self) -> Result<()> {
        self.client.deregister().await?;
        self.engine.client().deregister().await?;
        // Everything the observers committed without a flush is made durable before exit.
        self.store.sync().await?;
        Ok(())
    }
}

/// Pending notifications a report counts at most (each look is a scan).
const BACKLOG_COUNTED: usize = 100_000;

/// How often a process that waits on others says, off a terminal, what it waits for.
const BACKLOG_LINE_EVERY: Duration = Duration::from_secs(5);

/// A process's totals at one moment, for the periodic report.
struct Reported {
    at: Instant,
    runs: u64,
    conflicts: u64,
    takeovers: u64,
}

impl Reported {
    fn new(engine: &Engine) -> Reported {
        let stats = engine.stats();
        Reported {
            at: Instant::now(),
            runs: stats.iter().map(|s| s.runs).sum(),
            conflicts: stats.iter().map(|s| s.conflicts).sum(),
            takeovers: engine.lease_takeovers(),
        }
    }
}

/// How long a watching process waits, with notifications pending and no worker alive,
/// before it says so.
const NOBODY_SAID_AFTER: Duration = Duration::from_secs(3);

/// What [`Pipeline::check_somebody_works`] remembers between looks.
#[derive(Default)]
struct Nobody {
    checked: Option<Instant>,
    /// Since when nobody works.
    since: Option<Instant>,
    said: bool,
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
    let scope = perc_crawl::Scope::new(seeds, &all_prefixes).map_err(PipelineError::Input)?;
    let outside: Vec<Url> = seeds.iter().filter(|s| !scope.contains(s)).cloned().collect();
    if !all_prefixes.is_empty() && outside.len() == seeds.len() {
        return Err(PipelineError::Input(format!(
            "no seed is inside the scope prefixes ({}): nothing could be crawled",
            all_prefixes.join(", ")
        )));
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
    /// WARC files read.
    pub files: usize,
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
    /// The pending notifications by the observer they wait for.
    pub pending_by_observer: std::collections::BTreeMap<String, usize>,
    /// How long the oldest pending notification of each observer with any has waited, in
    /// ms: whether the stage keeps up.
    pub oldest_pending_ms: std::collections::BTreeMap<String, u64>,
    /// Locks in the store: transactions committing now, or left by a process that died (the
    /// next reader or writer of their rows resolves them).
    pub locks: usize,
    /// Every run's counters so far, per observer (workers add theirs as they go; this
    /// process's own are included, saved or not: a save committing at that very moment may
    /// be counted twice or not yet).
    pub counters: StoredStats,
    pub parked: Vec<FailedEntry>,
    /// Processes registered in the store's liveness registry, this one's clients left out.
    pub workers: Vec<WorkerStatus>,
    /// The `perc oracle` server's address (empty: the oracle runs in each process).
    pub oracle_server: String,
    pub oracle: perc_oracle::StoredMark,
    /// Requests to each host, by every process that crawled: [requests, failed, first ms,
    /// last ms].
    pub hosts: StoredHosts,
}

/// A process registered in the liveness registry, as `perc status` shows it.
#[derive(Clone, Debug)]
pub struct WorkerStatus {
    /// The process, named by its main client (the one that runs its observers).
    pub worker: perc_txn::ClientId,
    pub alive: bool,
    /// Since it registered, and since its last heartbeat (ms).
    pub age_ms: u64,
    pub heartbeat_age_ms: u64,
    /// Notification scanners it runs (0: a loader or a query that only watches).
    pub scanners: u32,
    /// Leases it holds now (distributed mode).
    pub leases: usize,
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
        // What this crawl wants is wanted after this timestamp: its report counts what it
        // tried, whichever process fetched it.
        let since = self.client.oracle().next().await?;
        self.add_seeds(seeds, scope).await?;
        let run = self.run_until_quiet("crawl", stop).await?;
        Ok((run, perc_observers::report_since(&self.client, seeds, since.0).await?))
    }

    /// Adds `seeds` (and the in-scope URLs of the sitemaps their robots.txt files name) to
    /// the frontier within `scope`, for the workers to crawl: what a crawl starts with.
    pub async fn add_seeds(&self, seeds: &[Url], scope: &CrawlScope) -> Result<()> {
        let wanted = self.with_sitemaps(seeds, scope).await?;
        perc_observers::seed(&self.client, &wanted, scope).await?;
        Ok(())
    }

    /// `seeds`, and (with `crawl.sitemaps`) the in-scope URLs of the sitemaps their
    /// robots.txt files name.
    async fn with_sitemaps(&self, seeds: &[Url], scope: &CrawlScope) -> Result<Vec<Url>> {
        let mut wanted = seeds.to_vec();
        if self.config.crawl.sitemaps {
            wanted.extend(self.sitemap_seeds(seeds, scope).await?);
        }
        Ok(wanted)
    }

    /// The in-scope URLs of the sitemaps that the seeds' robots.txt files name, not seeds
    /// already (spec §6.1). Each sitemap that cannot be read is a warning naming it.
    async fn sitemap_seeds(&self, seeds: &[Url], scope: &CrawlScope) -> Result<Vec<Url>> {
        let in_scope = perc_crawl::Scope::new(seeds, &scope.prefixes)
            .map_err(|e| PipelineError::Setup(e.to_string()))?;
        let mut origins = std::collections::BTreeSet::new();
        let mut roots = Vec::new();
        for seed in seeds {
            if !origins.insert(seed.origin().ascii_serialization()) {
                continue;
            }
            for line in self.source.sitemaps_of(seed).await {
                match seed.join(line.trim()).map(String::from).map(|u| perc_crawl::normalize(&u)) {
                    Ok(Ok(u)) => roots.push(u),
                    _ => tracing::warn!("robots.txt of {seed}: Sitemap: {line:?} is not a URL"),
                }
            }
        }
        let known: std::collections::HashSet<&Url> = seeds.iter().collect();
        let wanted = |u: &Url| in_scope.contains(u) && !known.contains(u);
        let most = usize::try_from(self.config.crawl.sitemap_urls_max).unwrap_or(usize::MAX);
        let (urls, warnings) =
            perc_crawl::sitemap::collect(self.source.as_ref(), &roots, &wanted, most).await;
        for w in warnings {
            tracing::warn!("{w}");
        }
        Ok(urls)
    }

    /// Loads every response record of `files` (a directory: its WARCs, in name order) and
    /// runs the observers to quiescence. Records stream from a reading thread in batches:
    /// memory stays flat in the size of the files.
    pub async fn replay(&self, files: &[PathBuf], stop: &CancellationToken) -> Result<Replayed> {
        let files = perc_crawl::warc::expand(files)
            .map_err(PipelineError::io("cannot list the WARC directory"))?;
        let mut issues = Vec::new();
        let mut loaded = 0;
        for f in &files {
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
                    _ = stop.cancelled() => return Err(PipelineError::Interrupted),
                };
                let Some(batch) = batch else { break };
                loaded += batch.len();
                perc_observers::load_recorded(&self.client, &batch).await?;
            }
            let read = reading.await.expect("the WARC reader does not panic");
            issues.extend(read.map_err(PipelineError::io(format!("cannot read {}", f.display())))?);
        }
        let run = self.run_until_quiet("replay", stop).await?;
        let pages = perc_observers::page_count(&self.client).await?;
        Ok(Replayed { files: files.len(), loaded, issues, run, pages })
    }

    /// Fetches `targets` again (all known URLs when `None`) and runs the observers to
    /// quiescence.
    pub async fn refetch(
        &self,
        targets: Option<&[Url]>,
        stop: &CancellationToken,
    ) -> Result<Refetched> {
        let (refetched, unknown) = self.want_again(targets).await?;
        let run = self.run_until_quiet("refetch", stop).await?;
        let pages = perc_observers::page_count(&self.client).await?;
        Ok(Refetched { refetched, unknown, run, pages })
    }

    /// Asks for `targets` again (all known URLs when `None`) without waiting: how many were
    /// asked for, and the URLs not known (not asked for).
    pub async fn want_again(&self, targets: Option<&[Url]>) -> Result<(usize, Vec<Url>)> {
        let all;
        let targets = match targets {
            Some(t) => t,
            None => {
                all = perc_observers::known_urls(&self.client).await?;
                &all
            }
        };
        let unknown = perc_observers::refetch(&self.client, targets).await?;
        Ok((targets.len() - unknown.len(), unknown))
    }

    /// Adds `seeds` to what this index crawls, without waiting: the stored scope grows by
    /// theirs (narrowed by `prefixes`, else their origins), and they are fetched (again).
    /// Returns the seeds outside `prefixes` (fetched, their links not followed), and the
    /// scope they were added with, for [`Pipeline::add_sitemap_urls`]. One transaction: it
    /// fetches nothing, so it answers at once whatever the seeds' hosts do.
    pub async fn extend_seeds(
        &self,
        seeds: &[Url],
        prefixes: &[String],
    ) -> Result<(Vec<Url>, CrawlScope)> {
        let (scope, outside) = crawl_scope(&self.config, seeds, prefixes)?;
        perc_observers::seed_more(&self.client, seeds, &scope).await?;
        Ok((outside, scope))
    }

    /// With `crawl.sitemaps`, adds the in-scope URLs of the sitemaps that the seeds' robots.txt
    /// files name to the frontier; how many. It fetches robots.txt and the sitemaps, politely:
    /// seconds or minutes, which `perc serve` spends after it has answered.
    pub async fn add_sitemap_urls(&self, seeds: &[Url], scope: &CrawlScope) -> Result<usize> {
        if !self.config.crawl.sitemaps {
            return Ok(0);
        }
        let urls = self.sitemap_seeds(seeds, scope).await?;
        if !urls.is_empty() {
            perc_observers::seed_more(&self.client, &urls, scope).await?;
        }
        Ok(urls.len())
    }

    /// Asks again for the URLs that are due for a recrawl now (at most `recrawl.batch`),
    /// without waiting; how many. Back-pressure: while `recrawl.pending_max` notifications
    /// or more wait for the observers, it asks for none, and below that for no more than
    /// would reach it; the URLs left due are asked for at a later tick (the recrawl's lag
    /// shows how late), so a recrawl that asks more than the machine indexes never buries
    /// the stages after the fetch.
    pub async fn recrawl_due(&self) -> Result<usize> {
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let pending_max = size(self.config.recrawl.pending_max);
        let pending = self.engine.pending_count(pending_max).await?;
        let room = pending_max.saturating_sub(pending);
        if room == 0 {
            return Ok(0);
        }
        let now = self.client.clock().now_ms();
        let limit = size(self.config.recrawl.batch).min(room);
        Ok(perc_observers::recrawl_due(&self.client, now, limit).await?)
    }

    /// What politeness does with each host this process crawls, now (none offline).
    pub fn host_states(&self) -> Vec<perc_crawl::HostState> {
        self.polite.as_ref().map_or_else(Vec::new, |p| p.host_states())
    }

    /// This process's observer counters (runs, commits, ...), as they are now.
    pub fn observer_stats(&self) -> Vec<perc_notify::ObserverStats> {
        self.engine.stats()
    }

    /// The calls this process made to the store backend so far, by kind (RPCs on Bigtable).
    pub fn store_calls(&self) -> perc_store::OpCounts {
        self.calls.counts()
    }

    /// How late the recrawl is: now minus the oldest due time not fetched yet (0 when
    /// nothing is due), in ms; and the next `n` URLs due, with their due times.
    pub async fn recrawl_queue(&self, n: usize) -> Result<(u64, Vec<(u64, String)>)> {
        let now = self.client.clock().now_ms();
        let next = perc_observers::next_due(&self.client, n).await?;
        let lag = next.first().map_or(0, |(due, _)| now.saturating_sub(*due));
        Ok((lag, next))
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The transactions' client: loaders' commits are made durable before they return.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The engine that runs the observers.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The store, as the transactions see it (calls counted, small writes coalesced).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Now on the pipeline's clock, in ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.client.clock().now_ms()
    }

    /// The canonical URL of a page, a duplicate or an alias; `Err` says what the URL is
    /// instead.
    pub async fn canonical(&self, url: &Url) -> Result<Result<String, String>> {
        Ok(perc_observers::canonical(&self.client, url).await?)
    }

    /// What the index knows of one URL.
    pub async fn page(&self, url: &Url) -> Result<PageInfo> {
        Ok(perc_observers::page_info(&self.client, url).await?)
    }

    /// What `perc page` prints and `GET /v1/page` answers (see [`page_record`]), with the
    /// URL's recrawl state; `None` for a URL the index does not know.
    pub async fn page_json(&self, url: &Url) -> Result<Option<String>> {
        let info = self.page(url).await?;
        let fetch = perc_observers::fetch_state(&self.client, url).await?;
        Ok(page_record(url, info, fetch.as_ref()))
    }

    /// The export, one line at a time in URL order; returns the number of lines.
    pub async fn export(&self, mut each: impl FnMut(ExportLine) -> Result<()>) -> Result<usize> {
        let mut n = 0;
        perc_observers::export_each(&self.client, |l| {
            n += 1;
            each(l)
        })
        .await?;
        Ok(n)
    }

    /// Hands the search queue (docs/serve.md, "Search") to `apply`, `max` rows a
    /// transaction; `apply` makes a search index hold what they ask for durably, then they
    /// are deleted (see `perc_observers::search::drain`). `apply`'s error leaves them queued
    /// and is returned inside. Returns the URLs applied.
    pub async fn drain_search<E>(
        &self,
        max: usize,
        apply: impl FnMut(&[Queued]) -> Result<(), E>,
    ) -> Result<Result<usize, E>> {
        Ok(perc_observers::search::drain(&self.client, max, apply).await?)
    }

    /// Whether the search queue is empty: an index that drained it is caught up.
    pub async fn search_caught_up(&self) -> Result<bool> {
        Ok(perc_observers::search::caught_up(&self.client).await?)
    }

    /// Every search document at one snapshot, in URL order: what an index built from nothing
    /// holds before it drains the queue. Returns how many, and the queue's generation at that
    /// snapshot (see [`Pipeline::search_generation`]).
    pub async fn search_documents(
        &self,
        each: impl FnMut(SearchDoc) -> Result<()>,
    ) -> Result<(usize, u64)> {
        perc_observers::search::each_document(&self.client, each).await
    }

    /// The search queue's generation: how many times [`Pipeline::trim_search_queue`]
    /// emptied it. An index built in an older one missed rows, and is built again.
    pub async fn search_generation(&self) -> Result<u64> {
        Ok(perc_observers::search::generation(&self.client).await?)
    }

    /// Empties the search queue if it holds more than `search.queue_max` rows (nothing
    /// drains it: a crawl or replay keeps no search index); the rows deleted.
    pub async fn trim_search_queue(&self) -> Result<usize> {
        let keep = usize::try_from(self.config.search.queue_max).unwrap_or(usize::MAX);
        Ok(perc_observers::search::trim(&self.client, keep).await?)
    }

    /// [`Pipeline::trim_search_queue`] at the end of a run (`now`), and every
    /// [`QUEUE_CHECK_EVERY`] while one goes on: the queue stays bounded in every process,
    /// whether or not a search index drains it. A failure is logged; the next check tries
    /// again.
    async fn bound_search_queue(&self, now: bool) {
        {
            let mut checked = self.queue_checked.lock().unwrap_or_else(|p| p.into_inner());
            if !now && checked.is_some_and(|at| at.elapsed() < QUEUE_CHECK_EVERY) {
                return;
            }
            *checked = Some(Instant::now());
        }
        match self.trim_search_queue().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                "the search queue held more than search.queue_max rows: {n} deleted (a search \
                 index built before is built again when it next catches up)"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot check the search queue's size"),
        }
    }

    /// The export as JSON Lines (one string a page, without the newline), in URL order.
    pub async fn export_jsonl(&self) -> Result<Vec<String>> {
        let mut lines = Vec::new();
        self.export(|l| {
            lines.push(serde_json::to_string(&l).expect("an export line serializes"));
            Ok(())
        })
        .await?;
        Ok(lines)
    }

    /// Runs the observers until `stop` (`perc worker`), reporting every
    /// `workers.report_ms`, then saves the counters.
    ///
    /// An error that stops the engine's runs (a full disk, a store that fails) ends it too,
    /// and is returned: a process that runs no observer must not go on as if it did.
    pub async fn work(&self, stop: &CancellationToken) -> Result<()> {
        let workers = Workers::start(self.engine.clone(), &tokio::runtime::Handle::current());
        let mut last = Reported::new(&self.engine);
        let every = Duration::from_millis(self.config.workers.report_ms);
        let mut reported = Instant::now();
        let fatal = loop {
            tokio::select! {
                _ = stop.cancelled() => break None,
                _ = tokio::time::sleep(FATAL_CHECK_EVERY) => {}
            }
            if let Some(e) = self.engine.fatal() {
                break Some(e);
            }
            if !every.is_zero() && reported.elapsed() >= every {
                self.report(&mut last).await;
                reported = Instant::now();
            }
        };
        workers.shutdown().await;
        if let Some(e) = fatal {
            return Err(e.into());
        }
        self.save_stats().await
    }

    /// "N notifications pending (parse 3, export 10)", counting up to [`BACKLOG_COUNTED`].
    async fn backlog(&self) -> String {
        match self.engine.pending_by_observer(BACKLOG_COUNTED).await {
            Ok(by) if by.is_empty() => "no notification pending".into(),
            Ok(by) => {
                let each: Vec<String> = by.iter().map(|(name, n)| format!("{name} {n}")).collect();
                let total: usize = by.values().sum();
                format!("{total} notifications pending ({})", each.join(", "))
            }
            Err(e) => format!("pending notifications unknown ({e})"),
        }
    }

    /// Saves the counters and logs, at info, what this process did since `last`.
    async fn report(&self, last: &mut Reported) {
        if let Err(e) = self.save_stats().await {
            tracing::warn!(error = %e, "cannot save the observer counters");
        }
        self.bound_search_queue(false).await;
        let now = Reported::new(&self.engine);
        let secs = now.at.duration_since(last.at).as_secs_f64().max(0.001);
        let backlog = self.engine.pending_count(BACKLOG_COUNTED).await;
        let backlog = match backlog {
            Ok(n) if n >= BACKLOG_COUNTED => format!("{n}+"),
            Ok(n) => n.to_string(),
            Err(e) => format!("unknown ({e})"),
        };
        tracing::info!(
            "{:.1} runs/s ({} runs, {} conflicts, {} leases taken over from dead workers in \
             {secs:.0} s); {backlog} notifications pending",
            (now.runs - last.runs) as f64 / secs,
            now.runs - last.runs,
            now.conflicts - last.conflicts,
            now.takeovers - last.takeovers,
        );
        *last = now;
    }

    /// Tells the observers' engine of an error met outside its runs (a recrawl's or a search
    /// indexer's write): a full disk stops the engine as one met in a run does, and so ends
    /// [`Pipeline::work`] with it.
    pub fn note(&self, e: &PipelineError) {
        if let PipelineError::OutOfSpace(se) = e {
            self.engine.note(&perc_txn::TxnError::Store(se.clone()));
        }
    }

    /// This process's worker id, as other processes see it in locks and leases.
    pub fn worker_id(&self) -> perc_txn::ClientId {
        self.engine.client().id()
    }

    /// The index's report, the pending notifications, the stored counters and the parked
    /// notifications.
    pub async fn status(&self) -> Result<Status> {
        let report = perc_observers::report(&self.client, &[]).await?;
        let backlog = self.engine.backlog(1_000_000).await?;
        let pending_by_observer: std::collections::BTreeMap<String, usize> =
            backlog.iter().map(|(name, b)| (name.clone(), b.pending)).collect();
        let oldest_pending_ms =
            backlog.iter().map(|(name, b)| (name.clone(), b.oldest_ms)).collect();
        let pending = pending_by_observer.values().sum();
        let t = self.client.begin().await?;
        let mut counters = decode_stored(t.get(STATS_ROW, STATS_COLUMN).await?, OBSERVER_COUNTERS)?;
        let mut hosts = decode_stored(t.get(STATS_ROW, HOSTS_COLUMN).await?, HOST_COUNTERS)?;
        // This process's own, not saved yet (a server's, between its saves).
        let unsaved = self.unsaved();
        add_stats(&mut counters, &unsaved.delta);
        add_hosts(&mut hosts, &unsaved.hosts_delta);
        let parked = self.engine.failed_list().await?;
        // Locks and leases live in the rows: one call, one walk over them for both.
        let every_lock = perc_store::Scan::whole(perc_txn::actions::LOCK.name, 1_000_000);
        let mut found =
            self.store.scan_many(&[every_lock, perc_notify::lease::every_lease()]).await?;
        let now = self.client.clock().now_ms();
        let leases = perc_notify::lease::leases_by_holder(&found.pop().unwrap_or_default(), now);
        let locks = found.pop().unwrap_or_default().len();
        // A process registers more than one client: one line a process, this one left out.
        let me = self.engine.client().id();
        let mut by_process = std::collections::BTreeMap::<perc_txn::ClientId, WorkerStatus>::new();
        for (w, alive) in self.client.liveness().workers().await? {
            if w.about.process == me || w.worker == self.client.id() {
                continue;
            }
            let p = by_process.entry(w.about.process).or_insert(WorkerStatus {
                worker: w.about.process,
                alive: false,
                age_ms: 0,
                heartbeat_age_ms: u64::MAX,
                scanners: 0,
                leases: 0,
            });
            p.alive |= alive;
            p.age_ms = p.age_ms.max(now.saturating_sub(w.about.started_ms));
            p.heartbeat_age_ms = p.heartbeat_age_ms.min(now.saturating_sub(w.heartbeat_ms));
            p.scanners = p.scanners.max(w.about.scanners);
            p.leases += leases.get(&w.worker).copied().unwrap_or(0);
        }
        let workers = by_process.into_values().collect();
        let oracle = perc_oracle::stored_mark(self.store.as_ref()).await?;
        Ok(Status {
            report,
            pending,
            pending_by_observer,
            oldest_pending_ms,
            locks,
            counters,
            parked,
            workers,
            oracle_server: self.config.oracle.server.clone(),
            oracle,
            hosts,
        })
    }
}

/// What `perc page` prints and `GET /v1/page` answers for `url`: the export line with what
/// the page declares that the export leaves out (its declared canonical, a delayed refresh,
/// its simhash), or why the URL is not a page, as JSON text (the export line's fields in the
/// export's order); `None` when the index does not know it. With `fetch`, the recrawl state
/// of a URL fetched live: `"fetch": {last_ms, next_ms, interval_s, changed, unchanged}`
/// (times in ms since the epoch), and `failures` and `failure` while its fetches fail (the
/// stored answer stands meanwhile).
pub fn page_record(
    url: &Url,
    info: PageInfo,
    fetch: Option<&perc_observers::model::FetchState>,
) -> Option<String> {
    #[derive(serde::Serialize)]
    struct Shown {
        #[serde(flatten)]
        line: ExportLine,
        #[serde(skip_serializing_if = "Option::is_none")]
        declared_canonical: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        refresh: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        simhash: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        fetch: Option<serde_json::Value>,
    }
    let fetch = fetch.map(|f| {
        let mut v = serde_json::json!({
            "last_ms": f.last_ms, "next_ms": f.next_ms, "interval_s": f.interval_s,
            "changed": f.changed, "unchanged": f.unchanged,
        });
        if let Some(why) = &f.failure {
            v["failures"] = f.failures.into();
            v["failure"] = why.as_str().into();
        }
        v
    });
    Some(match info {
        PageInfo::Page(line, meta) => serde_json::to_string(&Shown {
            line,
            declared_canonical: meta.declared_canonical,
            refresh: meta.refresh,
            simhash: meta.simhash,
            fetch,
        })
        .expect("serializable"),
        PageInfo::NotAPage(meta) => {
            let mut v = serde_json::json!({
                "url": url.as_str(), "kind": meta.kind, "reason": meta.reason,
                "status": meta.status, "redirect_to": meta.redirect_to
            });
            if let Some(f) = fetch {
                v["fetch"] = f;
            }
            v.to_string()
        }
        PageInfo::Pending => serde_json::json!({
            "url": url.as_str(), "kind": "pending", "reason": "in the frontier, not fetched yet"
        })
        .to_string(),
        PageInfo::Unknown => return None,
    })
}

impl Status {
    /// `perc status` as JSON (`GET /v1/status`): the same numbers, named.
    pub fn to_json(&self) -> serde_json::Value {
        let r = &self.report;
        let counters: serde_json::Map<String, serde_json::Value> = self
            .counters
            .iter()
            .map(|(name, [runs, commits, skipped, conflicts, failures, parked])| {
                let v = serde_json::json!({
                    "runs": runs, "commits": commits, "skipped": skipped,
                    "conflicts": conflicts, "failures": failures, "parked": parked,
                    "pending": self.pending_by_observer.get(name).copied().unwrap_or(0),
                    "oldest_pending_s": self.oldest_pending_ms.get(name).copied().unwrap_or(0) as f64 / 1000.0,
                });
                (name.clone(), v)
            })
            .collect();
        let hosts: serde_json::Map<String, serde_json::Value> = self
            .hosts
            .iter()
            .map(|(host, [requests, failed, first_ms, last_ms])| {
                let v = serde_json::json!({
                    "requests": requests, "failed": failed,
                    "first_ms": first_ms, "last_ms": last_ms,
                });
                (host.clone(), v)
            })
            .collect();
        serde_json::json!({
            "pages": r.pages,
            "duplicate_clusters": r.duplicate_clusters,
            "fetched": r.fetched,
            "answered": r.answered,
            "waiting": r.waiting,
            "not_pages": r.not_pages,
            "not_page_examples": r.not_page_examples,
            "pending": self.pending,
            "pending_by_observer": self.pending_by_observer,
            "oldest_pending_s": self.oldest_pending_ms.values().max().copied().unwrap_or(0) as f64 / 1000.0,
            "locks": self.locks,
            "observers": counters,
            "parked": self.parked.len(),
            "workers": self.workers.iter().filter(|w| w.alive).count(),
            "hosts": hosts,
        })
    }
}

/// Where the counters of every run so far are kept, per observer:
/// [runs, commits, skipped, conflicts, failures, parked].
const STATS_ROW: &[u8] = b"m:stats";
const STATS_COLUMN: &[u8] = b"stats:observers";
pub type StoredStats = std::collections::BTreeMap<String, [u64; 6]>;
/// Requests to each host by every process so far: [requests, failed, first ms, last ms].
const HOSTS_COLUMN: &[u8] = b"stats:hosts";
const OBSERVER_COUNTERS: &str = "the stored observer counters";
const HOST_COUNTERS: &str = "the stored host counters";
pub type StoredHosts = std::collections::BTreeMap<String, [u64; 4]>;

/// A process's counters now, and what of them the store does not have yet.
struct Unsaved {
    now: StoredStats,
    delta: StoredStats,
    hosts_now: StoredHosts,
    hosts_delta: StoredHosts,
}

fn add_stats(all: &mut StoredStats, delta: &StoredStats) {
    for (name, add) in delta {
        let e = all.entry(name.clone()).or_default();
        for (slot, add) in e.iter_mut().zip(add) {
            *slot += add;
        }
    }
}

fn add_hosts(hosts: &mut StoredHosts, delta: &StoredHosts) {
    for (host, [requests, failed, first, last]) in delta {
        let h = hosts.entry(host.clone()).or_insert([0, 0, *first, *last]);
        h[0] += requests;
        h[1] += failed;
        h[2] = h[2].min(*first);
        h[3] = h[3].max(*last);
    }
}

/// A stored counter record (`what` names it in the error), or an empty one if none is stored.
fn decode_stored<T: serde::de::DeserializeOwned + Default>(
    raw: Option<Bytes>,
    what: &str,
) -> Result<T, IndexError> {
    match raw {
        Some(v) => serde_json::from_slice(&v).map_err(|e| IndexError::corrupt(what, e)),
        None => Ok(T::default()),
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RunSummary {
    pub fetched: u64,
    pub parsed: u64,
    pub failures: u64,
    pub seconds: f64,
}

/// Awaits `work` while `beside` (a loop that never ends: progress reports) runs alongside it,
/// each polled whenever the task wakes. Awaiting a report in a select branch's body instead
/// leaves the pinned `work` unpolled for as long as the body runs; if `work` holds an async
/// lock the report waits for, or is first in its queue, neither moves again (a "futurelock":
/// `perc replay` hung so, one run in about twenty, when a report met the wait's clear of
/// settled notifications).
async fn alongside<T>(
    work: impl std::future::Future<Output = T>,
    beside: impl std::future::Future<Output = ()>,
) -> T {
    tokio::pin!(work);
    tokio::select! {
        out = &mut work => out,
        () = beside => work.await,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_report_waiting_on_what_the_work_holds_does_not_wedge_it() {
        // The work takes a lock and keeps it until a report has begun; the report then waits
        // for the lock. Run in a select branch's body, the report would wait forever.
        let lock = tokio::sync::Mutex::new(());
        let reporting = tokio::sync::Notify::new();
        let work = async {
            let _held = lock.lock().await;
            reporting.notified().await;
            "done"
        };
        let report = async {
            loop {
                tokio::task::yield_now().await;
                reporting.notify_one();
                let _turn = lock.lock().await;
            }
        };
        let done = tokio::time::timeout(Duration::from_secs(30), alongside(work, report)).await;
        assert_eq!(done, Ok("done"), "the work was wedged by the report");
    }
}
