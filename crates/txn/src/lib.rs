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
//! What this layer leaves out: it reads no wall clock and spawns nothing ([`Clock`] and the
//! runtime are the caller's); garbage collection of old versions belongs to the observer
//! framework, which knows the oldest live transaction.

pub mod actions;
pub mod clock;
pub mod error;
pub mod gc;
pub mod liveness;
pub mod record;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use perc_oracle::Oracle;
use perc_store::{ColumnRead, FamilySpec, RowRead, Store, Ts, TsRange};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

pub use actions::{CellWrite, Resolution, TxnStatus};
pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{Retryable, TxnError};
pub use liveness::Liveness;
pub use record::{ClientId, LockRecord, WriteKind, WriteRecord};

use actions::{data_col, lock_col, write_col, LockInfo};

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
    /// Flush the store at each commit point before acknowledging the commit. Turn it off only
    /// for commits nobody waits on (observer runs): the store recovers a prefix of its log, so
    /// a lost commit loses everything written after it too, and its notification runs again.
    pub sync_commits: bool,
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
            sync_commits: true,
        }
    }
}

/// A handle for running transactions: one registered participant (a [`ClientId`] with a
/// liveness row). Cheap to clone.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    oracle: Arc<dyn Oracle>,
    clock: Arc<dyn Clock>,
    liveness: Liveness,
    id: ClientId,
    config: TxnConfig,
    watch: Arc<dyn Watch>,
    last_heartbeat_ms: AtomicU64,
    /// Start timestamps of this worker's open transactions (a multiset), and the newest
    /// timestamp it has received: together they bound from below every start_ts this worker
    /// will ever use (its low watermark).
    active: Mutex<BTreeMap<Ts, usize>>,
    last_seen_ts: AtomicU64,
    rng: Mutex<SmallRng>,
}

impl Client {
    /// Registers a new client (its id is a fresh oracle timestamp, so unique) and returns its
    /// client.
    pub async fn new(
        store: Arc<dyn Store>,
        oracle: Arc<dyn Oracle>,
        clock: Arc<dyn Clock>,
        config: TxnConfig,
    ) -> Result<Client, TxnError> {
        Client::with_watch(store, oracle, clock, config, Arc::new(WatchNothing)).await
    }

    /// A client whose commits set notify cells for the columns `watch` names.
    pub async fn with_watch(
        store: Arc<dyn Store>,
        oracle: Arc<dyn Oracle>,
        clock: Arc<dyn Clock>,
        config: TxnConfig,
        watch: Arc<dyn Watch>,
    ) -> Result<Client, TxnError> {
        let first = oracle.next().await?;
        let id = ClientId(first.0);
        let liveness = Liveness::new(store.clone(), clock.clone(), config.liveness_ttl_ms);
        // Every later start_ts comes from the oracle after this one: `first` is a valid low
        // watermark from the moment the row exists.
        liveness.heartbeat(id, first).await?;
        let rng = SmallRng::seed_from_u64(config.seed ^ id.0);
        Ok(Client {
            inner: Arc::new(Inner {
                last_heartbeat_ms: AtomicU64::new(clock.now_ms()),
                store,
                oracle,
                clock,
                liveness,
                id,
                config,
                watch,
                active: Mutex::new(BTreeMap::new()),
                last_seen_ts: AtomicU64::new(first.0),
                rng: Mutex::new(rng),
            }),
        })
    }

    /// This client's identity in locks (as their owner) and in the liveness registry.
    pub fn id(&self) -> ClientId {
        self.inner.id
    }
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }
    pub fn oracle(&self) -> &Arc<dyn Oracle> {
        &self.inner.oracle
    }
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }
    pub fn liveness(&self) -> &Liveness {
        &self.inner.liveness
    }
    pub fn config(&self) -> &TxnConfig {
        &self.inner.config
    }

    /// Refreshes this worker's heartbeat. A worker that runs long calls this periodically
    /// (every third of `liveness_ttl_ms`); commits also refresh it when it is getting old.
    pub async fn heartbeat(&self) -> Result<(), TxnError> {
        let now = self.inner.clock.now_ms();
        // A fresh timestamp first: a begin that could still get a smaller one has already
        // put its placeholder in `active`, so the minimum below accounts for it.
        let fresh = self.inner.oracle.next().await?;
        self.inner.last_seen_ts.fetch_max(fresh.0, Ordering::SeqCst);
        self.inner.liveness.heartbeat(self.inner.id, self.low_watermark()).await?;
        self.inner.last_heartbeat_ms.store(now, Ordering::Relaxed);
        Ok(())
    }

    /// No transaction of this worker, open or future, has a start_ts below this.
    pub fn low_watermark(&self) -> Ts {
        let active = self.inner.active.lock().unwrap_or_else(|e| e.into_inner());
        let seen = Ts(self.inner.last_seen_ts.load(Ordering::SeqCst));
        active.keys().next().copied().map_or(seen, |oldest| oldest.min(seen))
    }

    fn track(&self, ts: Ts) {
        let mut active = self.inner.active.lock().unwrap_or_else(|e| e.into_inner());
        *active.entry(ts).or_default() += 1;
    }

    fn untrack(&self, ts: Ts) {
        let mut active = self.inner.active.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = active.get_mut(&ts) {
            *n -= 1;
            if *n == 0 {
                active.remove(&ts);
            }
        }
    }

    /// Leaves the registry (a clean shutdown). Locks left behind become cleanable at once.
    pub async fn deregister(&self) -> Result<(), TxnError> {
        self.inner.liveness.deregister(self.inner.id).await
    }

    pub async fn begin(&self) -> Result<Transaction, TxnError> {
        // An idle worker may have been declared dead: come back to life before taking a
        // snapshot, so that garbage collection either sees our watermark or ran before it.
        self.heartbeat_if_old().await?;
        // Hold the watermark at the last timestamp seen until the new one is known, so that
        // a heartbeat published meanwhile never claims more than is true.
        let placeholder = Ts(self.inner.last_seen_ts.load(Ordering::SeqCst));
        self.track(placeholder);
        let got = self.inner.oracle.next().await;
        if let Ok(ts) = &got {
            self.track(*ts);
            self.inner.last_seen_ts.fetch_max(ts.0, Ordering::SeqCst);
        }
        self.untrack(placeholder);
        let start_ts = got?;
        Ok(Transaction {
            client: self.clone(),
            start_ts,
            writes: BTreeMap::new(),
            weak: BTreeSet::new(),
            reads: Mutex::new(HashMap::new()),
        })
    }

    async fn heartbeat_if_old(&self) -> Result<(), TxnError> {
        let last = self.inner.last_heartbeat_ms.load(Ordering::Relaxed);
        if self.inner.clock.now_ms().saturating_sub(last) * 3 >= self.inner.config.liveness_ttl_ms {
            self.heartbeat().await?;
        }
        Ok(())
    }

    /// Runs `attempt` in new transactions until it returns anything but a retryable outcome
    /// (a conflict, a lock, a rollback): the loop every writer outside the observer framework
    /// (loaders, counters) needs. Locks of dead workers are cleaned by the attempts
    /// themselves. A live owner's lock is stale, and cleanable, after one lock TTL (or its
    /// owner's liveness TTL once it stops heartbeating); the loop keeps trying for twice their
    /// sum (at least 2 s) and then gives up with the last conflict.
    pub async fn retrying<T, E: Retryable>(
        &self,
        mut attempt: impl AsyncFnMut(&Client) -> Result<T, E>,
    ) -> Result<T, E> {
        let c = &self.inner.config;
        let deadline =
            self.inner.clock.now_ms() + 2 * (c.lock_ttl_ms + c.liveness_ttl_ms).max(1_000);
        let mut n = 0;
        loop {
            match attempt(self).await {
                Err(e) if e.is_retryable() && self.inner.clock.now_ms() < deadline => {
                    let pause = self.backoff_ms(n);
                    n += 1;
                    self.inner.clock.sleep_ms(pause).await;
                }
                r => return r,
            }
        }
    }

    /// A jittered exponential backoff for attempt `n` (0-based), in ms.
    pub fn backoff_ms(&self, attempt: u32) -> u64 {
        let c = &self.inner.config;
        let cap =
            c.backoff_min_ms.saturating_mul(1u64 << attempt.min(20)).min(c.backoff_max_ms).max(1);
        let mut rng = self.inner.rng.lock().unwrap_or_else(|e| e.into_inner());
        rng.random_range(cap / 2..=cap)
    }
}

/// Where to stop a commit, to leave the store as a crash at that step would.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CommitStep {
    AfterPrewritePrimary,
    AfterPrewriteAll,
    /// After the notify cells are set at commit_ts, before the primary commits.
    BeforeCommitPrimary,
    AfterCommitPrimary,
    /// After committing half of the secondary rows (rounded down).
    MidSecondaries,
}

impl CommitStep {
    /// Every step, in commit order.
    pub const ALL: [CommitStep; 5] = [
        CommitStep::AfterPrewritePrimary,
        CommitStep::AfterPrewriteAll,
        CommitStep::BeforeCommitPrimary,
        CommitStep::AfterCommitPrimary,
        CommitStep::MidSecondaries,
    ];
}

/// How a commit stopped by [`Transaction::commit_crashing_at`] left the transaction.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Crashed {
    BeforeCommitPoint,
    AfterCommitPoint(Ts),
}

/// One transaction: reads see the snapshot at `start_ts`; writes are buffered until commit.
pub struct Transaction {
    client: Client,
    start_ts: Ts,
    writes: BTreeMap<(Bytes, Bytes), Option<Bytes>>,
    /// Weak notifications to set at commit.
    weak: BTreeSet<(Bytes, Bytes)>,
    /// Snapshot reads already resolved. A snapshot never changes once its locks are
    /// resolved, so each cell is read from the store at most once per transaction.
    reads: Mutex<HashMap<(Bytes, Bytes), Option<Version>>>,
}

/// The newest committed write of a cell in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub commit_ts: Ts,
    /// `None`: the write was a delete.
    pub value: Option<Bytes>,
}

impl Drop for Transaction {
    fn drop(&mut self) {
        self.client.untrack(self.start_ts);
    }
}

impl Transaction {
    pub fn start_ts(&self) -> Ts {
        self.start_ts
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Buffers a write of `value` to `(row, column)`.
    pub fn set(
        &mut self,
        row: impl Into<Bytes>,
        column: impl Into<Bytes>,
        value: impl Into<Bytes>,
    ) {
        self.writes.insert((row.into(), column.into()), Some(value.into()));
    }

    /// Buffers a delete of `(row, column)`.
    pub fn delete(&mut self, row: impl Into<Bytes>, column: impl Into<Bytes>) {
        self.writes.insert((row.into(), column.into()), None);
    }

    /// The value of `(row, column)` in this transaction's snapshot (its own buffered writes
    /// included).
    pub async fn get(&self, row: &[u8], column: &[u8]) -> Result<Option<Bytes>, TxnError> {
        let key = (Bytes::copy_from_slice(row), Bytes::copy_from_slice(column));
        Ok(self.get_many(std::slice::from_ref(&key)).await?.pop().flatten())
    }

    /// Many cells in one batched store read (plus one more read per cell that meets a lock
    /// or whose data is not the newest at or below `start_ts`). Cells this transaction read
    /// before cost nothing.
    pub async fn get_many(&self, cells: &[(Bytes, Bytes)]) -> Result<Vec<Option<Bytes>>, TxnError> {
        let unbuffered: Vec<(Bytes, Bytes)> =
            cells.iter().filter(|k| !self.writes.contains_key(*k)).cloned().collect();
        let mut fetched = self.versions(&unbuffered).await?.into_iter();
        let mut out = Vec::with_capacity(cells.len());
        for key in cells {
            match self.writes.get(key) {
                Some(buffered) => out.push(buffered.clone()),
                None => {
                    let v = fetched.next().expect("one answer per unbuffered cell");
                    out.push(v.and_then(|v| v.value));
                }
            }
        }
        Ok(out)
    }

    /// The newest committed write of each cell in this snapshot (this transaction's own
    /// buffered writes left out), reading every cell not read before in one batched call,
    /// one [`RowRead`] per row. The paper's read batching and prefetching: a caller that
    /// knows which cells it will need reads them together, and later `get`s are free.
    pub async fn versions(
        &self,
        cells: &[(Bytes, Bytes)],
    ) -> Result<Vec<Option<Version>>, TxnError> {
        let mut by_row: Vec<(Bytes, Vec<Bytes>)> = Vec::new();
        let mut index: HashMap<Bytes, usize> = HashMap::new();
        {
            let cache = self.reads_lock();
            let mut wanted = BTreeSet::new();
            for key in cells {
                if cache.contains_key(key) || !wanted.insert(key) {
                    continue;
                }
                match index.get(&key.0) {
                    Some(&i) => by_row[i].1.push(key.1.clone()),
                    None => {
                        index.insert(key.0.clone(), by_row.len());
                        by_row.push((key.0.clone(), vec![key.1.clone()]));
                    }
                }
            }
        }
        if !by_row.is_empty() {
            let store = self.client.store();
            let reads: Vec<RowRead> = by_row
                .iter()
                .map(|(row, columns)| RowRead {
                    row: row.clone(),
                    reads: columns.iter().flat_map(|c| self.snapshot_reads(c)).collect(),
                })
                .collect();
            let fetched = if reads.len() == 1 {
                vec![store.read_row(&reads[0].row, &reads[0].reads).await?]
            } else {
                store.read_rows(&reads).await?
            };
            for ((row, columns), got) in by_row.into_iter().zip(fetched) {
                let mut got = got.into_iter();
                for column in columns {
                    let three: Vec<Vec<perc_store::Cell>> = got.by_ref().take(3).collect();
                    let version = self.resolve_read(&row, &column, three).await?;
                    self.reads_lock().insert((row.clone(), column), version);
                }
            }
        }
        let cache = self.reads_lock();
        Ok(cells.iter().map(|k| cache[k].clone()).collect())
    }

    /// The cells this transaction has read from the store so far.
    pub fn read_set(&self) -> Vec<(Bytes, Bytes)> {
        self.reads_lock().keys().cloned().collect()
    }

    fn reads_lock(&self) -> std::sync::MutexGuard<'_, HashMap<(Bytes, Bytes), Option<Version>>> {
        self.reads.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snapshot_reads(&self, column: &Bytes) -> Vec<ColumnRead> {
        let upto = TsRange::up_to(self.start_ts);
        vec![
            ColumnRead::newest(lock_col(column), upto),
            // A few versions, so that a rollback record on top rarely costs a second read.
            ColumnRead { column: write_col(column), range: upto, versions: 4 },
            ColumnRead::newest(data_col(column), upto),
        ]
    }

    /// The rows in `[start, end)` (`end` empty: to the end) that have a value in `column` in
    /// this snapshot, with those values, in row order (this transaction's own buffered writes
    /// included). Reads the `write` family over the range, so its cost follows the cells in
    /// the range, not the table: keep scanned columns under a row prefix of their own.
    pub async fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        column: &[u8],
    ) -> Result<Vec<(Bytes, Bytes)>, TxnError> {
        let store = self.client.store();
        let range = |family: &'static str| perc_store::Scan {
            family,
            start: Bytes::copy_from_slice(start),
            end: Bytes::copy_from_slice(end),
            limit: usize::MAX,
        };
        let column = Bytes::copy_from_slice(column);
        let mut found: BTreeMap<Bytes, Option<Bytes>> = BTreeMap::new();
        // Cells locked at or below start_ts are read one by one, which waits on or resolves
        // the lock exactly as `get` does.
        let mut locked = BTreeSet::new();
        for c in store.scan(&range(actions::LOCK.name)).await? {
            if c.qualifier == column && c.ts <= self.start_ts {
                locked.insert(c.row);
            }
        }
        // Newest committed record at or below start_ts, per row (cells come newest first).
        let mut newest: BTreeMap<Bytes, WriteRecord> = BTreeMap::new();
        for c in store.scan(&range(actions::WRITE.name)).await? {
            if c.qualifier != column
                || c.ts > self.start_ts
                || locked.contains(&c.row)
                || newest.contains_key(&c.row)
            {
                continue;
            }
            let record = WriteRecord::decode(&c.value)?;
            if record.kind != WriteKind::Rollback {
                newest.insert(c.row, record);
            }
        }
        let puts: Vec<(Bytes, Ts)> = newest
            .into_iter()
            .filter(|(_, r)| r.kind == WriteKind::Put)
            .map(|(row, r)| (row, r.start_ts))
            .collect();
        if !puts.is_empty() {
            let reads: Vec<RowRead> = puts
                .iter()
                .map(|(row, ts)| RowRead {
                    row: row.clone(),
                    reads: vec![ColumnRead::newest(data_col(&column), TsRange::at(*ts))],
                })
                .collect();
            for ((row, ts), mut got) in puts.into_iter().zip(store.read_rows(&reads).await?) {
                let cell = got.remove(0).pop().ok_or_else(|| {
                    TxnError::Corrupt(format!(
                        "{}/{}: no data at {ts} for its write record",
                        error::show(&row),
                        error::show(&column)
                    ))
                })?;
                found.insert(row, Some(cell.value));
            }
        }
        for row in locked {
            let v = self.get(&row, &column).await?;
            found.insert(row, v);
        }
        for ((row, col), v) in &self.writes {
            if *col == column && row.as_ref() >= start && (end.is_empty() || row.as_ref() < end) {
                found.insert(row.clone(), v.clone());
            }
        }
        Ok(found.into_iter().filter_map(|(row, v)| v.map(|v| (row, v))).collect())
    }

    /// Buffers a weak notification of `(row, column)`: set at commit without a write, so
    /// it conflicts with nothing (for hot rows, such as counters with many writers).
    pub fn notify(&mut self, row: impl Into<Bytes>, column: impl Into<Bytes>) {
        self.weak.insert((row.into(), column.into()));
    }

    /// Turns one cell's (lock, write, data) reads into (commit_ts, value) of its newest
    /// committed write, waiting on and resolving locks, and re-reading as needed.
    async fn resolve_read(
        &self,
        row: &Bytes,
        column: &Bytes,
        mut got: Vec<Vec<perc_store::Cell>>,
    ) -> Result<Option<Version>, TxnError> {
        let client = &self.client;
        let store = client.store();
        let mut attempt = 0u32;
        let mut waited_ms = 0u64;
        loop {
            if let Some(lock_cell) = got[0].first() {
                let lock = LockRecord::decode(&lock_cell.value)?;
                let now = client.clock().now_ms();
                match actions::resolve(
                    store.as_ref(),
                    client.liveness(),
                    now,
                    row,
                    column,
                    lock_cell.ts,
                    &lock,
                )
                .await?
                {
                    Resolution::RolledBack | Resolution::RolledForward(_) => {}
                    Resolution::Wait => {
                        if attempt == 0 {
                            tracing::debug!(row = %error::show(row), column = %error::show(column), lock_ts = %lock_cell.ts, owner = %lock.owner, me = %client.id(), "waiting on a live lock");
                        }
                        if waited_ms >= client.config().lock_wait_max_ms {
                            return Err(TxnError::LockWaitTimeout {
                                row: row.clone(),
                                column: column.clone(),
                                lock_ts: lock_cell.ts,
                                owner: lock.owner,
                                waited_ms,
                            });
                        }
                        let pause = client.backoff_ms(attempt);
                        attempt += 1;
                        client.clock().sleep_ms(pause).await;
                        waited_ms += pause;
                    }
                }
                got = store.read_row(row, &self.snapshot_reads(column)).await?;
                continue;
            }
            let mut writes = std::mem::take(&mut got[1]);
            if writes.len() == 4 && writes.iter().all(|w| is_rollback(&w.value)) {
                // Many rollbacks on top: read every version below start_ts.
                let all = ColumnRead::all(write_col(column), TsRange::up_to(self.start_ts));
                writes = store.read_row(row, &[all]).await?.remove(0);
            }
            for w in &writes {
                let record = WriteRecord::decode(&w.value)?;
                match record.kind {
                    WriteKind::Rollback => continue,
                    WriteKind::Delete => return Ok(Some(Version { commit_ts: w.ts, value: None })),
                    WriteKind::Put => {
                        if let Some(d) = got[2].first().filter(|d| d.ts == record.start_ts) {
                            return Ok(Some(Version {
                                commit_ts: w.ts,
                                value: Some(d.value.clone()),
                            }));
                        }
                        let exact =
                            ColumnRead::newest(data_col(column), TsRange::at(record.start_ts));
                        let mut data = store.read_row(row, &[exact]).await?.remove(0);
                        return match data.pop() {
                            Some(d) => Ok(Some(Version { commit_ts: w.ts, value: Some(d.value) })),
                            None => Err(TxnError::Corrupt(format!(
                                "{}/{}: the write record at {} names data at {} that does not exist",
                                error::show(row),
                                error::show(column),
                                w.ts,
                                record.start_ts
                            ))),
                        };
                    }
                }
            }
            return Ok(None);
        }
    }

    /// Commits: prewrite (primary's row first), commit the primary (durably), then the
    /// secondaries. Returns the commit timestamp, or `None` for a read-only transaction.
    pub async fn commit(self) -> Result<Option<Ts>, TxnError> {
        match self.commit_inner(None).await? {
            Outcome::Committed(ts) => Ok(ts),
            Outcome::Crashed(_) => unreachable!("no crash point was given"),
        }
    }

    /// Runs the commit only up to `step`, then stops as if the process died there: nothing
    /// is cleaned up. For fault-injection tests (the `failpoints` feature); production code
    /// calls [`Self::commit`].
    #[cfg(feature = "failpoints")]
    pub async fn commit_crashing_at(self, step: CommitStep) -> Result<Crashed, TxnError> {
        match self.commit_inner(Some(step)).await? {
            Outcome::Crashed(c) => Ok(c),
            Outcome::Committed(Some(ts)) => Ok(Crashed::AfterCommitPoint(ts)),
            Outcome::Committed(None) => Ok(Crashed::BeforeCommitPoint),
        }
    }

    async fn commit_inner(mut self, crash: Option<CommitStep>) -> Result<Outcome, TxnError> {
        let writes = std::mem::take(&mut self.writes);
        let weak = std::mem::take(&mut self.weak);
        let client = self.client.clone();
        let store = client.store().as_ref();
        let start_ts = self.start_ts;
        if writes.is_empty() {
            if !weak.is_empty() {
                let ts = client.oracle().next().await?;
                set_notifications(store, weak, ts).await?;
            }
            return Ok(Outcome::Committed(None));
        }
        // A worker whose heartbeat lapsed may have been declared dead: its locks may be gone
        // and garbage collection may have passed its snapshot. Refuse; a retry starts fresh.
        let last_beat = client.inner.last_heartbeat_ms.load(Ordering::Relaxed);
        if client.clock().now_ms().saturating_sub(last_beat) > client.config().liveness_ttl_ms {
            client.heartbeat().await?;
            return Err(TxnError::RolledBack { start_ts });
        }
        // Strong notifications: every written column that has an observer.
        let mut notify = weak;
        for (row, column) in writes.keys() {
            if client.inner.watch.watches(column) {
                notify.insert((row.clone(), column.clone()));
            }
        }
        // Group the buffer by row; the first cell (in key order) is the primary.
        let mut rows: BTreeMap<Bytes, Vec<CellWrite>> = BTreeMap::new();
        for ((row, column), value) in writes {
            rows.entry(row).or_default().push(CellWrite { column, value });
        }
        let (primary_row, primary_cells) = rows.pop_first().expect("non-empty");
        let primary_column = primary_cells[0].column.clone();
        client.heartbeat_if_old().await?;
        let info = LockInfo {
            primary: (primary_row.clone(), primary_column.clone()),
            owner: client.id(),
            wall_ms: client.clock().now_ms(),
            ttl_ms: client.config().lock_ttl_ms,
        };

        if let Err(e) =
            actions::prewrite(store, &primary_row, &primary_cells, start_ts, &info).await
        {
            self::clean_conflicting_lock(&client, &e).await?;
            return Err(e);
        }
        if crash == Some(CommitStep::AfterPrewritePrimary) {
            return Ok(Outcome::Crashed(Crashed::BeforeCommitPoint));
        }
        let secondaries: Vec<(Bytes, Vec<CellWrite>)> = rows.into_iter().collect();
        let results = futures::future::join_all(
            secondaries
                .iter()
                .map(|(row, cells)| actions::prewrite(store, row, cells, start_ts, &info)),
        )
        .await;
        if let Some(pos) = results.iter().position(Result::is_err) {
            // Abort: our own locks go, the primary's first (with its rollback record).
            let columns: Vec<Bytes> = primary_cells.iter().map(|c| c.column.clone()).collect();
            actions::rollback_primary(store, &primary_row, &primary_column, &columns, start_ts)
                .await?;
            let ours: Vec<(Bytes, Vec<Bytes>)> = secondaries
                .iter()
                .zip(&results)
                .filter(|(_, r)| r.is_ok())
                .map(|((row, cells), _)| {
                    (row.clone(), cells.iter().map(|c| c.column.clone()).collect())
                })
                .collect();
            actions::rollback_secondaries(store, &ours, start_ts).await?;
            let err = results.into_iter().nth(pos).expect("position").unwrap_err();
            clean_conflicting_lock(&client, &err).await?;
            return Err(err);
        }
        if crash == Some(CommitStep::AfterPrewriteAll) {
            return Ok(Outcome::Crashed(Crashed::BeforeCommitPoint));
        }

        let commit_ts = client.oracle().next().await?;
        // Notify cells go in before the commit point, at commit_ts: a crash between the two
        // leaves a notification whose worker finds no change (harmless), never a change with
        // no notification. A worker that finds the notification at commit_ts and starts after
        // it either sees this commit or waits on its locks until it is decided.
        set_notifications(store, notify, commit_ts).await?;
        if crash == Some(CommitStep::BeforeCommitPrimary) {
            return Ok(Outcome::Crashed(Crashed::BeforeCommitPoint));
        }
        let kinds = |cells: &[CellWrite]| -> Vec<(Bytes, WriteKind)> {
            cells.iter().map(|c| (c.column.clone(), c.kind())).collect()
        };
        actions::commit_primary(
            store,
            &primary_row,
            &primary_column,
            &kinds(&primary_cells),
            start_ts,
            commit_ts,
        )
        .await?;
        // The commit point: acknowledged only once durable.
        if client.config().sync_commits {
            store.sync().await?;
        }
        if crash == Some(CommitStep::AfterCommitPrimary) {
            return Ok(Outcome::Crashed(Crashed::AfterCommitPoint(commit_ts)));
        }
        let mut commit_rows: Vec<(Bytes, Vec<(Bytes, WriteKind)>)> =
            secondaries.iter().map(|(row, cells)| (row.clone(), kinds(cells))).collect();
        if crash == Some(CommitStep::MidSecondaries) {
            commit_rows.truncate(commit_rows.len() / 2);
            actions::commit_secondaries(store, &commit_rows, start_ts, commit_ts).await?;
            return Ok(Outcome::Crashed(Crashed::AfterCommitPoint(commit_ts)));
        }
        actions::commit_secondaries(store, &commit_rows, start_ts, commit_ts).await?;
        Ok(Outcome::Committed(Some(commit_ts)))
    }
}

/// Sets the notify cells of `cells` at `ts` (one batched call).
async fn set_notifications(
    store: &dyn Store,
    cells: BTreeSet<(Bytes, Bytes)>,
    ts: Ts,
) -> Result<(), TxnError> {
    if cells.is_empty() {
        return Ok(());
    }
    let batch: Vec<perc_store::RowMutation> = cells
        .into_iter()
        .map(|(row, column)| perc_store::RowMutation {
            row,
            mutations: vec![perc_store::Mutation::Put {
                column: actions::notify_col(&column),
                ts,
                value: Bytes::new(),
            }],
        })
        .collect();
    store.mutate_rows(&batch).await?;
    Ok(())
}

enum Outcome {
    Committed(Option<Ts>),
    /// Only with a crash point, which only the `failpoints` feature can give.
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    Crashed(Crashed),
}

fn is_rollback(raw: &Bytes) -> bool {
    matches!(WriteRecord::decode(raw), Ok(WriteRecord { kind: WriteKind::Rollback, .. }))
}

/// A writer that meets an abandoned lock cleans it up, so that a dead worker's lock on a cell
/// that only writers touch does not block them forever (the paper leaves this to readers).
async fn clean_conflicting_lock(client: &Client, err: &TxnError) -> Result<(), TxnError> {
    if let TxnError::LockConflict { row, column, lock_ts, .. } = err {
        let store = client.store();
        let got = store
            .read_row(row, &[ColumnRead::newest(lock_col(column), TsRange::at(*lock_ts))])
            .await?;
        if let Some(cell) = got[0].first() {
            let lock = LockRecord::decode(&cell.value)?;
            let now = client.clock().now_ms();
            actions::resolve(store.as_ref(), client.liveness(), now, row, column, *lock_ts, &lock)
                .await?;
        }
    }
    Ok(())
}
