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
//! run of `n` at once for a client that needs several. A single oracle per store is assumed
//! (a second one would not see the first one's in-memory counter): distributed mode runs it
//! as one server (`perc oracle`) behind the same [`Oracle`] trait.

pub mod net;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use perc_store::{
    Column, ColumnRead, FamilySpec, Locality, Mutation, RowMutation, Store, StoreError, Ts, TsRange,
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
    /// The next timestamp to hand out.
    next: AtomicU64,
    /// One past the persisted high-water mark: `next` never passes it.
    limit: AtomicU64,
    refill: tokio::sync::Mutex<()>,
}

fn column() -> Column {
    Column::new(FAMILY.name, Bytes::from_static(QUALIFIER))
}

impl LocalOracle {
    /// Opens the oracle over `store` (whose schema must declare [`FAMILY`]), reserving `block`
    /// timestamps at a time.
    pub async fn open(store: Arc<dyn Store>, block: u64) -> Result<Self, OracleError> {
        assert!(block > 0, "oracle block must be positive");
        let got = store.read_row(ROW, &[ColumnRead::newest(column(), TsRange::ALL)]).await?;
        let hwm = match got[0].first() {
            None => 0,
            Some(cell) => {
                let raw: [u8; 8] = cell.value.as_ref().try_into().map_err(|_| {
                    OracleError::Corrupt(format!("{} bytes, expected 8", cell.value.len()))
                })?;
                u64::from_be_bytes(raw)
            }
        };
        // Everything up to `hwm` may have been handed out before a crash: start above it.
        let start = hwm + 1;
        Ok(LocalOracle {
            store,
            block,
            next: AtomicU64::new(start),
            limit: AtomicU64::new(start),
            refill: tokio::sync::Mutex::new(()),
        })
    }

    /// Reserves a new block (or more, for a large batch) by persisting a higher mark.
    async fn refill(&self, n: u64) -> Result<(), OracleError> {
        let _one_writer = self.refill.lock().await;
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
        let put = Mutation::Put {
            column: column(),
            ts: Ts::ZERO,
            value: Bytes::copy_from_slice(&hwm.to_be_bytes()),
        };
        self.store
            .mutate_rows(&[RowMutation { row: Bytes::from_static(ROW), mutations: vec![put] }])
            .await?;
        self.store.sync().await?;
        self.limit.store(new_limit, Ordering::Release);
        Ok(())
    }
}

#[async_trait]
impl Oracle for LocalOracle {
    async fn next_batch(&self, n: u32) -> Result<Ts, OracleError> {
        let n = u64::from(n.max(1));
        loop {
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
    use perc_store::{MemStore, Schema, SledOptions, SledStore};

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
