//! Garbage collection of versions no live transaction can read.
//!
//! The safe point `G` is the smallest low watermark among live workers (each worker publishes
//! one with its heartbeat: no transaction of it, running or future, starts below it). Every
//! reader that can still exist reads at or above `G`, so for each cell it needs only the
//! newest committed version at or below `G` and what is newer. Per cell:
//!
//! ```text
//!   write:c   ts 40 put(start 38)   > G: kept
//!             ts 25 put(start 21)   W, newest committed <= G: kept (dropped too if a delete)
//!             ts 12 put(start 10)   older than W: dropped, with data below W's start_ts
//!             ts 11 rollback        below G: dropped (its owner is finished or dead)
//! ```
//!
//! A cell holding a lock is skipped (its data may still be rolled forward); the cells of a
//! row are cleaned together by one conditional mutation guarded by "no lock" on each (and,
//! if one is locked, the others one by one). Ack columns are transactional
//! columns and are collected the same way (the notification layer deletes its notify cells
//! itself, as it processes them).
//! Registry rows of workers dead for ten liveness TTLs are removed.
//!
//! Besides the pass over the whole store, a prompt collection ([`collect_deleted`]) cleans the
//! rows the client's own commits emptied (or were asked to), as soon as the safe point passes
//! their commit.

use crate::{actions, Client, TxnError, WriteKind, WriteRecord};
use bytes::Bytes;
use perc_store::{Condition, Mutation, Scan, ScanCell, Ts, TsRange};

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub safe_point: Ts,
    pub cells_seen: u64,
    pub cells_cleaned: u64,
    pub write_records_removed: u64,
    pub workers_removed: u64,
}

/// The smallest low watermark of the live workers (at most the oracle's next timestamp).
pub async fn safe_point(client: &Client) -> Result<Ts, TxnError> {
    // Our own entry first, so that it is fresh like the others'.
    client.heartbeat().await?;
    let mut point = client.oracle().next().await?;
    for (entry, alive) in client.liveness().workers().await? {
        if alive {
            point = point.min(entry.low_watermark);
        }
    }
    Ok(point)
}

/// One pass over the `write` family, `batch` cells per scan.
pub async fn collect(client: &Client, batch: usize) -> Result<GcReport, TxnError> {
    let g = safe_point(client).await?;
    let store = client.store();
    let mut report = GcReport { safe_point: g, ..GcReport::default() };
    let mut start = Bytes::new();
    loop {
        let scan = Scan {
            family: actions::WRITE.name,
            start: start.clone(),
            end: Bytes::new(),
            limit: batch,
        };
        let mut cells = store.scan(&scan).await?;
        let next = if cells.len() >= batch {
            // The batch may have cut the last row short: read that row whole, go on after it.
            let last = cells.last().expect("a full batch").row.clone();
            cells.retain(|c| c.row != last);
            let whole = whole_row(last);
            let after = whole.end.clone();
            cells.extend(store.scan(&whole).await?);
            Some(after)
        } else {
            None
        };
        clean(client, cells, g, &mut report).await?;
        match next {
            Some(n) => start = n,
            None => break,
        }
    }
    report.workers_removed = remove_dead_workers(client).await?;
    // The versions dropped may have been the last references to values the backend can now
    // let go of (the sled backend's value log).
    store.maintain().await?;
    Ok(report)
}

/// The prompt collection: the rows this client's commits emptied (only deletes) or were asked
/// to ([`crate::Transaction::collect_soon`]), whose commits the safe point has passed,
/// cleaned row by row, `batch` rows a read. Rows deleted to be gone
/// (a stage's change rows, taken and deleted by its next run) so leave the store seconds
/// after their delete, where the pass over the whole store would find them only after it
/// went round (minutes, on a big store): until then each is a key sled keeps a record of.
pub async fn collect_deleted(client: &Client, batch: usize) -> Result<GcReport, TxnError> {
    let g = safe_point(client).await?;
    let mut report = GcReport { safe_point: g, ..GcReport::default() };
    let mut rows = client.take_to_collect(g);
    rows.sort();
    rows.dedup();
    for chunk in rows.chunks(batch.max(1)) {
        let scans: Vec<Scan> = chunk.iter().cloned().map(whole_row).collect();
        let cells = client.store().scan_many(&scans).await?.into_iter().flatten().collect();
        clean(client, cells, g, &mut report).await?;
    }
    Ok(report)
}

/// A scan of the `write` cells of `row` alone, every version.
fn whole_row(row: Bytes) -> Scan {
    let mut end = row.to_vec();
    end.push(0);
    Scan { family: actions::WRITE.name, start: row, end: Bytes::from(end), limit: usize::MAX }
}

/// Cleans `cells` (write records as a scan returns them, whole rows), row by row, counting
/// into `report`.
async fn clean(
    client: &Client,
    cells: Vec<ScanCell>,
    g: Ts,
    report: &mut GcReport,
) -> Result<(), TxnError> {
    let mut groups: Vec<Vec<ScanCell>> = Vec::new();
    for c in cells {
        match groups.last_mut() {
            Some(group) if group[0].row == c.row && group[0].qualifier == c.qualifier => {
                group.push(c)
            }
            _ => groups.push(vec![c]),
        }
    }
    report.cells_seen += groups.len() as u64;
    // The cells of one row are cleaned by one conditional mutation: a scan batch after a
    // bulk load is mostly page rows with a dozen collectable cells each, and each
    // mutation rewrites the row's record (on sled) or is an RPC (on Bigtable).
    for row_cells in groups.chunk_by(|a, b| a[0].row == b[0].row) {
        let (cleaned, removed) = clean_row(client, row_cells, g).await?;
        report.cells_cleaned += cleaned;
        report.write_records_removed += removed;
    }
    Ok(())
}

/// Cleans the cells of one row (each its write records, newest first) in one conditional
/// mutation, guarded by "no lock" on each; if one of them is locked, each of the others alone.
/// Returns how many cells were cleaned and how many write records went.
async fn clean_row(
    client: &Client,
    cells: &[Vec<ScanCell>],
    g: Ts,
) -> Result<(u64, u64), TxnError> {
    let row = &cells[0][0].row;
    let mut plans = Vec::new();
    for records in cells {
        if let Some(plan) = plan_cell(records, g)? {
            plans.push(plan);
        }
    }
    // Calls of as many cells as fit in MUTATIONS_PER_CALL (at least one cell each).
    let (mut cleaned, mut removed) = (0, 0);
    let (mut first, mut size) = (0, 0);
    for (i, p) in plans.iter().enumerate() {
        if i > first && size + p.mutations.len() > MUTATIONS_PER_CALL {
            let (c, r) = clean_cells(client, row, &plans[first..i]).await?;
            (cleaned, removed) = (cleaned + c, removed + r);
            (first, size) = (i, 0);
        }
        size += p.mutations.len();
    }
    if first < plans.len() {
        let (c, r) = clean_cells(client, row, &plans[first..]).await?;
        (cleaned, removed) = (cleaned + c, removed + r);
    }
    Ok((cleaned, removed))
}

/// The most mutations one collecting call carries (Bigtable takes up to 100,000).
const MUTATIONS_PER_CALL: usize = 10_000;

/// [`clean_row`]'s call for some cells of one row: one conditional mutation, or, if a cell is
/// locked, one for each cell.
async fn clean_cells(
    client: &Client,
    row: &[u8],
    plans: &[CellPlan],
) -> Result<(u64, u64), TxnError> {
    let store = client.store();
    let conditions: Vec<Condition> = plans.iter().map(|p| p.no_lock.clone()).collect();
    let mutations: Vec<Mutation> = plans.iter().flat_map(|p| p.mutations.iter().cloned()).collect();
    if store.check_and_mutate(row, &conditions, &mutations).await? {
        return Ok((plans.len() as u64, plans.iter().map(|p| p.removed).sum()));
    }
    if plans.len() == 1 {
        return Ok((0, 0)); // locked: next pass
    }
    let (mut cleaned, mut removed) = (0, 0);
    for p in plans {
        if store.check_and_mutate(row, std::slice::from_ref(&p.no_lock), &p.mutations).await? {
            cleaned += 1;
            removed += p.removed;
        }
    }
    Ok((cleaned, removed))
}

/// What collecting one cell takes: the mutations, guarded by its condition.
struct CellPlan {
    no_lock: Condition,
    mutations: Vec<Mutation>,
    /// Write records the mutations drop.
    removed: u64,
}

/// The collection of one cell (its write records, newest first), or `None` if nothing in it
/// is garbage.
fn plan_cell(records: &[ScanCell], g: Ts) -> Result<Option<CellPlan>, TxnError> {
    let column = &records[0].qualifier;
    let mut drop_ts: Vec<Ts> = Vec::new();
    let mut newest: Option<(Ts, WriteRecord)> = None;
    for cell in records {
        let record = WriteRecord::decode(&cell.value)?;
        if cell.ts > g {
            continue;
        }
        if record.kind == WriteKind::Rollback {
            if cell.ts < g {
                drop_ts.push(cell.ts);
            }
            continue;
        }
        match newest {
            None => {
                newest = Some((cell.ts, record));
                if record.kind == WriteKind::Delete {
                    drop_ts.push(cell.ts);
                }
            }
            Some(_) => drop_ts.push(cell.ts),
        }
    }
    if drop_ts.is_empty() {
        return Ok(None);
    }
    let mut mutations: Vec<Mutation> = drop_ts
        .iter()
        .map(|ts| Mutation::Delete { column: actions::write_col(column), range: TsRange::at(*ts) })
        .collect();
    if let Some((_, w)) = newest {
        if w.start_ts > Ts::ZERO {
            mutations.push(Mutation::Delete {
                column: actions::data_col(column),
                range: TsRange::up_to(Ts(w.start_ts.0 - 1)),
            });
        }
    }
    Ok(Some(CellPlan {
        no_lock: Condition::NoCellIn { column: actions::lock_col(column), range: TsRange::ALL },
        mutations,
        removed: drop_ts.len() as u64,
    }))
}

async fn remove_dead_workers(client: &Client) -> Result<u64, TxnError> {
    let now = client.clock().now_ms();
    let horizon = client.liveness().ttl_ms().saturating_mul(10);
    let mut removed = 0;
    for (entry, _) in client.liveness().workers().await? {
        if now.saturating_sub(entry.heartbeat_ms) > horizon {
            client.liveness().deregister(entry.worker).await?;
            removed += 1;
        }
    }
    Ok(removed)
}
