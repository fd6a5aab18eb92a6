//! The observer framework: the second half of the paper (its §2.4), knowing nothing about web
//! pages.
//!
//! An [`Observer`] watches one column. A transaction that writes a strongly watched column
//! sets that column's notify cell, at its commit_ts, before its commit point (the transaction
//! layer does this for the columns a [`Registry`] names). Workers scan the notify family and,
//! for each notification, run the observer in a fresh transaction that also writes the
//! observer's ack column; the ack makes message collapsing and "at most one commit per
//! notification" fall out of ordinary write-write conflicts ([`engine`]). Weak notifications
//! mark a row without a write, for hot rows. Scanners, bounded workers, quiescence and
//! the garbage collector's schedule are in [`workers`]; collection itself
//! is the transaction layer's ([`perc_txn::gc`]).
//!
//! ```text
//!   row "a"   data/lock/write  "page:body"            the watched column (transactional)
//!             data/lock/write  "perc.ack:parse"       start_ts of the observer's last run
//!             notify           "page:body" @ts        one cell per commit, own locality group
//!   failed    "page:body"                             parked after failures_max failures
//! ```

pub mod engine;
pub mod lag;
pub mod lease;
pub mod observer;
pub mod workers;

use std::sync::Arc;

use perc_oracle::Oracle;
use perc_store::{FamilySpec, Schema, Store};
use perc_txn::{Client, Clock, TxnConfig, TxnError};

pub use engine::{
    Backlog, Engine, FailedEntry, ObserverStats, Pending, RunOutcome, StepReport, FAILED, PARKED,
};
pub use lease::{LeaseGuard, LocalLease, RowLease, StoreLease};
pub use observer::{
    ack_column, record_run, NotifyKind, Observer, ObserverError, Registration, Registry,
    RegistryError,
};
pub use workers::Workers;

/// The families this layer adds to the schema.
pub const FAMILIES: [FamilySpec; 3] = [PARKED, FAILED, lease::LEASE];

/// Every family the layers up to this one need: transactions, oracle, notifications.
pub fn schema() -> Schema {
    let mut schema = Schema::new(perc_txn::FAMILIES);
    schema.add(perc_oracle::FAMILY);
    for f in FAMILIES {
        schema.add(f);
    }
    schema
}

/// Tuning; durations in milliseconds. Deserializes from the `[workers]` section of perc's
/// configuration; a key left out keeps its default.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    /// Scanner tasks walking the notify family; 0: this process runs no observers, and
    /// [`Workers::wait`] only watches for quiescence (the work is done elsewhere).
    pub scanners: usize,
    /// Observer runs in flight at once.
    pub concurrency: usize,
    /// Runs of observers that wait on the network ([`Observer::waits_on_io`]: fetch) in
    /// flight at once, beside `concurrency`: a run that waits for a slow host or its turn
    /// at a polite one never holds a permit that the stages which compute need.
    pub io_concurrency: usize,
    /// Notify cells read per scan call.
    pub scan_batch: usize,
    /// Retries of a run that conflicts, with jittered backoff, before leaving it for a later
    /// scan.
    pub conflict_retries: u32,
    /// Failures of one notification before it is parked in the failed list.
    pub failures_max: u32,
    /// Backoff after a failure, doubled with each further failure.
    pub failure_backoff_ms: u64,
    /// How long an idle scanner waits before looking again (or until woken): after a round
    /// that found nothing; doubled after each further empty round, up to `idle_max_ms`.
    pub idle_ms: u64,
    /// The longest an idle scanner waits between two looks at the store. A notification
    /// written by this process wakes it at once; one written by another process (a shared
    /// store) waits at most this long for an idle worker.
    pub idle_max_ms: u64,
    /// While the workers are busy (half the runs in flight or more), a weak notification
    /// waits up to this long after a scanner first sees it (sixteen times as long while an
    /// earlier stage, upstream work, has notifications too), so that the changes that keep
    /// arriving for it collapse into one run; 0 runs every notification at once. An idle
    /// worker never waits: a lone update is not delayed.
    pub gather_ms: u64,
    /// Expiry of a lease taken in the store ([`StoreLease`]), should its worker be stuck (a
    /// dead worker's leases are taken over once its liveness lapses).
    pub lease_ttl_ms: u64,
    /// How often a running process saves its counters to the store and logs its rate,
    /// backlog, conflicts and lease takeovers; 0: only when it stops.
    pub report_ms: u64,
    /// The shortest time between the starts of two collection passes (a pass also waits
    /// nine times as long as the last one took); 0 turns the background collector off.
    pub gc_interval_ms: u64,
    /// Seed of the scanners' random starts.
    pub seed: u64,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        NotifyConfig {
            scanners: 2,
            concurrency: 16,
            io_concurrency: 16,
            scan_batch: 512,
            conflict_retries: 8,
            failures_max: 5,
            failure_backoff_ms: 100,
            idle_ms: 20,
            idle_max_ms: 1000,
            gather_ms: 500,
            lease_ttl_ms: 30_000,
            report_ms: 10_000,
            gc_interval_ms: 10_000,
            seed: 0x0b5e,
        }
    }
}

/// A transaction client whose commits notify `registry`'s strongly observed columns.
pub async fn client_for(
    store: Arc<dyn Store>,
    oracle: Arc<dyn Oracle>,
    clock: Arc<dyn Clock>,
    config: TxnConfig,
    registry: Arc<Registry>,
) -> Result<Client, TxnError> {
    Client::with_watch(store, oracle, clock, config, registry).await
}
