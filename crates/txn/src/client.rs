//! The client: a registered participant that begins transactions. It holds the store, the
//! oracle and the clock, heartbeats its liveness row, publishes the low watermark below which
//! none of its transactions will read, and retries whole transactions on conflict.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use perc_oracle::Oracle;
use perc_store::{Store, Ts};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{
    ClientId, Clock, Liveness, ProcessKind, Retryable, Transaction, TxnConfig, TxnError, Watch,
    WatchNothing,
};

/// How long [`Client::retrying`] retries before it says that it is waiting.
const WAIT_SAID_AFTER_MS: u64 = 1_000;

/// A handle for running transactions: one registered participant (a [`ClientId`] with a
/// liveness row). Cheap to clone.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) oracle: Arc<dyn Oracle>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) liveness: Liveness,
    pub(crate) id: ClientId,
    pub(crate) config: TxnConfig,
    pub(crate) watch: Arc<dyn Watch>,
    pub(crate) last_heartbeat_ms: AtomicU64,
    /// When this client registered (wall ms), and the notification scanners it runs: both
    /// published with its heartbeat.
    pub(crate) started_ms: u64,
    pub(crate) scanners: AtomicU32,
    /// The process this client belongs to (its main client's id; its own by default).
    pub(crate) process: AtomicU64,
    /// What its process is (published with its heartbeat).
    pub(crate) kind: Mutex<ProcessKind>,
    /// Start timestamps of this worker's open transactions (a multiset), and the newest
    /// timestamp it has received: together they bound from below every start_ts this worker
    /// will ever use (its low watermark).
    pub(crate) active: Mutex<BTreeMap<Ts, usize>>,
    pub(crate) last_seen_ts: AtomicU64,
    pub(crate) rng: Mutex<SmallRng>,
    /// Rows this client's commits left with nothing but deletes, or asked to have collected,
    /// for the prompt collection ([`crate::gc::collect_deleted`]).
    pub(crate) to_collect: Mutex<ToCollect>,
}

/// Rows whose newest writes are deletes, or that a commit asked to have collected
/// ([`crate::Transaction::collect_soon`]), each with the commit timestamp of that
/// transaction, in commit order: the prompt collection cleans a row once the safe point has
/// passed it, so that rows written to be taken and deleted (a stage's change rows, a queue)
/// leave the store within seconds, and a row rewritten many times a second carries few old
/// versions, not all of them until the next pass over the whole store.
#[derive(Default)]
pub(crate) struct ToCollect {
    /// Whether a collector takes them ([`Client::collect_promptly`]): a client without one
    /// remembers nothing.
    on: bool,
    rows: VecDeque<(Ts, Bytes)>,
}

/// The most rows [`ToCollect`] holds: past it, rows are left to the full pass (the queue bounds
/// its memory, ~100 bytes a row, when the collector falls behind).
const TO_COLLECT_MAX: usize = 1 << 18;

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
                started_ms: clock.now_ms(),
                scanners: AtomicU32::new(0),
                process: AtomicU64::new(id.0),
                kind: Mutex::new(ProcessKind::default()),
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
                to_collect: Mutex::new(ToCollect::default()),
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

    /// Whether this client's commits remember the rows they empty, for a collector that calls
    /// [`crate::gc::collect_deleted`] with it (off by default; off again, it forgets them).
    pub fn collect_promptly(&self, on: bool) {
        let mut to_collect = self.inner.to_collect.lock().unwrap_or_else(|e| e.into_inner());
        to_collect.on = on;
        if !on {
            to_collect.rows.clear();
        }
    }

    /// Remembers `rows`, emptied by deletes that committed at `commit_ts` or asked for by
    /// that commit, for the prompt collection (as many as fit), if it is on.
    pub(crate) fn note_to_collect(&self, commit_ts: Ts, rows: impl IntoIterator<Item = Bytes>) {
        let mut to_collect = self.inner.to_collect.lock().unwrap_or_else(|e| e.into_inner());
        if !to_collect.on {
            return;
        }
        for row in rows {
            if to_collect.rows.len() >= TO_COLLECT_MAX {
                return;
            }
            to_collect.rows.push_back((commit_ts, row));
        }
    }

    /// Takes the remembered rows committed at or before `point` (a safe point), in commit order.
    /// Rows from commits that finished out of timestamp order wait behind a later one.
    pub(crate) fn take_to_collect(&self, point: Ts) -> Vec<Bytes> {
        let mut to_collect = self.inner.to_collect.lock().unwrap_or_else(|e| e.into_inner());
        let mut taken = Vec::new();
        while to_collect.rows.front().is_some_and(|(ts, _)| *ts <= point) {
            taken.extend(to_collect.rows.pop_front().map(|(_, row)| row));
        }
        taken
    }

    /// Refreshes this worker's heartbeat. A worker that runs long calls this periodically
    /// (every third of `liveness_ttl_ms`); commits also refresh it when it is getting old.
    pub async fn heartbeat(&self) -> Result<(), TxnError> {
        let now = self.inner.clock.now_ms();
        // A fresh timestamp first: a begin that could still get a smaller one has already
        // put its placeholder in `active`, so the minimum below accounts for it.
        let fresh = self.inner.oracle.next().await?;
        self.inner.last_seen_ts.fetch_max(fresh.0, Ordering::SeqCst);
        let i = &self.inner;
        let about = crate::liveness::About {
            started_ms: i.started_ms,
            scanners: i.scanners.load(Ordering::Relaxed),
            process: ClientId(i.process.load(Ordering::Relaxed)),
            kind: *i.kind.lock().unwrap_or_else(|e| e.into_inner()),
        };
        i.liveness.heartbeat_with(i.id, self.low_watermark(), about).await?;
        self.inner.last_heartbeat_ms.store(now, Ordering::Relaxed);
        Ok(())
    }

    /// Publishes, from the next heartbeat on, that this client runs `n` notification scanners
    /// (others look for one to know whether anybody works).
    pub fn set_scanners(&self, n: u32) {
        self.inner.scanners.store(n, Ordering::Relaxed);
    }

    /// Publishes, from the next heartbeat on, that this client belongs to the process whose
    /// main client is `process` (`perc status` shows a process once).
    pub fn set_process(&self, process: ClientId) {
        self.inner.process.store(process.0, Ordering::Relaxed);
    }

    /// Publishes, from the next heartbeat on, what this client's process is ("serve",
    /// "worker": `perc status` names it).
    pub fn set_kind(&self, kind: ProcessKind) {
        *self.inner.kind.lock().unwrap_or_else(|e| e.into_inner()) = kind;
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

    pub(crate) fn untrack(&self, ts: Ts) {
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
            unchecked: BTreeSet::new(),
            weak: BTreeSet::new(),
            weak_if: BTreeMap::new(),
            after_commit: Vec::new(),
            deletes_at_commit: Vec::new(),
            collect_soon: Vec::new(),
            reads: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) async fn heartbeat_if_old(&self) -> Result<(), TxnError> {
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
    ///
    /// `attempt` gets a handle of its own (a clone: cheap), so that the future it returns
    /// borrows nothing from this call and is `Send` whenever what it captures is.
    pub async fn retrying<T, E, Fut>(&self, mut attempt: impl FnMut(Client) -> Fut) -> Result<T, E>
    where
        E: Retryable + std::fmt::Display,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        let c = &self.inner.config;
        let started = self.inner.clock.now_ms();
        let deadline = started + 2 * (c.lock_ttl_ms + c.liveness_ttl_ms).max(1_000);
        let mut said = false;
        let mut n = 0;
        loop {
            match attempt(self.clone()).await {
                Err(e) if e.is_retryable() && self.inner.clock.now_ms() < deadline => {
                    // A wait longer than a moment is said, once: a lock of a process that
                    // died lasts until its liveness lapses, and the user should know why
                    // nothing happens meanwhile.
                    let now = self.inner.clock.now_ms();
                    if !said && now.saturating_sub(started) >= WAIT_SAID_AFTER_MS {
                        tracing::warn!(
                            "waiting: {e}; a lock is cleaned once its owner's heartbeat is {} ms \
                             old (txn.liveness_ttl_ms) or the lock {} ms (txn.lock_ttl_ms); \
                             trying again for up to {} s",
                            c.liveness_ttl_ms,
                            c.lock_ttl_ms,
                            deadline.saturating_sub(now).div_ceil(1000)
                        );
                        said = true;
                    }
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
