//! One notification: whether its observer runs, the run in a transaction with its ack, and
//! the clear of the notification (at once, or deferred and flushed in one call).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use futures::FutureExt;
use perc_store::{RowMutation, Ts};
use perc_txn::{CommitStep, TxnError};

use super::{
    notify_delete, panic_text, Attempt, Clear, Counters, Engine, Pending, RunOutcome, Tracked,
    DEFERRED_CLEARS_MAX, IDLE_ACKS_MAX, PREFETCH_COLUMNS_MAX,
};
use crate::observer::{record_run, NotifyKind, ObserverError, Registration};

impl Engine {
    /// Processes one notification: see the module docs. A settled notification is cleared
    /// before this returns.
    pub async fn process(&self, p: &Pending) -> Result<RunOutcome, TxnError> {
        self.process_with(p, Clear::Now).await
    }

    pub(super) async fn process_with(
        &self,
        p: &Pending,
        clear: Clear,
    ) -> Result<RunOutcome, TxnError> {
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
                        Attempt::Committed => counters.committed(&reg.name, started.elapsed()),
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
    pub(super) async fn run_once(
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
    pub(super) async fn clear(&self, p: &Pending, clear: Clear) -> Result<(), TxnError> {
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
    pub(super) fn clear_deferred(&self, key: &(Bytes, Bytes), ts: Ts) -> bool {
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
    pub(super) fn idle_ack(&self, p: &Pending) -> Ts {
        let idle = self.idle_acks.lock().unwrap_or_else(|e| e.into_inner());
        idle.get(&(p.row.clone(), p.column.clone())).copied().unwrap_or(Ts::ZERO)
    }

    /// Columns of the notified row that `observer` read in earlier runs.
    pub(super) fn learned_columns(&self, observer: &str) -> Vec<Bytes> {
        let learned = self.learned.lock().unwrap_or_else(|e| e.into_inner());
        learned.get(observer).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    /// Remembers which columns of the notified row this run read, for the next run's
    /// prefetch; at most [`PREFETCH_COLUMNS_MAX`] per observer.
    pub(super) fn learn(&self, reg: &Registration, p: &Pending, txn: &perc_txn::Transaction) {
        let mut learned = self.learned.lock().unwrap_or_else(|e| e.into_inner());
        let set = learned.entry(reg.name.clone()).or_default();
        let ack = reg.ack_column();
        for (row, column) in txn.read_set() {
            if row == p.row && set.len() < PREFETCH_COLUMNS_MAX && column != ack {
                set.insert(column);
            }
        }
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
}
