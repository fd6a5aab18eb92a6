//! The timestamp oracle (the paper's §2.3): strictly increasing timestamps, never reused,
//! not even across a restart.
//!
//! A plain counter, not a hybrid clock: Cloud Bigtable keeps cell timestamps in microseconds
//! that must be multiples of 1000, so a perc timestamp is stored there as `ts * 1000` and must
//! stay below [`Ts::MAX`] (9 * 10^15).
//!
//! Block allocation, as in the paper: the oracle persists a high-water mark `hwm` in the store
//! and hands out timestamps only up to it. When the reserved block runs out, one caller writes
//! `hwm + block`, syncs it, and only then raises the in-memory limit; every other caller
//! waits for that one write. A restart begins above the persisted mark, so nothing handed out
//! before a crash is handed out again; it skips at most one block.
//!
//! ```text
//!   persisted hwm ──────────────┐
//!   handed out  [1 ........ next)  reserved [next ... hwm]   never [hwm+1 ...
//! ```
//!
//! Batching: within the reserved block a timestamp costs one atomic compare-and-swap, so
//! concurrent requests are served together without a lock; [`Oracle::next_batch`] reserves a
//! run of `n` at once for a client that needs several. Distributed mode runs one oracle as a
//! server (`perc oracle`) behind the same [`Oracle`] trait.
//!
//! Fencing: the mark is a cell whose *timestamp* is the high-water mark and whose value is
//! the oracle's epoch, and every reservation is a conditional write on it: "the newest mark
//! is still the one I wrote". Opening claims a new epoch and a first block above the newest
//! mark. So when a second oracle opens on the same store (a supervisor restarted one that
//! was only paused, or partitioned), the first one's next reservation fails: it answers
//! [`OracleError::Superseded`] from then on, and `perc oracle` exits. The two hand out
//! disjoint ranges: no timestamp is ever handed out twice. What fencing at the reservation
//! cannot stop is the old oracle handing out the rest of its block (below the new one's)
//! until it needs another: keep `oracle.block` small enough that this lasts a moment.
//!
//! ```text
//!   cell oracle:hwm   ts = hwm (the mark)   value = epoch (u64, big-endian)
//!   (before fencing: ts 0, value = hwm; read as epoch 0 and replaced at the first claim)
//! ```

pub mod net;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use perc_store::{
    Column, ColumnRead, Condition, FamilySpec, Locality, Mutation, Store, StoreError, Ts, TsRange,
};

/// The family that holds the oracle's high-water mark.
pub const FAMILY: FamilySpec = FamilySpec { name: "oracle", locality: Locality::Row };
const ROW: &[u8] = b"oracle";
const QUALIFIER: &[u8] = b"hwm";

#[derive(Debug, thiserror::Error)]
pub enum OracleError {
    #[error("the timestamp oracle cannot persist its reservation: {0}")]
    Store(#[from] StoreError),
    #[error("the timestamp oracle is exhausted: {requested} more would pass the maximum {max}")]
    Exhausted { requested: u64, max: Ts },
    #[error("the oracle's persisted high-water mark is corrupt: {0}")]
    Corrupt(String),
    #[error("the timestamp oracle is unreachable: {0}")]
    Unavailable(String),
    #[error(
        "this timestamp oracle (epoch {epoch}) was superseded: another oracle opened on the \
         same store and reserved timestamps above it; it no longer hands out any"
    )]
    Superseded { epoch: u64 },
}

/// A source of strictly increasing timestamps.
#[async_trait]
pub trait Oracle: Send + Sync + 'static {
    /// A timestamp greater than every one handed out before.
    async fn next(&self) -> Result<Ts, OracleError> {
        self.next_batch(1).await
    }

    /// The first of `n` consecutive timestamps, all greater than every one handed out before.
    async fn next_batch(&self, n: u32) -> Result<Ts, OracleError>;
}

pub use net::{serve, ClientConfig, RemoteOracle};

/// The in-process oracle, with its reservations persisted in a [`Store`].
pub struct LocalOracle {
    store: Arc<dyn Store>,
    block: u64,
    /// This oracle's epoch: one more than the epoch of the mark it found.
    epoch: u64,
    /// The next timestamp to hand out.
    next: AtomicU64,
    /// One past the persisted high-water mark (the mark this oracle last wrote): `next`
    /// never passes it.
    limit: AtomicU64,
    /// Serialises reservations (the only writers of `limit`).
    refill: tokio::sync::Mutex<()>,
    /// Set when a reservation found another oracle's mark: nothing is handed out after.
    superseded: std::sync::atomic::AtomicBool,
    superseded_signal: tokio::sync::Notify,
}

/// The newest mark in the store: (high-water mark, epoch, the timestamp of its cell, if there
/// is one).
async fn read_mark(store: &dyn Store) -> Result<(u64, u64, Option<Ts>), OracleError> {
    let got = store.read_row(ROW, &[ColumnRead::newest(column(), TsRange::ALL)]).await?;
    let Some(cell) = got[0].first() else { return Ok((0, 0, None)) };
    let raw: [u8; 8] = cell
        .value
        .as_ref()
        .try_into()
        .map_err(|_| OracleError::Corrupt(format!("{} bytes, expected 8", cell.value.len())))?;
    let value = u64::from_be_bytes(raw);
    Ok(if cell.ts == Ts::ZERO {
        // The format before fencing: the mark in the value, no epoch.
        (value, 0, Some(Ts::ZERO))
    } else {
        (cell.ts.0, value, Some(cell.ts))
    })
}

/// The oracle's state as its store holds it, for `perc status`: the epoch of the newest
/// oracle opened on the store (0: none since fencing) and the timestamps reserved so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoredMark {
    pub epoch: u64,
    pub reserved_to: u64,
}

/// Reads the [`StoredMark`] of `store`.
pub async fn stored_mark(store: &dyn Store) -> Result<StoredMark, OracleError> {
    let (reserved_to, epoch, _) = read_mark(store).await?;
    Ok(StoredMark { epoch, reserved_to })
}

/// Replaces the mark whose cell is at `current` (`None`: no mark yet) with `hwm` for
/// `epoch`, if it is still the newest; whether it was.
async fn write_mark(
    store: &dyn Store,
    current: Option<Ts>,
    hwm: u64,
    epoch: u64,
) -> Result<bool, OracleError> {
    let mut conditions = Vec::new();
    match current {
        None => conditions.push(Condition::NoCellIn { column: column(), range: TsRange::ALL }),
        Some(ts) => {
            conditions.push(Condition::CellAt { column: column(), ts });
            if ts < Ts::MAX {
                conditions.push(Condition::NoCellIn {
                    column: column(),
                    range: TsRange::from(ts.next()),
                });
            }
        }
    }
    let mut mutations = Vec::new();
    if let Some(ts) = current {
        mutations.push(Mutation::Delete { column: column(), range: TsRange::up_to(ts) });
    }
    mutations.push(Mutation::Put {
        column: column(),
        ts: Ts(hwm),
        value: Bytes::copy_from_slice(&epoch.to_be_bytes()),
    });
    let written = store.check_and_mutate(ROW, &conditions, &mutations).await?;
    if written {
        store.sync().await?;
    }
    Ok(written)
}

fn column() -> Column {
    Column::new(FAMILY.name, Bytes::from_static(QUALIFIER))
}

impl LocalOracle {
    /// Opens the oracle over `store` (whose schema must declare [`FAMILY`]), reserving `block`
    /// timestamps at a time. It claims a new epoch and its first block at once, which fences
    /// any oracle opened on the store before it.
    pub async fn open(store: Arc<dyn Store>, block: u64) -> Result<Self, OracleError> {
        assert!(block > 0, "oracle block must be positive");
        // Two oracles opening at once: one claim wins, the other reads the winner's mark and
        // claims above it.
        loop {
            let (hwm, epoch, current) = read_mark(store.as_ref()).await?;
            // Everything up to `hwm` may have been handed out before: start above it.
            let start = hwm + 1;
            if start > Ts::MAX.0 {
                return Err(OracleError::Exhausted { requested: 1, max: Ts::MAX });
            }
            let limit = (start + block).min(Ts::MAX.0 + 1);
            if write_mark(store.as_ref(), current, limit - 1, epoch + 1).await? {
                return Ok(LocalOracle {
                    store,
                    block,
                    epoch: epoch + 1,
                    next: AtomicU64::new(start),
                    limit: AtomicU64::new(limit),
                    refill: tokio::sync::Mutex::new(()),
                    superseded: std::sync::atomic::AtomicBool::new(false),
                    superseded_signal: tokio::sync::Notify::new(),
                });
            }
        }
    }

    /// This oracle's epoch (each oracle opened on a store has a higher one).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Returns once this oracle has found itself superseded by a newer one.
    pub async fn superseded(&self) {
        loop {
            let signal = self.superseded_signal.notified();
            if self.superseded.load(Ordering::Acquire) {
                return;
            }
            signal.await;
        }
    }

    /// Reads the newest mark and, if another oracle wrote it, stops handing out timestamps
    /// at once (rather than at this oracle's next reservation); whether it was superseded.
    /// [`serve`] calls it periodically.
    pub async fn check_fence(&self) -> Result<bool, OracleError> {
        let _no_refill = self.refill.lock().await;
        let mark = self.limit.load(Ordering::Acquire) - 1;
        if !self.superseded.load(Ordering::Acquire) {
            let (hwm, epoch, _) = read_mark(self.store.as_ref()).await?;
            if (hwm, epoch) != (mark, self.epoch) {
                self.supersede();
            }
        }
        Ok(self.superseded.load(Ordering::Acquire))
    }

    fn supersede(&self) {
        if !self.superseded.swap(true, Ordering::AcqRel) {
            tracing::error!(epoch = self.epoch, "{}", self.fenced());
        }
        self.superseded_signal.notify_waiters();
    }

    fn fenced(&self) -> OracleError {
        OracleError::Superseded { epoch: self.epoch }
    }

    /// Reserves a new block (or more, for a large batch) by persisting a higher mark.
    async fn refill(&self, n: u64) -> Result<(), OracleError> {
        let _one_writer = self.refill.lock().await;
        if self.superseded.load(Ordering::Acquire) {
            return Err(self.fenced());
        }
        let next = self.next.load(Ordering::Acquire);
        let limit = self.limit.load(Ordering::Acquire);
        if next + n <= limit {
            return Ok(()); // someone else refilled while we waited
        }
        let base = next.max(limit);
        if base + n - 1 > Ts::MAX.0 {
            return Err(OracleError::Exhausted { requested: n, max: Ts::MAX });
        }
        // Near the end of the range the block shrinks to what is left.
        let new_limit = (base + n.max(self.block)).min(Ts::MAX.0 + 1);
        let hwm = new_limit - 1;
        // The mark this oracle wrote last is one below its limit.
        if !write_mark(self.store.as_ref(), Some(Ts(limit - 1)), hwm, self.epoch).await? {
            self.supersede();
            return Err(self.fenced());
        }
        self.limit.store(new_limit, Ordering::Release);
        Ok(())
    }
}

#[async_trait]
impl Oracle for LocalOracle {
    async fn next_batch(&self, n: u32) -> Result<Ts, OracleError> {
        let n = u64::from(n.max(1));
        loop {
            if self.superseded.load(Ordering::Acquire) {
                return Err(self.fenced());
            }
            let cur = self.next.load(Ordering::Acquire);
            // `limit` only grows, so a stale read is merely conservative.
            let limit = self.limit.load(Ordering::Acquire);
            if cur + n <= limit {
                if self
                    .next
                    .compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return Ok(Ts(cur));
                }
                continue;
            }
            self.refill(n).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use perc_store::{MemStore, RowMutation, Schema, SledOptions, SledStore};

    fn schema() -> Schema {
        Schema::new([FAMILY])
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn strictly_increasing_under_concurrency() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new(schema()));
        // A tiny block makes the refill path run constantly.
        let oracle = Arc::new(LocalOracle::open(store, 7).await.unwrap());
        let mut tasks = Vec::new();
        for t in 0..8u32 {
            let oracle = oracle.clone();
            tasks.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                for i in 0..2000u32 {
                    let n = 1 + (i + t) % 3;
                    let first = oracle.next_batch(n).await.unwrap();
                    let mut last = seen.last().copied().unwrap_or(Ts::ZERO);
                    for k in 0..u64::from(n) {
                        let ts = Ts(first.0 + k);
                        assert!(ts > last, "per-task order: {ts:?} after {last:?}");
                        last = ts;
                        seen.push(ts);
                    }
                }
                seen
            }));
        }
        let mut all: Vec<Ts> = Vec::new();
        for t in futures::future::join_all(tasks).await {
            all.extend(t.unwrap());
        }
        let total = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), total, "no timestamp handed out twice");
        assert!(all[0] > Ts::ZERO);
    }

    #[tokio::test]
    async fn restart_never_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let mut last = Ts::ZERO;
        for round in 0..5 {
            let store: Arc<dyn Store> =
                Arc::new(SledStore::open(dir.path(), schema(), &SledOptions::default()).unwrap());
            let oracle = LocalOracle::open(store, 10).await.unwrap();
            for _ in 0..(round * 7 + 3) {
                let ts = oracle.next().await.unwrap();
                assert!(ts > last, "round {round}: {ts:?} after {last:?}");
                last = ts;
            }
        }
    }

    /// Hands out timestamps from `oracle` until it is superseded or `n` are out.
    async fn drain(oracle: &LocalOracle, n: usize) -> (Vec<Ts>, bool) {
        let mut got = Vec::new();
        for _ in 0..n {
            match oracle.next().await {
                Ok(ts) => got.push(ts),
                Err(OracleError::Superseded { epoch }) => {
                    assert_eq!(epoch, oracle.epoch());
                    return (got, true);
                }
                Err(e) => panic!("{e}"),
            }
        }
        (got, false)
    }

    #[tokio::test]
    async fn a_second_oracle_fences_the_first_and_none_hands_out_a_timestamp_twice() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new(schema()));
        let first = LocalOracle::open(store.clone(), 10).await.unwrap();
        let (mut all, superseded) = drain(&first, 15).await;
        assert!(!superseded);
        // A second oracle on the same store, while the first still runs (a paused process
        // that a supervisor replaced).
        let second = LocalOracle::open(store.clone(), 10).await.unwrap();
        assert_eq!(second.epoch(), first.epoch() + 1);
        let (from_second, _) = drain(&second, 25).await;
        // The first may finish its reserved block, then its next reservation fails.
        let (from_first, superseded) = drain(&first, 100).await;
        assert!(superseded, "the first oracle kept handing out timestamps");
        assert!(from_first.len() < 10, "{} more from a superseded oracle", from_first.len());
        let (more, _) = drain(&second, 25).await;
        all.extend(from_second.iter().chain(&from_first).chain(&more));
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a timestamp handed out twice");
        // The superseded oracle says so for good, and to a check as well.
        assert!(first.check_fence().await.unwrap());
        assert!(!second.check_fence().await.unwrap());
        assert!(matches!(first.next().await, Err(OracleError::Superseded { .. })));
    }

    #[tokio::test]
    async fn a_check_fences_at_once_without_waiting_for_a_reservation() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new(schema()));
        let first = LocalOracle::open(store.clone(), 1000).await.unwrap();
        first.next().await.unwrap();
        let _second = LocalOracle::open(store.clone(), 1000).await.unwrap();
        // Its block is not used up, so only the check finds the newer mark.
        assert!(first.check_fence().await.unwrap());
        assert!(matches!(first.next().await, Err(OracleError::Superseded { .. })));
        tokio::time::timeout(std::time::Duration::from_secs(5), first.superseded()).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn oracles_opened_concurrently_never_share_a_timestamp() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new(schema()));
        let mut tasks = Vec::new();
        for _ in 0..6 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let oracle = LocalOracle::open(store, 3).await.unwrap();
                drain(&oracle, 200).await.0
            }));
        }
        let mut all = Vec::new();
        for t in futures::future::join_all(tasks).await {
            all.extend(t.unwrap());
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n, "a timestamp handed out twice");
    }

    #[tokio::test]
    async fn a_mark_written_before_fencing_is_read_and_replaced() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new(schema()));
        let put = Mutation::Put {
            column: column(),
            ts: Ts::ZERO,
            value: Bytes::copy_from_slice(&500u64.to_be_bytes()),
        };
        store
            .mutate_rows(&[RowMutation { row: Bytes::from_static(ROW), mutations: vec![put] }])
            .await
            .unwrap();
        let oracle = LocalOracle::open(store.clone(), 10).await.unwrap();
        assert_eq!(oracle.epoch(), 1);
        assert_eq!(oracle.next().await.unwrap(), Ts(501));
        let marks = store.read_row(ROW, &[ColumnRead::all(column(), TsRange::ALL)]).await.unwrap();
        assert_eq!(marks[0].iter().map(|c| c.ts).collect::<Vec<_>>(), vec![Ts(510)]);
    }

    #[tokio::test]
    async fn exhaustion_is_an_error() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new(schema()));
        let put = Mutation::Put {
            column: column(),
            ts: Ts::ZERO,
            value: Bytes::copy_from_slice(&(Ts::MAX.0 - 5).to_be_bytes()),
        };
        store
            .mutate_rows(&[RowMutation { row: Bytes::from_static(ROW), mutations: vec![put] }])
            .await
            .unwrap();
        let oracle = LocalOracle::open(store, 1000).await.unwrap();
        // hwm = MAX - 5 was handed out; MAX - 4 ..= MAX remain.
        for _ in 0..4 {
            oracle.next().await.unwrap();
        }
        assert_eq!(oracle.next().await.unwrap(), Ts::MAX);
        let err = oracle.next().await.unwrap_err();
        assert!(err.to_string().contains("exhausted"), "{err}");
    }
}
