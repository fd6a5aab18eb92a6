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
//!
//! Here the engine and its counters; in `run` one notification's run and clear; in
//! `pending` the scans that find notifications and count the backlog; in `failures` what a
//! failed run leaves (backoff, parking).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use perc_store::{FamilySpec, Locality, Mutation, RowMutation, ScanCell, Store, Ts, TsRange};
use perc_txn::{actions, Client, TxnError};

use crate::lease::{LocalLease, RowLease};
use crate::observer::{Registration, Registry};
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

mod failures;
mod pending;
mod run;

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

impl Counters {
    /// A run of the observer `name` committed after `took`.
    fn committed(&self, name: &str, took: std::time::Duration) {
        let us = took.as_micros() as u64;
        self.run_seconds
            .get_or_init(|| {
                let name = name.to_owned();
                metrics::histogram!("perc_observer_run_seconds", "observer" => name)
            })
            .record(took.as_secs_f64());
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.latency_us_total.fetch_add(us, Ordering::Relaxed);
        self.latency_us_max.fetch_max(us, Ordering::Relaxed);
    }
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
