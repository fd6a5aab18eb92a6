//! Leases that keep two workers off one notification at a time.
//!
//! Between two runs that both commit they only save work: both write the ack column, so of
//! two that overlap one retries. A run that finds nothing to write commits nothing, not even
//! its ack (see the engine), so it does not conflict with an older run of the same
//! notification still in flight, which could commit after it what an older snapshot showed.
//! The lease is what keeps that older run from overlapping, with the commit's refusal to
//! proceed once its own heartbeat lapsed (a lease is taken over only from a worker whose
//! heartbeat lapsed), and the engine's refusal to commit a run whose store lease has less
//! than a quarter of its TTL left ([`LeaseGuard::commit_by_ms`]): such a run leaves its
//! notification to a later scan. [`LocalLease`] serves one process (the
//! embedded mode); [`StoreLease`] serves many processes sharing a store (distributed mode).
//! A store lease is free when it expired, or when its holder is dead by the liveness
//! registry (its heartbeat older than the liveness TTL, or gone): a killed worker's
//! notifications are taken over as soon as its locks may be cleaned, not a lease TTL later.
//!
//! ```text
//!   family "lease"   row = the notification's row   qualifier = its column
//!   one cell, at ts = the wall-clock ms it expires; value = the holder's worker id (`ClientId::hex`)
//!   acquire:  check_and_mutate(no cell at ts > now) { delete all; put at now + ttl }
//!   take over (refused, and the holder read from the cell is dead):
//!             check_and_mutate(a cell at exactly the ts read) { delete all; put at now + ttl }
//!   release:  delete the cell at exactly our expiry
//! ```

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use perc_store::{
    Column, ColumnRead, Condition, FamilySpec, Locality, Mutation, RowMutation, Store, Ts, TsRange,
};
use perc_txn::{ClientId, Clock, Liveness};

/// Where [`StoreLease`] keeps its cells.
pub const LEASE: FamilySpec = FamilySpec { name: "lease", locality: Locality::Row };

#[async_trait]
pub trait RowLease: Send + Sync + 'static {
    /// Takes the lease on `(row, column)` if nobody (alive) holds it.
    async fn try_acquire(&self, row: &Bytes, column: &Bytes) -> Option<LeaseGuard>;

    /// Leases taken from dead holders so far.
    fn takeovers(&self) -> u64 {
        0
    }
}

/// Releases its lease when dropped.
pub struct LeaseGuard {
    release: Option<Box<dyn FnOnce() + Send>>,
    /// See [`Self::commit_by_ms`].
    commit_by_ms: Option<u64>,
}

impl LeaseGuard {
    /// The last moment (wall-clock ms) a run under this lease may begin its commit: a quarter
    /// of the TTL before the lease expires and another process may take it. `None` for a
    /// lease that lasts until released.
    pub fn commit_by_ms(&self) -> Option<u64> {
        self.commit_by_ms
    }
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
            commit_by_ms: None,
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
    liveness: Liveness,
    /// Holders found alive, and when (ms): a refused lease does not read the registry again
    /// for each notification of a live worker.
    alive: Mutex<HashMap<ClientId, u64>>,
    /// Notifications refused, and when first (ms). Most refusals are a live worker running
    /// the notification right now, done in a moment: only one refused for half a liveness
    /// TTL is worth reading its holder for (a holder is dead a full TTL after it stopped).
    refused: Mutex<HashMap<(Bytes, Bytes), u64>>,
    takeovers: AtomicU64,
    /// Leases this process holds: a second local run does not even ask the store.
    local: LocalLease,
}

/// Refused notifications remembered at most (then forgotten all at once: a refusal is
/// remembered again at the next scan pass).
const REFUSED_MAX: usize = 100_000;

impl StoreLease {
    /// Leases held by the worker `holder`, whose liveness `liveness` tells; other holders'
    /// liveness is read from the same registry.
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        ttl_ms: u64,
        holder: ClientId,
        liveness: Liveness,
    ) -> Self {
        StoreLease {
            store,
            clock,
            ttl_ms: ttl_ms.max(1),
            holder: holder.hex(),
            liveness,
            alive: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            takeovers: AtomicU64::new(0),
            local: LocalLease::default(),
        }
    }

    /// Whether `holder` is dead; a live answer is remembered for a fraction of the TTL.
    async fn is_dead(&self, holder: ClientId) -> bool {
        let now = self.clock.now_ms();
        let remember = (self.liveness.ttl_ms() / 4).max(1);
        let seen = self.alive.lock().unwrap_or_else(|e| e.into_inner()).get(&holder).copied();
        if seen.is_some_and(|at| now.saturating_sub(at) < remember) {
            return false;
        }
        match self.liveness.is_alive(holder).await {
            Ok(true) => {
                let mut alive = self.alive.lock().unwrap_or_else(|e| e.into_inner());
                alive.retain(|_, at| now.saturating_sub(*at) < remember);
                alive.insert(holder, now);
                false
            }
            Ok(false) => true,
            Err(e) => {
                tracing::debug!(error = %e, "liveness unknown; lease left to its holder");
                false
            }
        }
    }

    /// Whether `(row, column)` has been refused long enough to look at its holder.
    fn refused_long(&self, row: &Bytes, column: &Bytes, now: u64) -> bool {
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if refused.len() >= REFUSED_MAX {
            refused.clear();
        }
        let first = *refused.entry((row.clone(), column.clone())).or_insert(now);
        now.saturating_sub(first) >= self.liveness.ttl_ms() / 2
    }

    /// After a refusal: the lease's cell, if its holder is dead.
    async fn dead_holders_cell(&self, row: &Bytes, col: &Column) -> Option<Ts> {
        let read = [ColumnRead::newest(col.clone(), TsRange::ALL)];
        let cells = self.store.read_row(row, &read).await.ok()?;
        let cell = cells.first()?.first()?;
        let holder = ClientId::from_hex(&cell.value)?;
        self.is_dead(holder).await.then_some(cell.ts)
    }
}

/// A scan of every store lease, for [`leases_by_holder`] (`perc status` reads it in the same
/// call as the locks: both families live in the rows, and one walk over them reads both).
pub fn every_lease() -> perc_store::Scan {
    perc_store::Scan::whole(LEASE.name, usize::MAX)
}

/// The unexpired leases among `cells` (what [`every_lease`] found), by holder.
pub fn leases_by_holder(
    cells: &[perc_store::ScanCell],
    now_ms: u64,
) -> std::collections::BTreeMap<ClientId, usize> {
    let mut by = std::collections::BTreeMap::new();
    for cell in cells {
        if let Some(holder) = ClientId::from_hex(&cell.value).filter(|_| cell.ts.0 > now_ms) {
            *by.entry(holder).or_default() += 1;
        }
    }
    by
}

#[async_trait]
impl RowLease for StoreLease {
    async fn try_acquire(&self, row: &Bytes, column: &Bytes) -> Option<LeaseGuard> {
        let local = self.local.try_acquire(row, column).await?;
        let now = self.clock.now_ms();
        let expires = Ts(now + self.ttl_ms);
        let col = Column::new(LEASE.name, column.clone());
        let take = [
            Mutation::Delete { column: col.clone(), range: TsRange::ALL },
            Mutation::Put { column: col.clone(), ts: expires, value: self.holder.clone() },
        ];
        let free = [Condition::NoCellIn { column: col.clone(), range: TsRange::from(Ts(now + 1)) }];
        let taken = match self.store.check_and_mutate(row, &free, &take).await {
            Ok(true) => true,
            Ok(false) if !self.refused_long(row, column, now) => false,
            Ok(false) => match self.dead_holders_cell(row, &col).await {
                // The holder is dead: take it over, unless someone else just did.
                Some(ts) => {
                    let same = [Condition::CellAt { column: col.clone(), ts }];
                    let over = self.store.check_and_mutate(row, &same, &take).await;
                    if over.as_ref().is_ok_and(|t| *t) {
                        self.takeovers.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(row = %row.escape_ascii(), "took over a dead worker's lease");
                    }
                    over.unwrap_or(false)
                }
                None => false,
            },
            Err(e) => {
                tracing::debug!(error = %e, "lease not taken");
                false
            }
        };
        if !taken {
            return None;
        }
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(row.clone(), column.clone()));
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
            commit_by_ms: Some(expires.0 - self.ttl_ms / 4),
        })
    }

    fn takeovers(&self) -> u64 {
        self.takeovers.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store with leases and a liveness registry, on a manual clock.
    struct Env {
        store: Arc<dyn Store>,
        clock: Arc<perc_txn::ManualClock>,
        liveness: Liveness,
    }

    impl Env {
        fn new(liveness_ttl_ms: u64) -> Env {
            let families = perc_store::Schema::new([LEASE, perc_txn::liveness::FAMILY]);
            let store: Arc<dyn Store> = Arc::new(perc_store::MemStore::new(families));
            let clock = Arc::new(perc_txn::ManualClock::new(1_000_000));
            let liveness = Liveness::new(store.clone(), clock.clone(), liveness_ttl_ms);
            Env { store, clock, liveness }
        }
    }

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
        // Liveness for ever: only the lease's own expiry frees it here.
        let Env { store, clock, liveness } = Env::new(u64::MAX / 2);
        let lease = |id: u64| {
            StoreLease::new(store.clone(), clock.clone(), 1_000, ClientId(id), liveness.clone())
        };
        let (a, b) = (lease(1), lease(2));
        for id in [1, 2, 3] {
            liveness.heartbeat(ClientId(id), Ts(1)).await.unwrap();
        }
        let (r, c) = (Bytes::from_static(b"r"), Bytes::from_static(b"c"));
        let held = a.try_acquire(&r, &c).await.expect("free");
        assert!(b.try_acquire(&r, &c).await.is_none(), "held by a");
        assert!(a.try_acquire(&r, &c).await.is_none(), "held by a, in this process too");
        // a stops holding it without releasing (its process hangs): after the TTL, b takes it.
        std::mem::forget(held);
        clock.advance_ms(999);
        assert!(b.try_acquire(&r, &c).await.is_none(), "not yet expired");
        clock.advance_ms(1);
        let g = b.try_acquire(&r, &Bytes::from_static(b"c")).await.expect("expired");
        assert_eq!(b.takeovers(), 0, "an expired lease is free, not taken over");
        drop(g);
        // Release is a spawned delete: wait for it through the store itself.
        let col = Column::new(LEASE.name, c.clone());
        loop {
            let got = store.read_row(&r, &[ColumnRead::newest(col.clone(), TsRange::ALL)]).await;
            if got.unwrap()[0].is_empty() {
                break;
            }
            tokio::task::yield_now().await;
        }
        // (a's own memory still holds it: a "died" by forgetting its guard.)
        let fresh = lease(3);
        assert!(fresh.try_acquire(&r, &c).await.is_some(), "released");
    }

    #[tokio::test]
    async fn a_dead_holders_lease_is_taken_over_before_it_expires() {
        let Env { store, clock, liveness } = Env::new(100);
        let lease = |id: u64| {
            StoreLease::new(store.clone(), clock.clone(), 30_000, ClientId(id), liveness.clone())
        };
        let (a, b, c) = (lease(1), lease(2), lease(3));
        for id in [1, 2, 3] {
            liveness.heartbeat(ClientId(id), Ts(1)).await.unwrap();
        }
        let (r, col) = (Bytes::from_static(b"r"), Bytes::from_static(b"c"));
        std::mem::forget(a.try_acquire(&r, &col).await.expect("free"));
        assert!(b.try_acquire(&r, &col).await.is_none(), "a is alive");
        // a is killed: its heartbeat stops; b's and c's go on.
        clock.advance_ms(101);
        for id in [2, 3] {
            liveness.heartbeat(ClientId(id), Ts(1)).await.unwrap();
        }
        // b remembered a alive for a quarter of the liveness TTL: 101 ms later it reads again.
        let held = b.try_acquire(&r, &col).await.expect("a is dead: taken over");
        assert_eq!(b.takeovers(), 1);
        // b is alive: c does not take it from b, though it just changed hands.
        assert!(c.try_acquire(&r, &col).await.is_none(), "b holds it");
        assert_eq!(c.takeovers(), 0);
        drop(held);
    }

    #[tokio::test]
    async fn a_holder_missing_from_the_registry_counts_as_dead() {
        let Env { store, clock, liveness } = Env::new(5_000);
        let lease = |id: u64| {
            StoreLease::new(store.clone(), clock.clone(), 30_000, ClientId(id), liveness.clone())
        };
        let (a, b) = (lease(1), lease(2));
        let (r, col) = (Bytes::from_static(b"r"), Bytes::from_static(b"c"));
        // a never registered (or deregistered without releasing): b need not wait for the
        // lease to expire, only for the refusal to last half a liveness TTL.
        std::mem::forget(a.try_acquire(&r, &col).await.expect("free"));
        assert!(b.try_acquire(&r, &col).await.is_none(), "refused a first time");
        clock.advance_ms(2_499);
        assert!(b.try_acquire(&r, &col).await.is_none(), "refused for less than 2.5 s");
        clock.advance_ms(1);
        assert!(b.try_acquire(&r, &col).await.is_some());
        assert_eq!(b.takeovers(), 1);
    }
}
