//! Percolator transactions: cross-row, snapshot-isolation ACID transactions built from the
//! store's single-row conditional mutation (the paper's §2.2 and Figure 6).
//!
//! Every user column `c` of a row is kept as three store columns, one per family:
//!
//! ```text
//!   row "a"   lock:c                   write:c                     data:c
//!             ts 9 -> {primary a/c,    ts 8 -> {put, start 7}      ts 9 -> "v3"   (locked)
//!                      owner, wall}    ts 6 -> {rollback, start 6} ts 7 -> "v2"
//!                                      ts 5 -> {put, start 4}      ts 4 -> "v1"
//! ```
//!
//! A reader at `start_ts` sees the newest `write` record at or below `start_ts` (skipping
//! rollback records) and reads `data` at the start_ts that record names; a lock at or below
//! `start_ts` means a commit that may land below it, so the reader waits, or resolves the
//! lock through its primary when the owner is dead or the lock is stale ([`actions::resolve`]).
//! A writer buffers, then commits in two phases: prewrite (one conditional mutation per row,
//! primary's row first), then commit the primary (the commit point, made durable with
//! [`Store::sync`]), then the secondaries in one batch.
//!
//! The files: [`Client`] (registration, liveness, retries), [`Transaction`]'s snapshot reads
//! and buffered writes, the commit, the lock [`actions`] readers and writers share, and
//! [`gc`] of versions no live transaction can read. What this layer leaves out: it reads no
//! wall clock and spawns nothing ([`Clock`] and the runtime are the caller's, and so is the
//! schedule of garbage collection).

pub mod actions;
mod client;
pub mod clock;
mod commit;
pub mod error;
pub mod gc;
pub mod liveness;
pub mod record;
mod scan;
mod transaction;

use perc_store::FamilySpec;

pub use actions::{CellWrite, Resolution, TxnStatus};
pub use client::Client;
pub use clock::{Clock, ManualClock, SystemClock};
pub use commit::{CommitStep, Crashed};
pub use error::{Retryable, TxnError};
pub use liveness::{Liveness, ProcessKind};
pub use record::{ClientId, LockRecord, WriteKind, WriteRecord};
pub use scan::{Found, RangeScan};
pub use transaction::{Probes, Transaction, Version};

/// The families this layer needs in the store's schema.
pub const FAMILIES: [FamilySpec; 5] =
    [actions::DATA, actions::LOCK, actions::WRITE, actions::NOTIFY, liveness::FAMILY];

/// Which columns have observers: a commit that writes one of them also sets its notify cell.
pub trait Watch: Send + Sync + 'static {
    fn watches(&self, column: &[u8]) -> bool;
}

/// No column is watched.
pub struct WatchNothing;

impl Watch for WatchNothing {
    fn watches(&self, _column: &[u8]) -> bool {
        false
    }
}

/// Tuning, every duration in milliseconds.
#[derive(Clone, Debug)]
pub struct TxnConfig {
    /// A lock older than this may be cleaned even if its owner is alive (stuck).
    pub lock_ttl_ms: u64,
    /// A worker whose heartbeat is older than this counts as dead.
    pub liveness_ttl_ms: u64,
    /// First and largest backoff while waiting on a live lock; jittered.
    pub backoff_min_ms: u64,
    pub backoff_max_ms: u64,
    /// How long a read waits on a live owner's lock before giving up (retryable).
    pub lock_wait_max_ms: u64,
    /// Seed for backoff jitter, so runs are reproducible.
    pub seed: u64,
    /// The most `lock` and `write` records of a range that one store call of a scan reads
    /// ([`transaction::SCAN_PIECE_CELLS`]; tests make it small to cut scans into pieces).
    pub scan_piece_cells: usize,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            lock_ttl_ms: 10_000,
            liveness_ttl_ms: 5_000,
            backoff_min_ms: 1,
            backoff_max_ms: 100,
            lock_wait_max_ms: 30_000,
            seed: 0x5eed,
            scan_piece_cells: transaction::SCAN_PIECE_CELLS,
        }
    }
}
