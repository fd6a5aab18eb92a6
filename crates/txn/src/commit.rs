//! The commit (the paper's Figure 6): prewrite every cell (one conditional mutation per row,
//! the primary's row first; rows of unchecked cells all in one batched call), draw commit_ts,
//! read the probes of the conditional notifications (one batched read), set the notify cells
//! at commit_ts, commit the primary and flush the store (the commit point), then the
//! secondaries in one batch. Crash points for fault tests stop it part-way, as a dead process
//! would (the `failpoints` feature).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use bytes::Bytes;
use perc_store::{ColumnRead, RowRead, Store, Ts, TsRange};

use crate::actions::{self, lock_col, write_col, CellWrite, LockInfo};
use crate::transaction::Probes;
use crate::{Client, LockRecord, Transaction, TxnError, WriteKind};

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

impl Transaction {
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
        let unchecked = std::mem::take(&mut self.unchecked);
        let mut weak = std::mem::take(&mut self.weak);
        let weak_if = std::mem::take(&mut self.weak_if);
        let after_commit = std::mem::take(&mut self.after_commit);
        let deletes_at_commit = std::mem::take(&mut self.deletes_at_commit);
        let collect_soon = std::mem::take(&mut self.collect_soon);
        let client = self.client.clone();
        let store = client.store().as_ref();
        let start_ts = self.start_ts;
        if writes.is_empty() {
            // Nothing to commit, so no commit timestamp to look at the probes by: set them all.
            weak.extend(weak_if.into_keys());
            read_only(&client, weak, after_commit).await?;
            return Ok(Outcome::Committed(None));
        }
        refuse_if_lapsed(&client, start_ts).await?;
        // Strong notifications: every written column that has an observer.
        let mut notify = weak;
        for (row, column) in writes.keys() {
            if client.inner.watch.watches(column) {
                notify.insert((row.clone(), column.clone()));
            }
        }
        let Rows { primary_row, primary_cells, checked, blind } = Rows::of(writes, &unchecked);
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
        let mut unfinished = Unfinished {
            client: client.clone(),
            row: primary_row.clone(),
            columns: primary_cells.iter().map(|c| c.column.clone()).collect(),
            start_ts,
        };
        if crash == Some(CommitStep::AfterPrewritePrimary) {
            unfinished.disarm();
            return Ok(Outcome::Crashed(Crashed::BeforeCommitPoint));
        }
        prewrite_secondaries(&client, &mut unfinished, &checked, &blind, &info).await?;
        let secondaries: Vec<(Bytes, Vec<CellWrite>)> = checked.into_iter().chain(blind).collect();
        tracing::debug!(%start_ts, rows = secondaries.len() + 1, "prewritten; committing");
        if crash == Some(CommitStep::AfterPrewriteAll) {
            unfinished.disarm();
            return Ok(Outcome::Crashed(Crashed::BeforeCommitPoint));
        }

        let commit_ts = client.oracle().next().await?;
        let written = probes_written(store, weak_if, &notify).await?;
        notify.extend(written);
        // Notify cells go in before the commit point, at commit_ts: a crash between the two
        // leaves a notification whose worker finds no change (harmless), never a change with
        // no notification. A worker that finds the notification at commit_ts and starts after
        // it either sees this commit or waits on its locks until it is decided.
        let older_notifications = set_notifications(store, notify, commit_ts).await?;
        if crash == Some(CommitStep::BeforeCommitPrimary) {
            unfinished.disarm();
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
        unfinished.disarm();
        // The commit point: durable before anything that follows it is written. sled may
        // recover a later write without an earlier one it did not flush (its log buffers are
        // written by several threads), so without this flush a crash could keep the
        // secondaries' commits, or the clear of the notification this run answered, and lose
        // the primary's.
        store.sync().await?;
        if crash == Some(CommitStep::AfterCommitPrimary) {
            return Ok(Outcome::Crashed(Crashed::AfterCommitPoint(commit_ts)));
        }
        let mut commit_rows: Vec<(Bytes, Vec<(Bytes, WriteKind)>)> =
            secondaries.iter().map(|(row, cells)| (row.clone(), kinds(cells))).collect();
        if crash == Some(CommitStep::MidSecondaries) {
            commit_rows.truncate(commit_rows.len() / 2);
            actions::commit_secondaries(store, &commit_rows, start_ts, commit_ts, Vec::new())
                .await?;
            return Ok(Outcome::Crashed(Crashed::AfterCommitPoint(commit_ts)));
        }
        let deletes = actions::delete_records(&deletes_at_commit, start_ts, commit_ts);
        let after_commit = [older_notifications, after_commit, deletes].concat();
        actions::commit_secondaries(store, &commit_rows, start_ts, commit_ts, after_commit).await?;
        // The rows this commit left with only deletes, and those it was asked to, for the
        // prompt collection.
        let only_deletes =
            |cells: &[CellWrite]| cells.iter().all(|c| c.kind() == WriteKind::Delete);
        let emptied = std::iter::once((&primary_row, primary_cells.as_slice()))
            .chain(secondaries.iter().map(|(row, cells)| (row, cells.as_slice())))
            .filter(|(_, cells)| only_deletes(cells))
            .map(|(row, _)| row.clone())
            .chain(deletes_at_commit.into_iter().map(|(row, _)| row))
            .chain(collect_soon);
        client.note_to_collect(commit_ts, emptied);
        Ok(Outcome::Committed(Some(commit_ts)))
    }
}

/// A commit's buffer grouped by row. A row whose every cell is unchecked (`blind`) is
/// prewritten in one batch with the others like it; the rest (`checked`) one conditional
/// mutation each, the primary (the first checked cell's row in key order, or the first row
/// if none is) before all.
struct Rows {
    primary_row: Bytes,
    primary_cells: Vec<CellWrite>,
    checked: Vec<(Bytes, Vec<CellWrite>)>,
    blind: Vec<(Bytes, Vec<CellWrite>)>,
}

/// A worker whose heartbeat lapsed may have been declared dead: its locks may be gone and
/// garbage collection may have passed its snapshot. Refuse to commit; a retry starts fresh.
async fn refuse_if_lapsed(client: &Client, start_ts: Ts) -> Result<(), TxnError> {
    let last_beat = client.inner.last_heartbeat_ms.load(Ordering::Relaxed);
    if client.clock().now_ms().saturating_sub(last_beat) > client.config().liveness_ttl_ms {
        client.heartbeat().await?;
        return Err(TxnError::RolledBack { start_ts });
    }
    Ok(())
}

impl Rows {
    /// `writes` is not empty.
    fn of(
        writes: BTreeMap<(Bytes, Bytes), Option<Bytes>>,
        unchecked: &BTreeSet<(Bytes, Bytes)>,
    ) -> Rows {
        let mut rows: BTreeMap<Bytes, Vec<CellWrite>> = BTreeMap::new();
        let mut checked_rows: BTreeSet<Bytes> = BTreeSet::new();
        for ((row, column), value) in writes {
            if !unchecked.contains(&(row.clone(), column.clone())) {
                checked_rows.insert(row.clone());
            }
            rows.entry(row).or_default().push(CellWrite { column, value });
        }
        let primary_row = checked_rows
            .first()
            .cloned()
            .unwrap_or_else(|| rows.first_key_value().map(|(r, _)| r.clone()).expect("non-empty"));
        let primary_cells = rows.remove(&primary_row).expect("the primary's row is buffered");
        let (checked, blind) = rows.into_iter().partition(|(row, _)| checked_rows.contains(row));
        Rows { primary_row, primary_cells, checked, blind }
    }
}

/// A transaction that wrote nothing: its notifications (every one asked for, at a fresh
/// timestamp) and its after-commit mutations.
async fn read_only(
    client: &Client,
    notify: BTreeSet<(Bytes, Bytes)>,
    after_commit: Vec<perc_store::RowMutation>,
) -> Result<(), TxnError> {
    let store = client.store().as_ref();
    let mut older_notifications = Vec::new();
    if !notify.is_empty() {
        let ts = client.oracle().next().await?;
        older_notifications = set_notifications(store, notify, ts).await?;
        // Durable before the older cells go, and before the run that asked for them clears
        // its own notification.
        store.sync().await?;
    }
    let after_commit = [older_notifications, after_commit].concat();
    if !after_commit.is_empty() {
        store.mutate_rows(&after_commit).await?;
    }
    Ok(())
}

/// Prewrites the rows beside the primary's, all at once. If one fails, the commit aborts:
/// its own locks go, the primary's first (with its rollback record), and the error is
/// returned.
async fn prewrite_secondaries(
    client: &Client,
    unfinished: &mut Unfinished,
    checked: &[(Bytes, Vec<CellWrite>)],
    blind: &[(Bytes, Vec<CellWrite>)],
    info: &LockInfo,
) -> Result<(), TxnError> {
    let store = client.store().as_ref();
    let start_ts = unfinished.start_ts;
    let (results, blind_result) = futures::future::join(
        futures::future::join_all(
            checked.iter().map(|(row, cells)| actions::prewrite(store, row, cells, start_ts, info)),
        ),
        actions::prewrite_unchecked(store, blind, start_ts, info),
    )
    .await;
    if results.iter().all(Result::is_ok) && blind_result.is_ok() {
        return Ok(());
    }
    let columns = unfinished.disarm();
    let (primary_row, primary_column) = &info.primary;
    actions::rollback_primary(store, primary_row, primary_column, &columns, start_ts).await?;
    // The unchecked batch may have been written in part: roll all of it back.
    let ours: Vec<(Bytes, Vec<Bytes>)> = checked
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|(row, _)| row)
        .chain(blind)
        .map(|(row, cells)| (row.clone(), cells.iter().map(|c| c.column.clone()).collect()))
        .collect();
    actions::rollback_secondaries(store, &ours, start_ts).await?;
    let err = results
        .into_iter()
        .find_map(Result::err)
        .or(blind_result.err())
        .expect("a prewrite failed");
    clean_conflicting_lock(client, &err).await?;
    Err(err)
}

/// A commit between its primary's prewrite and its commit point. Left there (an error
/// returned, a panic below, its future dropped), it rolls the primary back on a task of its
/// own: the locks it left are then cleaned at once by whoever meets them (their primary
/// rolled back), not after the lock TTL, which a live owner's locks would otherwise wait out.
/// (A failed commit of the primary may have applied: the rollback then finds it committed
/// and changes nothing.) Fault tests' crash points disarm it, as a dead process cleans
/// nothing.
struct Unfinished {
    client: Client,
    row: Bytes,
    /// The primary's columns (a primary has at least one); none once disarmed.
    columns: Vec<Bytes>,
    start_ts: Ts,
}

impl Unfinished {
    /// The commit is decided, or left as a crash leaves it: nothing to roll back when
    /// dropped. Returns the primary's columns (the abort rolls them back itself).
    fn disarm(&mut self) -> Vec<Bytes> {
        std::mem::take(&mut self.columns)
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        let columns = self.disarm();
        if columns.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (client, row, start_ts) = (self.client.clone(), self.row.clone(), self.start_ts);
        runtime.spawn(async move {
            let store = client.store().as_ref();
            let primary = &columns[0];
            if let Err(e) = actions::rollback_primary(store, &row, primary, &columns, start_ts).await
            {
                tracing::warn!(error = %e, row = %row.escape_ascii(), %start_ts, "cannot roll back an unfinished commit; its locks wait out their TTL");
            }
        });
    }
}

/// Of the conditional notifications `weak_if` that `notify` does not hold already, those
/// whose row has a lock or a committed write in one of its probe columns, at any timestamp
/// (one batched read; see [`Transaction::notify_if_written`]).
async fn probes_written(
    store: &dyn Store,
    weak_if: BTreeMap<(Bytes, Bytes), Probes>,
    notify: &BTreeSet<(Bytes, Bytes)>,
) -> Result<Vec<(Bytes, Bytes)>, TxnError> {
    let asked: Vec<((Bytes, Bytes), Probes)> =
        weak_if.into_iter().filter(|(key, _)| !notify.contains(key)).collect();
    if asked.is_empty() {
        return Ok(Vec::new());
    }
    let reads: Vec<RowRead> = asked
        .iter()
        .map(|((row, _), probes)| RowRead {
            row: row.clone(),
            reads: probes
                .iter()
                .flat_map(|p| {
                    let probe = Bytes::from_static(p);
                    [
                        ColumnRead::newest(lock_col(&probe), TsRange::ALL),
                        ColumnRead::newest(write_col(&probe), TsRange::ALL),
                    ]
                })
                .collect(),
        })
        .collect();
    let got = store.read_rows(&reads).await?;
    Ok(asked
        .into_iter()
        .zip(got)
        .filter(|(_, cells)| cells.iter().any(|c| !c.is_empty()))
        .map(|((key, _), _)| key)
        .collect())
}

/// Sets the notify cells of `cells` at `ts` (one batched call), and returns the deletes of
/// the older cells of the same notifications, to be made once these are durable: one cell per
/// pending notification, not one per write (a page many pages link to would otherwise hold a
/// notify cell per inlink until its run, and every scanner round would read them all; only
/// the newest matters, as a run clears the cells at or below the one it saw). Made before the
/// new cell is flushed, a delete could outlive it in a crash and take the notification with it.
async fn set_notifications(
    store: &dyn Store,
    cells: BTreeSet<(Bytes, Bytes)>,
    ts: Ts,
) -> Result<Vec<perc_store::RowMutation>, TxnError> {
    if cells.is_empty() {
        return Ok(Vec::new());
    }
    let (mut set, mut older) = (Vec::new(), Vec::new());
    let range = TsRange::up_to(Ts(ts.0.saturating_sub(1)));
    for (row, column) in cells {
        let column = actions::notify_col(&column);
        let put = perc_store::Mutation::Put { column: column.clone(), ts, value: Bytes::new() };
        set.push(perc_store::RowMutation { row: row.clone(), mutations: vec![put] });
        let delete = perc_store::Mutation::Delete { column, range };
        older.push(perc_store::RowMutation { row, mutations: vec![delete] });
    }
    store.mutate_rows(&set).await?;
    Ok(older)
}

enum Outcome {
    Committed(Option<Ts>),
    /// Only with a crash point, which only the `failpoints` feature can give.
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    Crashed(Crashed),
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
