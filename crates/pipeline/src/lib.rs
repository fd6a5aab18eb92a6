//! perc's front door: one process's perc (the store, the oracle, the observers and the
//! workers) assembled from a validated [`Config`], and the run-until-quiescent loop with its
//! progress display. The binary, the benchmarks and the tests open a [`Pipeline`] rather than
//! wiring the layers themselves.
//!
//! Here: the verbs (`crawl`, `replay`, `refetch`, `canonical`, `page`, `export`, `status`,
//! `work`, `run_until_quiet`, `close`); in [`config`] the configuration and its checks; in
//! `open` the assembly ([`Pipeline::open`], [`Builder`]); in `error` [`PipelineError`]; in
//! [`diff`] the semantic diff of two exports (`perc diff`, `perc replay --expect`).

pub mod config;
pub mod diff;
mod error;
mod open;

use std::io::IsTerminal;
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

pub use crate::config::{Backend, Config, ConfigError, MEMORY};
pub use crate::error::{PipelineError, Result};
pub use crate::open::{open_store, shared_oracle, Builder, Create, Fetching};
/// What the verbs hand back, from the layer that defines them.
pub use perc_observers::model::{CrawlScope, ExportLine};
pub use perc_observers::{PageInfo, Report};

pub struct Pipeline {
    pub store: Arc<dyn Store>,
    pub client: Client,
    pub engine: Arc<Engine>,
    pub config: Config,
}

impl Pipeline {
    /// Runs the workers until no notification is pending; shows progress on a terminal.
    /// When `stop` is cancelled (SIGINT, SIGTERM) it stops taking new work, lets the runs in
    /// flight finish, saves the counters and returns [`PipelineError::Interrupted`].
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
        let mut nobody = Nobody::default();
        {
            let wait = workers.wait();
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    r = &mut wait => { failed = r.err(); break; }
                    _ = stop.cancelled() => { interrupted = true; break; }
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {
                        if self.config.workers.scanners == 0 {
                            self.check_somebody_works(&mut nobody).await;
                        }
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
            return Err(PipelineError::Interrupted);
        }
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
            Ok(all) => all.iter().filter(|(w, alive)| *alive && w.scanners > 0).count(),
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

    /// Deregisters this process's clients and makes every commit durable.
    pub async fn close(self) -> Result<()> {
        self.client.deregister().await?;
        self.engine.client().deregister().await?;
        // Everything the observers committed without a flush is made durable before exit.
        self.store.sync().await?;
        Ok(())
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
    pub async fn page(&self, url: &Url) -> Result<PageInfo> {
        Ok(perc_observers::page_info(&self.client, url).await?)
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

    /// Runs the observers until `stop` (`perc worker`), then saves the counters.
    pub async fn work(&self, stop: &CancellationToken) -> Result<()> {
        let workers = Workers::start(self.engine.clone(), &tokio::runtime::Handle::current());
        stop.cancelled().await;
        workers.shutdown().await;
        self.save_stats().await
    }

    /// This process's worker id, as other processes see it in locks and leases.
    pub fn worker_id(&self) -> perc_txn::ClientId {
        self.engine.client().id()
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

fn decode_stats(raw: Option<Bytes>) -> Result<StoredStats, IndexError> {
    match raw {
        Some(v) => serde_json::from_slice(&v)
            .map_err(|e| IndexError::corrupt("the stored observer counters", e)),
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
