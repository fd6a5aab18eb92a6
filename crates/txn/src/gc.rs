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
//! A cell holding a lock is skipped (its data may still be rolled forward), and each cell is
//! cleaned with one conditional mutation guarded by "no lock". Ack columns are transactional
//! columns and are collected the same way (the notification layer deletes its notify cells
//! itself, as it processes them).
//! Registry rows of workers dead for ten liveness TTLs are removed.

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
            let mut after = last.to_vec();
            after.push(0);
            let after = Bytes::from(after);
            let whole = Scan {
                family: actions::WRITE.name,
                start: last,
                end: after.clone(),
                limit: usize::MAX,
            };
            cells.extend(store.scan(&whole).await?);
            Some(after)
        } else {
            None
        };
        let mut groups: Vec<Vec<ScanCell>> = Vec::new();
        for c in cells {
            match groups.last_mut() {
                Some(g) if g[0].row == c.row && g[0].qualifier == c.qualifier => g.push(c),
                _ => groups.push(vec![c]),
            }
        }
        for cell in &groups {
            report.cells_seen += 1;
            if let Some(removed) = clean_cell(client, cell, g).await? {
                report.cells_cleaned += 1;
                report.write_records_removed += removed;
            }
        }
        match next {
            Some(n) => start = n,
            None => break,
        }
    }
    report.workers_removed = remove_dead_workers(client).await?;
    Ok(report)
}

/// Cleans one cell (its write records, newest first); returns how many records went.
async fn clean_cell(client: &Client, records: &[ScanCell], g: Ts) -> Result<Option<u64>, TxnError> {
    let row = &records[0].row;
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
    let no_lock = [Condition::NoCellIn { column: actions::lock_col(column), range: TsRange::ALL }];
    if client.store().check_and_mutate(row, &no_lock, &mutations).await? {
        Ok(Some(drop_ts.len() as u64))
    } else {
        Ok(None) // locked: next pass
    }
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
