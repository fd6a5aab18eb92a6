//! `perc status`: what the store holds and what the processes on it are doing, as one
//! read of the store.

use perc_notify::FailedEntry;
use perc_observers::Report;

use crate::stats::{
    add_hosts, add_stats, decode_stored, StoredHosts, StoredStats, HOSTS_COLUMN, HOST_COUNTERS,
    OBSERVER_COUNTERS, STATS_COLUMN, STATS_ROW,
};
use crate::{Pipeline, Result};

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
    /// What it is ("crawl", "worker", "serve"...: the command it runs); empty if unsaid.
    pub kind: String,
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
                kind: String::new(),
                alive: false,
                age_ms: 0,
                heartbeat_age_ms: u64::MAX,
                scanners: 0,
                leases: 0,
            });
            if p.kind.is_empty() {
                p.kind = w.about.kind.as_str().to_owned();
            }
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
