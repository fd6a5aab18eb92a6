//! Processing one notification, and stepping through all of them: the part of the framework
//! that decides whether an observer runs, runs it in a transaction with its ack, and clears
//! the notification. Scanners and workers ([`crate::workers`]) drive it concurrently; tests
//! drive it one step at a time ([`Engine::step`]).
//!
//! One notification `(row, column)` whose newest notify cell is at `ts`:
//!
//! ```text
//!   begin (start_ts > ts, as the oracle handed ts out before)
//!   read, in one store call: the ack, the column, and the columns of `row` the observer
//!        read in earlier runs (prefetched into the transaction's read cache)
//!   ack  = (row, "perc.ack:<observer>")                  start_ts of the last run, or 0
//!   run? = strong: newest commit_ts of (row, column) > ack  (waits on that cell's locks)
//!          weak:   ts > ack
//!   if run: set ack = start_ts; observer.observe(txn); commit   (racing runs: one commits)
//!   then delete notify cells of (row, column) in [0, ts]
//! ```
//!
//! Why this is exact: a notify cell sits at its writer's commit_ts and is written before the
//! writer's commit point, so by the time the run reads the column, that commit is either
//! visible (commit_ts = ts < start_ts) or was rolled back. Several writes before a run collapse
//! into it (their cells are all at or below `ts`); a write that commits later has a cell above
//! `ts`, which the delete leaves, and so runs the observer again. A run that fails (a run that
//! panics, in the observer or beneath it, fails too) or conflicts deletes nothing: the
//! notification stays to be run again.
//!
//! Alone ([`Engine::process`]), a committed run's delete rides on its commit's last call, and
//! a run that commits nothing deletes at once. Under the workers every run leaves its delete
//! with the engine, which deletes the notify cells of many runs in one call before the next
//! scan of the notify family ([`Engine::flush_clears`]): a run that commits nothing then
//! costs no write at all, and a commit of one row no call after its commit point. A lost
//! delete only means a rerun that finds its ack (or, for a run that committed nothing, its
//! start remembered in memory, or nothing to do again).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use futures::FutureExt;
use perc_store::{
    Column, FamilySpec, Locality, Mutation, RowMutation, Scan, ScanCell, Store, Ts, TsRange,
};
use perc_txn::{actions, Client, CommitStep, TxnError};

use crate::lease::{LocalLease, RowLease};
use crate::observer::{record_run, NotifyKind, ObserverError, Registration, Registry};
use crate::NotifyConfig;

/// The most columns of its notified row an observer's run prefetches.
const PREFETCH_COLUMNS_MAX: usize = 32;

/// How many settled notifications an engine clears in one call, at most:
/// their clears wait (see [`Engine::deferred`]) until this many have gathered or a scan is
/// about to read the notify family again.
const DEFERRED_CLEARS_MAX: usize = 256;

/// How many idle runs' starts an engine remembers (a few MiB at most) before forgetting them
/// all: forgetting only costs a rerun that finds nothing to do again.
const IDLE_ACKS_MAX: usize = 65_536;

/// Notifications parked after failing `failures_max` times: row, column -> "observer: error".
/// A locality group of its own, so that listing them (every worker's start, every status)
/// reads only them: in the row's atomic unit, as [`FAILED`] was, a scan of the family read
/// every row record of the table on sled.
pub const PARKED: FamilySpec = FamilySpec { name: "parked", locality: Locality::Own };

/// Where perc kept parked notifications before [`PARKED`]: read once per store, by the first
/// [`Engine::load_parked`], which moves them (see [`PARKED_MOVED_ROW`]).
pub const FAILED: FamilySpec = FamilySpec { name: "failed", locality: Locality::Row };

/// The row of [`PARKED`] whose cell says that the store's [`FAILED`] records were moved (no
/// notified row starts with a zero byte).
const PARKED_MOVED_ROW: &[u8] = b"\0moved";
const PARKED_MOVED_COLUMN: &[u8] = b"from-failed";

/// A pending notification, collapsed: the newest notify cell of one `(row, column)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub row: Bytes,
    pub column: Bytes,
    pub ts: Ts,
}

/// Ends a tracked run when dropped: whatever way its future ends, the runs in flight go down
/// by one and whoever waits for progress or quiescence is told.
struct Tracked<'a>(&'a Engine);

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.quiet.notify_waiters();
        }
        self.0.progress.notify_waiters();
    }
}

/// One observer's pending notifications: how many, and how long the oldest has waited.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    pub pending: usize,
    pub oldest_ms: u64,
}

/// What happened to one notification.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// The observer ran and its transaction committed.
    Ran,
    /// Nothing changed since the observer's last run; the notification was cleared.
    Skipped,
    /// Conflicts outlasted the retries; the notification stays.
    Conflict,
    /// The observer failed; the notification stays and is retried after a backoff.
    Failed,
    /// The observer failed `failures_max` times: moved to the failed list.
    Parked,
    /// Leased by another worker, or waiting out a failure backoff: not touched.
    Busy,
    /// No observer watches this column: the stale notification was cleared.
    NoObserver,
}

/// When a settled notification is cleared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Clear {
    /// In the call that settled it.
    Now,
    /// With others, by [`Engine::flush_clears`].
    Deferred,
}

/// What one attempt at a notification did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attempt {
    /// Nothing changed since the observer's last run: it was not called.
    Unchanged,
    /// The observer ran and buffered nothing: no transaction to commit.
    Idle,
    /// The observer ran and its transaction committed.
    Committed,
    /// The observer ran, but its store lease had less than a quarter of its TTL left, so
    /// another process may soon run the notification: nothing was committed, and the
    /// notification waits for a later scan (see the lease module).
    LeaseRunningOut,
}

#[derive(Default)]
struct Counters {
    runs: AtomicU64,
    commits: AtomicU64,
    idle: AtomicU64,
    skipped: AtomicU64,
    conflicts: AtomicU64,
    failures: AtomicU64,
    parked: AtomicU64,
    latency_us_total: AtomicU64,
    latency_us_max: AtomicU64,
    /// `perc_observer_run_seconds{observer}`, registered at the first commit (after a
    /// recorder, if the process installs one, is in place), then recorded without a lookup.
    run_seconds: std::sync::OnceLock<metrics::Histogram>,
}

/// One observer's counters, as `perc status` shows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObserverStats {
    pub name: String,
    /// Times the observer was called.
    pub runs: u64,
    /// Runs whose transaction committed.
    pub commits: u64,
    /// Runs that found nothing to write, and so committed nothing.
    pub idle: u64,
    /// Notifications cleared without a run (nothing changed since the last run).
    pub skipped: u64,
    /// Runs that ended in a write-write or lock conflict (and were retried).
    pub conflicts: u64,
    /// Runs that failed with an error.
    pub failures: u64,
    /// Notifications moved to the failed list.
    pub parked: u64,
    /// Total, mean and largest duration of a committed run, in microseconds.
    pub latency_us_total: u64,
    pub latency_us_mean: u64,
    pub latency_us_max: u64,
}

/// A parked notification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailedEntry {
    pub row: Bytes,
    pub column: Bytes,
    pub detail: String,
}

/// How one step over every pending notification went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    pub ran: usize,
    pub skipped: usize,
    pub conflicts: usize,
    pub failed: usize,
    pub parked: usize,
    pub busy: usize,
    pub no_observer: usize,
}

impl StepReport {
    /// Notifications this step settled (ran, skipped, parked or cleared).
    pub fn settled(&self) -> usize {
        self.ran + self.skipped + self.parked + self.no_observer
    }
    fn add(&mut self, o: RunOutcome) {
        match o {
            RunOutcome::Ran => self.ran += 1,
            RunOutcome::Skipped => self.skipped += 1,
            RunOutcome::Conflict => self.conflicts += 1,
            RunOutcome::Failed => self.failed += 1,
            RunOutcome::Parked => self.parked += 1,
            RunOutcome::Busy => self.busy += 1,
            RunOutcome::NoObserver => self.no_observer += 1,
        }
    }
}

impl std::ops::AddAssign for StepReport {
    fn add_assign(&mut self, r: StepReport) {
        self.ran += r.ran;
        self.skipped += r.skipped;
        self.conflicts += r.conflicts;
        self.failed += r.failed;
        self.parked += r.parked;
        self.busy += r.busy;
        self.no_observer += r.no_observer;
    }
}

struct Failure {
    count: u32,
    not_before_ms: u64,
}

/// The framework's core: a client whose commits notify the registered observers' columns,
/// the registry, and the bookkeeping of runs.
pub struct Engine {
    client: Client,
    registry: Arc<Registry>,
    config: NotifyConfig,
    lease: Arc<dyn RowLease>,
    counters: BTreeMap<String, Counters>,
    failures: Mutex<HashMap<(Bytes, Bytes), Failure>>,
    parked: Mutex<BTreeSet<(Bytes, Bytes)>>,
    /// Per observer: the columns of the notified row its runs read (prefetched next time).
    learned: Mutex<HashMap<String, BTreeSet<Bytes>>>,
    /// The start of the last run of each notification (row, column: one observer) that
    /// committed nothing: the ack it did not write. A notification at or below it was seen by that run, as one at or below
    /// a stored ack was, and is cleared without a run. In memory only (a restart reruns
    /// such notifications once, harmlessly), and forgotten wholesale past
    /// [`IDLE_ACKS_MAX`] entries.
    idle_acks: Mutex<HashMap<(Bytes, Bytes), Ts>>,
    /// Notifications that workers settled (committed, unchanged, idle, no observer), by
    /// (row, column), with the newest notify cell each run saw: their notify cells are
    /// deleted together, in one call of up to [`DEFERRED_CLEARS_MAX`], and always before the
    /// next scan of the notify family. Losing them (a crash, a failed call) leaves
    /// notifications that rerun finding nothing changed.
    deferred: Mutex<BTreeMap<(Bytes, Bytes), Ts>>,
    /// Held while deferred clears are being made: a flush returns once every clear deferred
    /// before it began is made, even those another flush took first (a quiescence check
    /// that found such a notification still there would wait for a run that never comes).
    flushing: tokio::sync::Mutex<()>,
    /// Runs in flight, and runs ever started: quiescence needs both.
    pub(crate) in_flight: AtomicUsize,
    pub(crate) started: AtomicU64,
    /// Leases refused: another scanner (of this process or another) holds the notification.
    /// Scanners read it to tell that they are right behind someone else.
    pub(crate) lease_refused: AtomicU64,
    /// Signalled whenever a run finishes.
    pub(crate) progress: tokio::sync::Notify,
    /// When timestamps were handed out, for the age of pending notifications.
    ts_clock: crate::lag::TsClock,
    /// Signalled when the last run in flight finishes, and on a fatal error: what a wait for
    /// quiescence needs. (Woken on every run instead, a waiter on a thread of its own took a
    /// core from the runs ~40 times an update of one page.)
    pub(crate) quiet: tokio::sync::Notify,
    /// Runs that committed notifications, counted before their finish is signalled: work
    /// for the scanners that their last read may not have found.
    pub(crate) notifying_commits: AtomicU64,
    /// The first error that no retry can fix (the store's device is full): once set, the
    /// workers' `wait` returns it instead of waiting for work that cannot be done.
    fatal: Mutex<Option<perc_store::StoreError>>,
}

fn notify_delete(p: &Pending) -> RowMutation {
    RowMutation {
        row: p.row.clone(),
        mutations: vec![Mutation::Delete {
            column: actions::notify_col(&p.column),
            range: TsRange::up_to(p.ts),
        }],
    }
}

/// Groups scanned notify cells (row, qualifier, ts desc) into pending notifications.
fn collapse(cells: Vec<ScanCell>) -> Vec<Pending> {
    let mut out: Vec<Pending> = Vec::new();
    for c in cells {
        match out.last_mut() {
            Some(last) if last.row == c.row && last.column == c.qualifier => {
                last.ts = last.ts.max(c.ts);
            }
            _ => out.push(Pending { row: c.row, column: c.qualifier, ts: c.ts }),
        }
    }
    out
}

impl Engine {
    /// An engine over `client`, which must have been built with `registry` as its watch
    /// (see [`crate::client_for`]), so its commits notify exactly the observed columns.
    pub fn new(client: Client, registry: Arc<Registry>, config: NotifyConfig) -> Engine {
        Engine::with_lease(client, registry, config, Arc::new(LocalLease::default()))
    }

    pub fn with_lease(
        client: Client,
        registry: Arc<Registry>,
        config: NotifyConfig,
        lease: Arc<dyn RowLease>,
    ) -> Engine {
        let counters = registry.all().map(|r| (r.name.clone(), Counters::default())).collect();
        Engine {
            client,
            registry,
            config,
            lease,
            counters,
            failures: Mutex::new(HashMap::new()),
            parked: Mutex::new(BTreeSet::new()),
            learned: Mutex::new(HashMap::new()),
            idle_acks: Mutex::new(HashMap::new()),
            deferred: Mutex::new(BTreeMap::new()),
            flushing: tokio::sync::Mutex::new(()),
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            lease_refused: AtomicU64::new(0),
            progress: tokio::sync::Notify::new(),
            ts_clock: Default::default(),
            quiet: tokio::sync::Notify::new(),
            notifying_commits: AtomicU64::new(0),
            fatal: Mutex::new(None),
        }
    }

    /// Remembers `e` if it is fatal to the run (see [`Self::fatal`]).
    pub fn note(&self, e: &TxnError) {
        if let Some(se) = e.out_of_space() {
            let mut fatal = self.fatal.lock().unwrap_or_else(|e| e.into_inner());
            if fatal.is_none() {
                tracing::error!(error = %se, "stopping: the store cannot be written");
                *fatal = Some(se.clone());
            }
            self.progress.notify_waiters();
            self.quiet.notify_waiters();
        }
    }

    /// The error that stopped this engine's runs, if one did.
    pub fn fatal(&self) -> Option<TxnError> {
        let fatal = self.fatal.lock().unwrap_or_else(|e| e.into_inner());
        fatal.clone().map(TxnError::Store)
    }

    pub fn client(&self) -> &Client {
        &self.client
    }
    pub fn config(&self) -> &NotifyConfig {
        &self.config
    }
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }
    /// The observer of `column` (its kind and stage), if any.
    pub fn registration(&self, column: &[u8]) -> Option<&Registration> {
        self.registry.get(column)
    }
    fn store(&self) -> &Arc<dyn Store> {
        self.client.store()
    }

    /// Up to `limit` notify cells from row `start` on, collapsed; and where to continue
    /// (`None`: the end of the table was reached). The clears this engine deferred are made
    /// first ([`Self::flush_clears`]), so that it does not read settled notifications again.
    pub async fn scan(
        &self,
        start: &Bytes,
        limit: usize,
    ) -> Result<(Vec<Pending>, Option<Bytes>), TxnError> {
        let cells = self.notify_cells(start.clone(), limit).await?;
        let full = cells.len() >= limit;
        let mut pending = collapse(cells);
        if !full {
            return Ok((pending, None));
        }
        // The last row may have more cells beyond the limit: leave it for the next batch,
        // unless it is the only row here (then continue after it; what it still has waits
        // for the next round).
        let last_row = pending.last().map(|p| p.row.clone()).expect("a full batch");
        if pending.iter().any(|p| p.row != last_row) {
            pending.retain(|p| p.row != last_row);
            Ok((pending, Some(last_row)))
        } else {
            let mut next = last_row.to_vec();
            next.push(0);
            Ok((pending, Some(next.into())))
        }
    }

    /// Whether any notification is pending (parked ones are not: they left the notify family).
    pub async fn has_pending(&self) -> Result<bool, TxnError> {
        Ok(!self.scan(&Bytes::new(), 1).await?.0.is_empty())
    }

    /// The distinct pending notifications in the first `limit` notify cells.
    async fn pending(&self, limit: usize) -> Result<Vec<Pending>, TxnError> {
        Ok(collapse(self.notify_cells(Bytes::new(), limit).await?))
    }

    /// Up to `limit` notify cells from row `start` on, once the deferred clears are made.
    async fn notify_cells(&self, start: Bytes, limit: usize) -> Result<Vec<ScanCell>, TxnError> {
        self.flush_clears().await?;
        let scan = Scan { family: actions::NOTIFY.name, start, end: Bytes::new(), limit };
        Ok(self.store().scan(&scan).await?)
    }

    /// Distinct pending notifications, counting at most `limit` notify cells.
    pub async fn pending_count(&self, limit: usize) -> Result<usize, TxnError> {
        Ok(self.pending(limit).await?.len())
    }

    /// Distinct pending notifications by the observer they wait for (a column no observer
    /// watches: under its column's name), counting at most `limit` notify cells.
    pub async fn pending_by_observer(
        &self,
        limit: usize,
    ) -> Result<std::collections::BTreeMap<String, usize>, TxnError> {
        let mut by = std::collections::BTreeMap::new();
        for p in self.pending(limit).await? {
            let name = match self.registry.get(&p.column) {
                Some(reg) => reg.name.to_string(),
                None => p.column.escape_ascii().to_string(),
            };
            *by.entry(name).or_default() += 1;
        }
        Ok(by)
    }

    /// Per observer that has notifications pending (a column no observer watches: under its
    /// column's name): how many (distinct), and how long the oldest has waited, in ms
    /// (see [`crate::lag`]); counting at most `limit` notify cells.
    pub async fn backlog(
        &self,
        limit: usize,
    ) -> Result<std::collections::BTreeMap<String, Backlog>, TxnError> {
        let now_ts = self.client.oracle().next().await?;
        let now_ms = self.client.clock().now_ms();
        self.ts_clock.note(now_ts.0, now_ms);
        let cells = self.notify_cells(Bytes::new(), limit).await?;
        let mut oldest: std::collections::BTreeMap<String, u64> = Default::default();
        for c in &cells {
            let name = self.observer_name(&c.qualifier);
            let ts = oldest.entry(name).or_insert(u64::MAX);
            *ts = (*ts).min(c.ts.0);
        }
        let mut by = std::collections::BTreeMap::new();
        for p in collapse(cells) {
            let name = self.observer_name(&p.column);
            let b = by.entry(name.clone()).or_insert_with(|| {
                let written = self.ts_clock.time_of(oldest[&name]).unwrap_or(now_ms);
                Backlog { pending: 0, oldest_ms: now_ms.saturating_sub(written) }
            });
            b.pending += 1;
        }
        Ok(by)
    }

    /// Takes a sample of when timestamps are handed out (see [`crate::lag`]): the workers'
    /// heartbeat does, so that a backlog's ages are right within a heartbeat while no run
    /// begins.
    pub(crate) async fn note_time(&self) -> Result<(), TxnError> {
        let ts = self.client.oracle().next().await?;
        self.ts_clock.note(ts.0, self.client.clock().now_ms());
        Ok(())
    }

    fn observer_name(&self, column: &[u8]) -> String {
        match self.registry.get(column) {
            Some(reg) => reg.name.to_string(),
            None => column.escape_ascii().to_string(),
        }
    }

    /// Processes one notification: see the module docs. A settled notification is cleared
    /// before this returns.
    pub async fn process(&self, p: &Pending) -> Result<RunOutcome, TxnError> {
        self.process_with(p, Clear::Now).await
    }

    async fn process_with(&self, p: &Pending, clear: Clear) -> Result<RunOutcome, TxnError> {
        let key = (p.row.clone(), p.column.clone());
        if clear == Clear::Deferred && self.clear_deferred(&key, p.ts) {
            // Settled by an earlier run whose clear waits: a scan read it in between.
            return Ok(RunOutcome::Skipped);
        }
        let Some(reg) = self.registry.get(&p.column) else {
            self.clear(p, clear).await?;
            return Ok(RunOutcome::NoObserver);
        };
        let now = self.client.clock().now_ms();
        if self.failures_lock().get(&key).is_some_and(|f| f.not_before_ms > now) {
            return Ok(RunOutcome::Busy);
        }
        let Some(lease) = self.lease.try_acquire(&p.row, &p.column).await else {
            self.lease_refused.fetch_add(1, Ordering::Relaxed);
            return Ok(RunOutcome::Busy);
        };
        let counters = &self.counters[&reg.name];
        let commit_by = lease.commit_by_ms();
        let mut attempt = 0;
        loop {
            let started = Instant::now();
            // A panic in the run (a bug, in the observer or beneath it) fails the run as an
            // error would: its transaction is dropped uncommitted (a commit cut short before
            // its commit point rolls its primary back, so its locks are cleaned on sight),
            // and the notification backs off and is parked after `failures_max`. Unwinding
            // through the worker instead would leave the run counted in flight and its
            // notification marked running, and the workers would never go quiet.
            let run = AssertUnwindSafe(self.run_once(reg, p, counters, clear, None, commit_by))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Err(ObserverError::Failed(format!("panicked: {}", panic_text(&*panic))))
                });
            match run {
                Ok(done) => {
                    let ran = done != Attempt::Unchanged;
                    match done {
                        Attempt::Committed => {
                            let took = started.elapsed();
                            let us = took.as_micros() as u64;
                            counters
                                .run_seconds
                                .get_or_init(|| {
                                    let name = reg.name.clone();
                                    metrics::histogram!("perc_observer_run_seconds", "observer" => name)
                                })
                                .record(took.as_secs_f64());
                            counters.commits.fetch_add(1, Ordering::Relaxed);
                            counters.latency_us_total.fetch_add(us, Ordering::Relaxed);
                            counters.latency_us_max.fetch_max(us, Ordering::Relaxed);
                        }
                        Attempt::Idle => {
                            counters.idle.fetch_add(1, Ordering::Relaxed);
                        }
                        Attempt::Unchanged => {
                            counters.skipped.fetch_add(1, Ordering::Relaxed);
                        }
                        Attempt::LeaseRunningOut => {
                            // A run this long every time would never commit: say so, and
                            // what to raise. The notification stays for a later scan.
                            tracing::warn!(observer = %reg.name, row = %p.row.escape_ascii(), "the run outlasted three quarters of its lease (workers.lease_ttl_ms) and committed nothing; it is left to a later scan");
                            return Ok(RunOutcome::Busy);
                        }
                    }
                    if done != Attempt::Committed || clear == Clear::Deferred {
                        self.clear(p, clear).await?;
                    }
                    self.succeeded(&key).await?;
                    if ran {
                        tracing::debug!(observer = %reg.name, row = %p.row.escape_ascii(), "observer ran");
                    }
                    return Ok(if ran { RunOutcome::Ran } else { RunOutcome::Skipped });
                }
                Err(ObserverError::Txn(e)) if e.is_retryable() => {
                    tracing::debug!(observer = %reg.name, row = %p.row.escape_ascii(), error = %e, "observer run conflicted");
                    counters.conflicts.fetch_add(1, Ordering::Relaxed);
                    if attempt >= self.config.conflict_retries {
                        return Ok(RunOutcome::Conflict);
                    }
                    let pause = self.client.backoff_ms(attempt);
                    attempt += 1;
                    self.client.clock().sleep_ms(pause).await;
                }
                Err(e) => {
                    counters.failures.fetch_add(1, Ordering::Relaxed);
                    if let ObserverError::Txn(txn) = &e {
                        self.note(txn);
                    }
                    if self.fatal().is_some() {
                        // Not the observer's failure: it stays pending, unparked, and the
                        // engine's fatal error ends the run.
                        return Ok(RunOutcome::Failed);
                    }
                    tracing::warn!(observer = %reg.name, row = %p.row.escape_ascii(), error = %e, "observer run failed");
                    return self.failed(reg, p, e.to_string(), counters).await;
                }
            }
        }
    }

    /// Fault injection: one run of `p`'s observer whose commit stops at `step`, as a crash of
    /// the worker there would leave it; the notification is not cleared. Returns whether the
    /// observer ran. For tests (the `failpoints` feature); workers call [`Self::process`].
    #[cfg(feature = "failpoints")]
    pub async fn process_crashing_at(
        &self,
        p: &Pending,
        step: CommitStep,
    ) -> Result<bool, ObserverError> {
        let reg = self
            .registry
            .get(&p.column)
            .ok_or_else(|| ObserverError::Failed("no observer watches this column".into()))?;
        let counters = &self.counters[&reg.name];
        let attempt = self.run_once(reg, p, counters, Clear::Now, Some(step), None).await?;
        Ok(attempt != Attempt::Unchanged)
    }

    /// One attempt: whether the observer ran, and if so whether it committed (unless `crash`
    /// stopped the commit, or its lease was running out: past `commit_by` ms, see
    /// [`crate::LeaseGuard::commit_by_ms`]) or had nothing to commit.
    async fn run_once(
        &self,
        reg: &Registration,
        p: &Pending,
        counters: &Counters,
        clear: Clear,
        crash: Option<CommitStep>,
        commit_by: Option<u64>,
    ) -> Result<Attempt, ObserverError> {
        let mut txn = self.client.begin().await?;
        self.ts_clock.note(txn.start_ts().0, self.client.clock().now_ms());
        let ack_column = reg.ack_column();
        // One read for the ack, the trigger's newest commit and the columns of this row the
        // observer read in earlier runs (the paper's prefetching): its `get`s then hit the
        // transaction's cache.
        let mut cells = vec![(p.row.clone(), ack_column)];
        if reg.kind == NotifyKind::Strong {
            cells.push((p.row.clone(), p.column.clone()));
        }
        cells.extend(self.learned_columns(&reg.name).into_iter().map(|c| (p.row.clone(), c)));
        let versions = txn.versions(&cells).await?;
        let ack = match versions[0].as_ref().and_then(|v| v.value.as_ref()) {
            Some(raw) => Ts(u64::from_be_bytes(raw.as_ref().try_into().map_err(|_| {
                TxnError::Corrupt(format!("ack of {} on {}", reg.name, p.row.escape_ascii()))
            })?)),
            None => Ts::ZERO,
        };
        let ack = ack.max(self.idle_ack(p));
        let changed = match reg.kind {
            NotifyKind::Strong => versions[1].as_ref().is_some_and(|v| v.commit_ts > ack),
            NotifyKind::Weak => p.ts > ack,
        };
        if !changed {
            return Ok(Attempt::Unchanged);
        }
        counters.runs.fetch_add(1, Ordering::Relaxed);
        let result = reg.observer.observe(&mut txn, &p.row, &p.column).await;
        self.learn(reg, p, &txn);
        result?;
        if txn.is_empty() {
            // The run found nothing to change: it commits nothing, not even its ack (a
            // transaction of two conditional mutations and a flush). A second run of the same
            // notification, should the clear below be lost, reads and writes nothing again.
            let mut idle = self.idle_acks.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() >= IDLE_ACKS_MAX {
                idle.clear();
            }
            idle.insert((p.row.clone(), p.column.clone()), txn.start_ts());
            return Ok(Attempt::Idle);
        }
        if commit_by.is_some_and(|by| self.client.clock().now_ms() > by) {
            return Ok(Attempt::LeaseRunningOut);
        }
        record_run(&mut txn, &p.row, &reg.name);
        if clear == Clear::Now {
            // The notification is cleared in the call that commits the secondaries.
            txn.after_commit(notify_delete(p));
        }
        let notifies = txn.notifies();
        match crash {
            None => {
                txn.commit().await?;
                if notifies {
                    self.notifying_commits.fetch_add(1, Ordering::SeqCst);
                }
            }
            #[cfg(feature = "failpoints")]
            Some(step) => {
                txn.commit_crashing_at(step).await?;
            }
            #[cfg(not(feature = "failpoints"))]
            Some(_) => unreachable!("crash points come only with the failpoints feature"),
        }
        Ok(Attempt::Committed)
    }

    /// Deletes `p`'s notify cells up to its `ts`: now, or with the other deferred clears.
    async fn clear(&self, p: &Pending, clear: Clear) -> Result<(), TxnError> {
        if clear == Clear::Now {
            self.store().mutate_rows(&[notify_delete(p)]).await?;
            return Ok(());
        }
        let full = {
            let mut deferred = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
            let ts = deferred.entry((p.row.clone(), p.column.clone())).or_insert(p.ts);
            *ts = (*ts).max(p.ts);
            deferred.len() >= DEFERRED_CLEARS_MAX
        };
        if full {
            self.flush_clears().await?;
        }
        Ok(())
    }

    /// Whether the notification `key` up to `ts` is settled and waits for its clear.
    fn clear_deferred(&self, key: &(Bytes, Bytes), ts: Ts) -> bool {
        let deferred = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        deferred.get(key).is_some_and(|&at| at >= ts)
    }

    /// Deletes the notify cells of every deferred clear, in one call: before each read of the
    /// notify family here, and when a step or the workers stop.
    pub async fn flush_clears(&self) -> Result<(), TxnError> {
        let _flushing = self.flushing.lock().await;
        let taken = std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|e| e.into_inner()));
        let mut batch: Vec<RowMutation> = Vec::new();
        for ((row, column), ts) in taken {
            let delete = notify_delete(&Pending { row, column, ts });
            match batch.last_mut() {
                Some(last) if last.row == delete.row => last.mutations.extend(delete.mutations),
                _ => batch.push(delete),
            }
        }
        if !batch.is_empty() {
            self.store().mutate_rows(&batch).await?;
        }
        Ok(())
    }

    /// The start of the last idle run of `p`'s observer on its row in this process, if any.
    fn idle_ack(&self, p: &Pending) -> Ts {
        let idle = self.idle_acks.lock().unwrap_or_else(|e| e.into_inner());
        idle.get(&(p.row.clone(), p.column.clone())).copied().unwrap_or(Ts::ZERO)
    }

    /// Columns of the notified row that `observer` read in earlier runs.
    fn learned_columns(&self, observer: &str) -> Vec<Bytes> {
        let learned = self.learned.lock().unwrap_or_else(|e| e.into_inner());
        learned.get(observer).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    /// Remembers which columns of the notified row this run read, for the next run's
    /// prefetch; at most [`PREFETCH_COLUMNS_MAX`] per observer.
    fn learn(&self, reg: &Registration, p: &Pending, txn: &perc_txn::Transaction) {
        let mut learned = self.learned.lock().unwrap_or_else(|e| e.into_inner());
        let set = learned.entry(reg.name.clone()).or_default();
        let ack = reg.ack_column();
        for (row, column) in txn.read_set() {
            if row == p.row && set.len() < PREFETCH_COLUMNS_MAX && column != ack {
                set.insert(column);
            }
        }
    }

    fn failures_lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Bytes, Bytes), Failure>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn succeeded(&self, key: &(Bytes, Bytes)) -> Result<(), TxnError> {
        self.failures_lock().remove(key);
        let was_parked = self.parked.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
        if was_parked {
            let m = Mutation::Delete {
                column: Column::new(PARKED.name, key.1.clone()),
                range: TsRange::ALL,
            };
            self.store()
                .mutate_rows(&[RowMutation { row: key.0.clone(), mutations: vec![m] }])
                .await?;
        }
        Ok(())
    }

    /// Records a failure: back off, or after `failures_max` park the notification.
    async fn failed(
        &self,
        reg: &Registration,
        p: &Pending,
        error: String,
        counters: &Counters,
    ) -> Result<RunOutcome, TxnError> {
        let key = (p.row.clone(), p.column.clone());
        let count = {
            let now = self.client.clock().now_ms();
            let mut failures = self.failures_lock();
            let f = failures.entry(key.clone()).or_insert(Failure { count: 0, not_before_ms: 0 });
            f.count += 1;
            let backoff = self.config.failure_backoff_ms.saturating_mul(1 << f.count.min(16));
            f.not_before_ms = now + backoff;
            f.count
        };
        if count < self.config.failures_max {
            return Ok(RunOutcome::Failed);
        }
        let detail = format!("{}: {error}", reg.name);
        let record = Mutation::Put {
            column: Column::new(PARKED.name, p.column.clone()),
            ts: Ts::ZERO,
            value: Bytes::from(detail),
        };
        // The failure record first: a crash in between leaves the notification pending
        // (run again), never a notification gone with no record of why.
        self.store()
            .mutate_rows(&[RowMutation { row: p.row.clone(), mutations: vec![record] }])
            .await?;
        self.store().mutate_rows(&[notify_delete(p)]).await?;
        self.failures_lock().remove(&key);
        self.parked.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
        counters.parked.fetch_add(1, Ordering::Relaxed);
        Ok(RunOutcome::Parked)
    }

    /// Parked notifications, in (row, column) order.
    pub async fn failed_list(&self) -> Result<Vec<FailedEntry>, TxnError> {
        let scan = Scan::whole(PARKED.name, usize::MAX);
        Ok(self
            .store()
            .scan(&scan)
            .await?
            .into_iter()
            .filter(|c| c.row.as_ref() != PARKED_MOVED_ROW)
            .map(|c| FailedEntry {
                row: c.row,
                column: c.qualifier,
                detail: String::from_utf8_lossy(&c.value).into(),
            })
            .collect())
    }

    /// Learns the parked notifications already in the store, so that a later success clears
    /// their record (a worker calls this when it starts). The first call on a store also
    /// moves the records an older perc kept in [`FAILED`].
    pub async fn load_parked(&self) -> Result<(), TxnError> {
        self.move_failed_records().await?;
        let list = self.failed_list().await?;
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        parked.extend(list.into_iter().map(|f| (f.row, f.column)));
        Ok(())
    }

    /// Moves the parked records of [`FAILED`] into [`PARKED`], once per store: a scan of the
    /// whole table, then a mark that it was done. Copies first and the mark after them, so a
    /// crash in between moves them again (the same cells: harmless); the old records go last.
    async fn move_failed_records(&self) -> Result<(), TxnError> {
        let moved = Column::new(PARKED.name, Bytes::from_static(PARKED_MOVED_COLUMN));
        let read = [perc_store::ColumnRead::newest(moved.clone(), TsRange::ALL)];
        let row = Bytes::from_static(PARKED_MOVED_ROW);
        if self.store().read_row(&row, &read).await?.iter().any(|v| !v.is_empty()) {
            return Ok(());
        }
        let scan = Scan::whole(FAILED.name, usize::MAX);
        let old = self.store().scan(&scan).await?;
        let put = |c: &perc_store::ScanCell| RowMutation {
            row: c.row.clone(),
            mutations: vec![Mutation::Put {
                column: Column::new(PARKED.name, c.qualifier.clone()),
                ts: Ts::ZERO,
                value: c.value.clone(),
            }],
        };
        let mut copies: Vec<RowMutation> = old.iter().map(put).collect();
        copies.push(RowMutation {
            row,
            mutations: vec![Mutation::Put { column: moved, ts: Ts::ZERO, value: Bytes::new() }],
        });
        self.store().mutate_rows(&copies).await?;
        if !old.is_empty() {
            tracing::info!(
                records = old.len(),
                "moved the parked notifications to their own family"
            );
            let deletes: Vec<RowMutation> = old
                .iter()
                .map(|c| RowMutation {
                    row: c.row.clone(),
                    mutations: vec![Mutation::Delete {
                        column: Column::new(FAILED.name, c.qualifier.clone()),
                        range: TsRange::ALL,
                    }],
                })
                .collect();
            self.store().mutate_rows(&deletes).await?;
        }
        Ok(())
    }

    /// Runs one notification with the in-flight bookkeeping that quiescence relies on.
    /// A settled notification is cleared later, with others ([`Self::flush_clears`]).
    /// A run begun by [`Engine::begin_tracked`]; it counts as ended when it returns, or when
    /// its future is dropped (a worker's stop abandons a run that waits on the network).
    pub(crate) async fn process_tracked(&self, p: &Pending) -> Result<RunOutcome, TxnError> {
        let _ended = Tracked(self);
        let out = self.process_with(p, Clear::Deferred).await;
        if let Err(e) = &out {
            self.note(e);
        }
        out
    }

    pub(crate) fn begin_tracked(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    /// One pass over every pending notification, in row order, one at a time: the
    /// deterministic way to drive the framework (tests, and single-threaded tools).
    pub async fn step(&self) -> Result<StepReport, TxnError> {
        let mut report = StepReport::default();
        let mut start = Bytes::new();
        loop {
            let (batch, next) = self.scan(&start, self.config.scan_batch).await?;
            for p in &batch {
                self.begin_tracked();
                report.add(self.process_tracked(p).await?);
            }
            match next {
                Some(n) => start = n,
                None => {
                    self.flush_clears().await?;
                    return Ok(report);
                }
            }
        }
    }

    /// Steps until a step settles nothing; returns the total. Notifications left are ones
    /// waiting out a failure backoff or a lease.
    pub async fn run_until_quiet(&self) -> Result<StepReport, TxnError> {
        let mut total = StepReport::default();
        loop {
            let r = self.step().await?;
            total += r;
            if r.settled() == 0 {
                return Ok(total);
            }
        }
    }

    /// Leases this process was refused: another scanner, of this process or another, held
    /// the notification.
    pub fn lease_refusals(&self) -> u64 {
        self.lease_refused.load(Ordering::Relaxed)
    }

    /// Leases this process took over from dead workers.
    pub fn lease_takeovers(&self) -> u64 {
        self.lease.takeovers()
    }

    /// Every observer's counters, by name.
    pub fn stats(&self) -> Vec<ObserverStats> {
        self.counters
            .iter()
            .map(|(name, c)| {
                let commits = c.commits.load(Ordering::Relaxed);
                ObserverStats {
                    name: name.clone(),
                    runs: c.runs.load(Ordering::Relaxed),
                    commits,
                    idle: c.idle.load(Ordering::Relaxed),
                    skipped: c.skipped.load(Ordering::Relaxed),
                    conflicts: c.conflicts.load(Ordering::Relaxed),
                    failures: c.failures.load(Ordering::Relaxed),
                    parked: c.parked.load(Ordering::Relaxed),
                    latency_us_total: c.latency_us_total.load(Ordering::Relaxed),
                    latency_us_mean: c.latency_us_total.load(Ordering::Relaxed) / commits.max(1),
                    latency_us_max: c.latency_us_max.load(Ordering::Relaxed),
                }
            })
            .collect()
    }
}

/// What a panic said, for the parked record: its message if it had one.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
