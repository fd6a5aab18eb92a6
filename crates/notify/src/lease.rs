//! Advisory leases that keep two workers off one notification at a time.
//!
//! Advisory: correctness never depends on them (the ack column makes a second run commit
//! nothing twice); they only save wasted runs. [`LocalLease`] serves one process (the
//! embedded mode); [`StoreLease`] serves many processes sharing a store (distributed mode),
//! with expiry, so a dead worker's leases free themselves:
//!
//! ```text
//!   family "lease"   row = the notification's row   qualifier = its column
//!   one cell, at ts = the wall-clock ms it expires; value = the holder
//!   acquire: check_and_mutate(no cell at ts > now) { delete all; put at now + ttl }
//!   release: delete the cell at exactly our expiry
//! ```

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use perc_store::{
    Column, Condition, FamilySpec, Locality, Mutation, RowMutation, Store, Ts, TsRange,
};
use perc_txn::Clock;

/// Where [`StoreLease`] keeps its cells.
pub const LEASE: FamilySpec = FamilySpec { name: "lease", locality: Locality::Row };

#[async_trait]
pub trait RowLease: Send + Sync + 'static {
    /// Takes the lease on `(row, column)` if nobody holds it.
    async fn try_acquire(&self, row: &Bytes, column: &Bytes) -> Option<LeaseGuard>;
}

/// Releases its lease when dropped.
pub struct LeaseGuard {
    release: Option<Box<dyn FnOnce() + Send>>,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release();
        }
    }
}

/// Leases held in this process's memory.
#[derive(Default, Clone)]
pub struct LocalLease {
    held: Arc<Mutex<HashSet<(Bytes, Bytes)>>>,
}

#[async_trait]
impl RowLease for LocalLease {
    async fn try_acquire(&self, row: &Bytes, column: &Bytes) -> Option<LeaseGuard> {
        let key = (row.clone(), column.clone());
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if !held.insert(key.clone()) {
            return None;
        }
        let set = self.held.clone();
        Some(LeaseGuard {
            release: Some(Box::new(move || {
                set.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
            })),
        })
    }
}

/// Leases kept in the store, shared by every process that uses it; see the module docs.
/// A store error while leasing counts as "not leased here" for acquisition (the run waits for
/// a later scan) and is ignored on release (the lease expires).
pub struct StoreLease {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    ttl_ms: u64,
    holder: Bytes,
    /// Leases this process holds: a second local run does not even ask the store.
    local: LocalLease,
}

impl StoreLease {
    /// `holder` names this process in the lease cells (for people reading the table).
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, ttl_ms: u64, holder: &str) -> Self {
        StoreLease {
            store,
            clock,
            ttl_ms: ttl_ms.max(1),
            holder: Bytes::copy_from_slice(holder.as_bytes()),
            local: LocalLease::default(),
        }
    }
}

#[async_trait]
impl RowLease for StoreLease {
    async fn try_acquire(&self, row: &Bytes, column: &Bytes) -> Option<LeaseGuard> {
        let local = self.local.try_acquire(row, column).await?;
        let now = self.clock.now_ms();
        let expires = Ts(now + self.ttl_ms);
        let col = Column::new(LEASE.name, column.clone());
        let free = [Condition::NoCellIn { column: col.clone(), range: TsRange::from(Ts(now + 1)) }];
        let take = [
            Mutation::Delete { column: col.clone(), range: TsRange::ALL },
            Mutation::Put { column: col.clone(), ts: expires, value: self.holder.clone() },
        ];
        match self.store.check_and_mutate(row, &free, &take).await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                tracing::debug!(error = %e, "lease not taken");
                return None;
            }
        }
        let store = self.store.clone();
        let row = row.clone();
        Some(LeaseGuard {
            release: Some(Box::new(move || {
                drop(local);
                let delete = RowMutation {
                    row,
                    mutations: vec![Mutation::Delete { column: col, range: TsRange::at(expires) }],
                };
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    handle.spawn(async move {
                        if let Err(e) = store.mutate_rows(&[delete]).await {
                            tracing::debug!(error = %e, "lease left to expire");
                        }
                    });
                }
            })),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_holder_at_a_time_and_release_on_drop() {
        let lease = LocalLease::default();
        let (r, c) = (Bytes::from_static(b"r"), Bytes::from_static(b"c"));
        let g = lease.try_acquire(&r, &c).await.expect("free");
        assert!(lease.try_acquire(&r, &c).await.is_none());
        assert!(lease.try_acquire(&r, &Bytes::from_static(b"other")).await.is_some());
        drop(g);
        assert!(lease.try_acquire(&r, &c).await.is_some());
    }

    #[tokio::test]
    async fn store_leases_exclude_other_processes_and_expire() {
        let store: Arc<dyn Store> =
            Arc::new(perc_store::MemStore::new(perc_store::Schema::new([LEASE])));
        let clock = Arc::new(perc_txn::ManualClock::new(1_000_000));
        let a = StoreLease::new(store.clone(), clock.clone(), 1_000, "a");
        let b = StoreLease::new(store.clone(), clock.clone(), 1_000, "b");
        let (r, c) = (Bytes::from_static(b"r"), Bytes::from_static(b"c"));
        let held = a.try_acquire(&r, &c).await.expect("free");
        assert!(b.try_acquire(&r, &c).await.is_none(), "held by a");
        assert!(a.try_acquire(&r, &c).await.is_none(), "held by a, in this process too");
        // a dies holding it: after the TTL, b takes it.
        std::mem::forget(held);
        clock.advance_ms(999);
        assert!(b.try_acquire(&r, &c).await.is_none(), "not yet expired");
        clock.advance_ms(1);
        let g = b.try_acquire(&r, &Bytes::from_static(b"c")).await.expect("expired");
        drop(g);
        // Release is a spawned delete: wait for it through the store itself.
        let col = Column::new(LEASE.name, c.clone());
        loop {
            let got = store
                .read_row(&r, &[perc_store::ColumnRead::newest(col.clone(), TsRange::ALL)])
                .await
                .unwrap();
            if got[0].is_empty() {
                break;
            }
            tokio::task::yield_now().await;
        }
        // (a's own memory still holds it: a "died" by forgetting its guard.)
        let fresh = StoreLease::new(store.clone(), clock.clone(), 1_000, "fresh");
        assert!(fresh.try_acquire(&r, &c).await.is_some(), "released");
    }
}
