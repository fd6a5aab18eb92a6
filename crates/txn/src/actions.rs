//! The protocol's steps, each a function of the store and a transaction's facts (TiKV's
//! "actions" layer): prewrite, commit, rollback, status and lock resolution. Each step that
//! must be atomic is exactly one conditional mutation of one row; the [`crate::Transaction`]
//! composes them into the paper's Figure 6, and lock resolution composes them for readers.
//!
//! Invariants these functions keep:
//! - A prewrite succeeds only if the cell has no lock at all and no write record at or after
//!   `start_ts` (first committer wins; a rollback record at `start_ts` blocks a late prewrite).
//! - The primary commits only while its own lock is still there (the commit point); once it
//!   is gone without a commit record, the transaction can never commit.
//! - A rolled-back primary leaves a rollback record at `start_ts`, written in the same
//!   mutation that removes its lock, or guarded by "no lock at `start_ts`".
//! - Secondaries are rolled forward only after their primary committed, and back only after
//!   it was rolled back: two resolvers decide by the primary and so always agree.

use bytes::Bytes;
use perc_store::{
    Column, ColumnRead, Condition, FamilySpec, Locality, Mutation, RowMutation, Store, Ts, TsRange,
};

use crate::liveness::Liveness;
use crate::record::{CellKey, ClientId, LockRecord, WriteKind, WriteRecord};
use crate::TxnError;

/// `data`: the value written by the transaction that started at the cell's timestamp.
pub const DATA: FamilySpec = FamilySpec { name: "data", locality: Locality::Row };
/// `lock`: an uncommitted write, at the writer's start_ts.
pub const LOCK: FamilySpec = FamilySpec { name: "lock", locality: Locality::Row };
/// `write`: a commit record at commit_ts pointing to data at start_ts (or a rollback record).
pub const WRITE: FamilySpec = FamilySpec { name: "write", locality: Locality::Row };

/// `notify`: a hint that a watched column changed, at the writer's commit_ts (or a weak
/// notification). In a locality group of its own, so that scanning it reads nothing else.
pub const NOTIFY: FamilySpec = FamilySpec { name: "notify", locality: Locality::Own };

pub fn notify_col(c: &Bytes) -> Column {
    Column { family: NOTIFY.name, qualifier: c.clone() }
}
pub fn data_col(c: &Bytes) -> Column {
    Column { family: DATA.name, qualifier: c.clone() }
}
pub fn lock_col(c: &Bytes) -> Column {
    Column { family: LOCK.name, qualifier: c.clone() }
}
pub fn write_col(c: &Bytes) -> Column {
    Column { family: WRITE.name, qualifier: c.clone() }
}

/// One buffered write: `value` None is a delete.
#[derive(Clone, Debug)]
pub struct CellWrite {
    pub column: Bytes,
    pub value: Option<Bytes>,
}

impl CellWrite {
    pub fn kind(&self) -> WriteKind {
        if self.value.is_some() {
            WriteKind::Put
        } else {
            WriteKind::Delete
        }
    }
}

/// What the owner stamps into each lock it takes.
#[derive(Clone, Debug)]
pub struct LockInfo {
    pub primary: CellKey,
    pub owner: ClientId,
    pub wall_ms: u64,
    pub ttl_ms: u64,
}

/// A prewrite's mutations of one row: each cell's data (for a put) and its lock at start_ts.
fn prewrite_mutations(
    row: &Bytes,
    cells: &[CellWrite],
    start_ts: Ts,
    info: &LockInfo,
) -> Vec<Mutation> {
    let mut mutations = Vec::with_capacity(cells.len() * 2);
    for cell in cells {
        if let Some(value) = &cell.value {
            mutations.push(Mutation::Put {
                column: data_col(&cell.column),
                ts: start_ts,
                value: value.clone(),
            });
        }
        let is_primary = info.primary.0 == row && info.primary.1 == cell.column;
        let lock = LockRecord {
            primary: if is_primary { None } else { Some(info.primary.clone()) },
            kind: cell.kind(),
            owner: info.owner,
            wall_ms: info.wall_ms,
            ttl_ms: info.ttl_ms,
        };
        mutations.push(Mutation::Put {
            column: lock_col(&cell.column),
            ts: start_ts,
            value: lock.encode(),
        });
    }
    mutations
}

/// Prewrites rows whose cells need no conflict check ([`crate::Transaction::set_unchecked`]):
/// the same locks and data as [`prewrite`], written unconditionally, every row in one batched
/// call. Never the primary: its conditional prewrite is what decides the conflicts.
pub async fn prewrite_unchecked(
    store: &dyn Store,
    rows: &[(Bytes, Vec<CellWrite>)],
    start_ts: Ts,
    info: &LockInfo,
) -> Result<(), TxnError> {
    mutate_each(store, rows, |row, cells| prewrite_mutations(row, cells, start_ts, info)).await
}

/// One batched unconditional call with `mutations(row, of)` for each row (none if empty).
async fn mutate_each<T>(
    store: &dyn Store,
    rows: &[(Bytes, T)],
    mutations: impl Fn(&Bytes, &T) -> Vec<Mutation>,
) -> Result<(), TxnError> {
    if rows.is_empty() {
        return Ok(());
    }
    let batch: Vec<RowMutation> = rows
        .iter()
        .map(|(row, of)| RowMutation { row: row.clone(), mutations: mutations(row, of) })
        .collect();
    store.mutate_rows(&batch).await?;
    Ok(())
}

/// Prewrites every cell of `row` in one conditional mutation.
///
/// The condition is "no lock, and no write record at or after `start_ts`". Other
/// transactions' rollback records are write records too, but not commits: when a prewrite
/// fails only because of them, it is retried with a condition that leaves out exactly their
/// timestamps (a start_ts is never a commit_ts, so nothing else can stand there).
pub async fn prewrite(
    store: &dyn Store,
    row: &Bytes,
    cells: &[CellWrite],
    start_ts: Ts,
    info: &LockInfo,
) -> Result<(), TxnError> {
    let mutations = prewrite_mutations(row, cells, start_ts, info);
    // Per cell: the timestamps of other transactions' rollback records at or after start_ts.
    let mut skip: Vec<Vec<Ts>> = vec![Vec::new(); cells.len()];
    loop {
        let mut conditions = Vec::with_capacity(cells.len() * 2);
        for (cell, skip) in cells.iter().zip(&skip) {
            for range in gaps(start_ts, skip) {
                conditions.push(Condition::NoCellIn { column: write_col(&cell.column), range });
            }
            conditions
                .push(Condition::NoCellIn { column: lock_col(&cell.column), range: TsRange::ALL });
        }
        if store.check_and_mutate(row, &conditions, &mutations).await? {
            return Ok(());
        }
        // Name the conflict; if there is none (a lock vanished, or only rollbacks of others
        // stand in the way), try again.
        match explain_conflict(store, row, cells, start_ts).await? {
            Explained::Conflict(e) => return Err(e),
            Explained::OthersRollbacks(rollbacks) => skip = rollbacks,
        }
    }
}

/// `[start_ts, MAX]` without the timestamps in `skip`, as ranges.
fn gaps(start_ts: Ts, skip: &[Ts]) -> Vec<TsRange> {
    let mut skip: Vec<Ts> = skip.iter().copied().filter(|t| *t >= start_ts).collect();
    skip.sort();
    let mut out = Vec::with_capacity(skip.len() + 1);
    let mut from = start_ts;
    for t in skip {
        if t > from {
            out.push(TsRange::new(from, Ts(t.0 - 1)));
        }
        from = t.next();
    }
    if from <= Ts::MAX {
        out.push(TsRange::from(from));
    }
    out
}

enum Explained {
    Conflict(TxnError),
    OthersRollbacks(Vec<Vec<Ts>>),
}

async fn explain_conflict(
    store: &dyn Store,
    row: &Bytes,
    cells: &[CellWrite],
    start_ts: Ts,
) -> Result<Explained, TxnError> {
    let reads: Vec<ColumnRead> = cells
        .iter()
        .flat_map(|c| {
            [
                ColumnRead::all(write_col(&c.column), TsRange::from(start_ts)),
                ColumnRead::newest(lock_col(&c.column), TsRange::ALL),
            ]
        })
        .collect();
    let got = store.read_row(row, &reads).await?;
    let mut rollbacks = Vec::with_capacity(cells.len());
    for (cell, pair) in cells.iter().zip(got.chunks(2)) {
        let mut mine = Vec::new();
        for w in &pair[0] {
            let record = WriteRecord::decode(&w.value)?;
            if record.kind != WriteKind::Rollback {
                return Ok(Explained::Conflict(TxnError::WriteConflict {
                    row: row.clone(),
                    column: cell.column.clone(),
                    start_ts,
                    conflicting_commit_ts: w.ts,
                }));
            }
            if record.start_ts == start_ts {
                // Our own rollback guard: a resolver decided this transaction is dead.
                return Ok(Explained::Conflict(TxnError::RolledBack { start_ts }));
            }
            mine.push(w.ts);
        }
        if let Some(l) = pair[1].first() {
            let lock = LockRecord::decode(&l.value)?;
            return Ok(Explained::Conflict(TxnError::LockConflict {
                row: row.clone(),
                column: cell.column.clone(),
                start_ts,
                lock_ts: l.ts,
                owner: lock.owner,
            }));
        }
        rollbacks.push(mine);
    }
    Ok(Explained::OthersRollbacks(rollbacks))
}

/// Commits the primary's row: the commit point. Other cells of the same row commit with it.
/// Idempotent: committing a committed transaction again succeeds.
pub async fn commit_primary(
    store: &dyn Store,
    row: &Bytes,
    primary_column: &Bytes,
    cells: &[(Bytes, WriteKind)],
    start_ts: Ts,
    commit_ts: Ts,
) -> Result<(), TxnError> {
    let condition = [Condition::CellAt { column: lock_col(primary_column), ts: start_ts }];
    let mutations = commit_mutations(cells, start_ts, commit_ts);
    if store.check_and_mutate(row, &condition, &mutations).await? {
        return Ok(());
    }
    match status(store, row, primary_column, start_ts).await? {
        TxnStatus::Committed(_) => Ok(()),
        _ => Err(TxnError::RolledBack { start_ts }),
    }
}

fn commit_mutations(cells: &[(Bytes, WriteKind)], start_ts: Ts, commit_ts: Ts) -> Vec<Mutation> {
    let mut mutations = Vec::with_capacity(cells.len() * 2);
    for (column, kind) in cells {
        let record = WriteRecord { kind: *kind, start_ts };
        mutations.push(Mutation::Put {
            column: write_col(column),
            ts: commit_ts,
            value: record.encode(),
        });
        mutations.push(Mutation::Delete { column: lock_col(column), range: TsRange::at(start_ts) });
    }
    mutations
}

/// The delete records of cells deleted at commit without a lock
/// ([`crate::Transaction::delete_at_commit`]): what committing a prewritten delete of each
/// would leave, a delete record at `commit_ts` (there is no lock to take away).
pub fn delete_records(cells: &[(Bytes, Bytes)], start_ts: Ts, commit_ts: Ts) -> Vec<RowMutation> {
    let record = WriteRecord { kind: WriteKind::Delete, start_ts }.encode();
    cells
        .iter()
        .map(|(row, column)| RowMutation {
            row: row.clone(),
            mutations: vec![Mutation::Put {
                column: write_col(column),
                ts: commit_ts,
                value: record.clone(),
            }],
        })
        .collect()
}

/// Commits secondaries after the primary committed, all rows in one batched call, with
/// `also` (the transaction's after-commit bookkeeping) in the same call. Needs no condition:
/// once the primary is committed, every resolver rolls these cells forward to the same
/// record, so writing it twice is harmless.
pub async fn commit_secondaries(
    store: &dyn Store,
    rows: &[(Bytes, Vec<(Bytes, WriteKind)>)],
    start_ts: Ts,
    commit_ts: Ts,
    mut also: Vec<RowMutation>,
) -> Result<(), TxnError> {
    let mut batch: Vec<RowMutation> = rows
        .iter()
        .map(|(row, cells)| RowMutation {
            row: row.clone(),
            mutations: commit_mutations(cells, start_ts, commit_ts),
        })
        .collect();
    batch.append(&mut also);
    if !batch.is_empty() {
        store.mutate_rows(&batch).await?;
    }
    Ok(())
}

/// The state of the transaction that started at `start_ts`, read at its primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnStatus {
    /// The primary's lock is still there: not decided yet.
    Locked(LockRecord),
    Committed(Ts),
    RolledBack,
    /// No lock and no record: never prewritten here (or rolled back without a guard).
    Absent,
}

pub async fn status(
    store: &dyn Store,
    row: &Bytes,
    column: &Bytes,
    start_ts: Ts,
) -> Result<TxnStatus, TxnError> {
    let got = store
        .read_row(
            row,
            &[
                ColumnRead::newest(lock_col(column), TsRange::at(start_ts)),
                ColumnRead::all(write_col(column), TsRange::from(start_ts)),
            ],
        )
        .await?;
    if let Some(l) = got[0].first() {
        return Ok(TxnStatus::Locked(LockRecord::decode(&l.value)?));
    }
    for w in &got[1] {
        let record = WriteRecord::decode(&w.value)?;
        if record.start_ts == start_ts {
            return Ok(match record.kind {
                WriteKind::Rollback => TxnStatus::RolledBack,
                _ => TxnStatus::Committed(w.ts),
            });
        }
    }
    Ok(TxnStatus::Absent)
}

/// How a rollback attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decided {
    RolledBack,
    Committed(Ts),
}

/// Rolls back the cells of the primary's row (`primary_column` is among `columns`), leaving
/// a rollback record that keeps the transaction from ever committing. If the primary turns
/// out to be committed, changes nothing and says so.
pub async fn rollback_primary(
    store: &dyn Store,
    row: &Bytes,
    primary_column: &Bytes,
    columns: &[Bytes],
    start_ts: Ts,
) -> Result<Decided, TxnError> {
    let mut mutations = rollback_mutations(columns, start_ts);
    let guard = WriteRecord { kind: WriteKind::Rollback, start_ts };
    mutations.push(Mutation::Put {
        column: write_col(primary_column),
        ts: start_ts,
        value: guard.encode(),
    });
    loop {
        let has_lock = [Condition::CellAt { column: lock_col(primary_column), ts: start_ts }];
        if store.check_and_mutate(row, &has_lock, &mutations).await? {
            return Ok(Decided::RolledBack);
        }
        match status(store, row, primary_column, start_ts).await? {
            TxnStatus::Committed(ts) => return Ok(Decided::Committed(ts)),
            TxnStatus::RolledBack => return Ok(Decided::RolledBack),
            TxnStatus::Locked(_) => continue,
            TxnStatus::Absent => {
                // Never prewritten (or already cleaned): write the guard, unless a prewrite
                // slipped in meanwhile, in which case decide again.
                let no_lock = [Condition::NoCellIn {
                    column: lock_col(primary_column),
                    range: TsRange::at(start_ts),
                }];
                if store.check_and_mutate(row, &no_lock, &mutations).await? {
                    return Ok(Decided::RolledBack);
                }
            }
        }
    }
}

fn rollback_mutations(columns: &[Bytes], start_ts: Ts) -> Vec<Mutation> {
    columns
        .iter()
        .flat_map(|c| {
            [
                Mutation::Delete { column: lock_col(c), range: TsRange::at(start_ts) },
                Mutation::Delete { column: data_col(c), range: TsRange::at(start_ts) },
            ]
        })
        .collect()
}

/// Removes a transaction's secondary locks and data. Only for a transaction whose primary is
/// rolled back (or was never committed and never will be, as its owner aborts it).
pub async fn rollback_secondaries(
    store: &dyn Store,
    rows: &[(Bytes, Vec<Bytes>)],
    start_ts: Ts,
) -> Result<(), TxnError> {
    mutate_each(store, rows, |_, columns| rollback_mutations(columns, start_ts)).await
}

/// What a reader did about a lock it met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    RolledForward(Ts),
    RolledBack,
    /// The owner is alive and the lock is young: wait.
    Wait,
}

/// Whether a lock may be cleaned by someone other than its owner.
pub async fn is_abandoned(
    lock: &LockRecord,
    now_ms: u64,
    liveness: &Liveness,
) -> Result<bool, TxnError> {
    if now_ms >= lock.wall_ms.saturating_add(lock.ttl_ms) {
        return Ok(true);
    }
    Ok(!liveness.is_alive(lock.owner).await?)
}

/// Resolves the lock at `lock_ts` on `(row, column)` through its primary: roll forward if the
/// primary committed, back if it was rolled back, and if it is undecided, roll the primary
/// back first when its owner is gone or the lock is stale.
pub async fn resolve(
    store: &dyn Store,
    liveness: &Liveness,
    now_ms: u64,
    row: &Bytes,
    column: &Bytes,
    lock_ts: Ts,
    lock: &LockRecord,
) -> Result<Resolution, TxnError> {
    let (prow, pcol) = lock.primary.clone().unwrap_or_else(|| (row.clone(), column.clone()));
    let decided = match status(store, &prow, &pcol, lock_ts).await? {
        TxnStatus::Committed(ts) => Decided::Committed(ts),
        TxnStatus::RolledBack => Decided::RolledBack,
        TxnStatus::Locked(primary_lock) => {
            if !is_abandoned(&primary_lock, now_ms, liveness).await? {
                return Ok(Resolution::Wait);
            }
            rollback_primary(store, &prow, &pcol, std::slice::from_ref(&pcol), lock_ts).await?
        }
        TxnStatus::Absent => {
            rollback_primary(store, &prow, &pcol, std::slice::from_ref(&pcol), lock_ts).await?
        }
    };
    let is_primary = lock.primary.is_none();
    let has_lock = [Condition::CellAt { column: lock_col(column), ts: lock_ts }];
    match decided {
        Decided::Committed(commit_ts) => {
            if !is_primary {
                let m = commit_mutations(&[(column.clone(), lock.kind)], lock_ts, commit_ts);
                store.check_and_mutate(row, &has_lock, &m).await?;
            }
            Ok(Resolution::RolledForward(commit_ts))
        }
        Decided::RolledBack => {
            if !is_primary {
                let m = rollback_mutations(std::slice::from_ref(column), lock_ts);
                store.check_and_mutate(row, &has_lock, &m).await?;
            }
            Ok(Resolution::RolledBack)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_leave_out_exactly_the_skipped_timestamps() {
        let r = |a, b| TsRange::new(Ts(a), Ts(b));
        assert_eq!(gaps(Ts(10), &[]), vec![TsRange::from(Ts(10))]);
        assert_eq!(
            gaps(Ts(10), &[Ts(12), Ts(15)]),
            vec![r(10, 11), r(13, 14), TsRange::from(Ts(16))]
        );
        assert_eq!(gaps(Ts(10), &[Ts(11), Ts(10)]), vec![TsRange::from(Ts(12))]);
        assert_eq!(gaps(Ts(10), &[Ts::MAX]), vec![r(10, Ts::MAX.0 - 1)]);
    }
}
