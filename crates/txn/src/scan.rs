//! A transaction's scans: the rows of a range that hold a value in a column, in its
//! snapshot, read from the `lock` and `write` families in pieces of bounded size.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use perc_store::{ColumnRead, RowRead, Ts, TsRange};

use crate::actions::{self, data_col};
use crate::{error, Transaction, TxnError, WriteKind, WriteRecord};

/// One range of [`Transaction::scan_each`]: the rows in `[start, end)` (`end` empty: to the
/// end) with a value in `column`, the first `rows` of them.
#[derive(Clone, Copy, Debug)]
pub struct RangeScan<'a> {
    pub start: &'a [u8],
    pub end: &'a [u8],
    pub column: &'a [u8],
    pub rows: usize,
}

impl<'a> RangeScan<'a> {
    /// Every row of the range.
    pub fn new(start: &'a [u8], end: &'a [u8], column: &'a [u8]) -> RangeScan<'a> {
        RangeScan { start, end, column, rows: usize::MAX }
    }

    /// Its first `rows` rows only.
    pub fn first(self, rows: usize) -> RangeScan<'a> {
        RangeScan { rows, ..self }
    }
}

/// A row a scan found: its value, and when that value was committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub row: Bytes,
    /// The commit timestamp of the value; [`Ts::MAX`] for this transaction's own buffered
    /// write (it commits after everything its snapshot holds).
    pub commit_ts: Ts,
    pub value: Bytes,
}

/// Whether a scan reads the values of the rows it finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Values {
    Read,
    Skip,
}

impl Transaction {
    /// The rows in `[start, end)` (`end` empty: to the end) that have a value in `column` in
    /// this snapshot, with those values, in row order (this transaction's own buffered writes
    /// included). Reads the `lock` and `write` families over the range (in one call for a
    /// range of up to `scan_piece_cells` records, in pieces of that many beyond), so its
    /// cost follows the cells in the range, not the table: keep scanned columns under a row
    /// prefix of their own. Its memory follows the values found and one piece.
    pub async fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        column: &[u8],
    ) -> Result<Vec<(Bytes, Bytes)>, TxnError> {
        Ok(self.scan_ranges(&[(start, end)], column).await?.pop().unwrap_or_default())
    }

    /// The rows of [`Self::scan`], without their values: it reads only the `lock` and
    /// `write` families (and a locked cell's value, to resolve the lock), so its memory
    /// follows the rows found and one piece (a count of the export's lines read 98k of them,
    /// 76 MiB, to count them).
    pub async fn scan_rows(
        &self,
        start: &[u8],
        end: &[u8],
        column: &[u8],
    ) -> Result<Vec<Bytes>, TxnError> {
        let range = RangeScan::new(start, end, column);
        let mut found = self.scan_pieces(&[range], Values::Skip).await?;
        Ok(found.pop().unwrap_or_default().into_iter().map(|f| f.row).collect())
    }

    /// [`Self::scan`] of several ranges, in one scan call for all of them and one read of
    /// the values found (and as many more as the ranges need pieces).
    pub async fn scan_ranges(
        &self,
        ranges: &[(&[u8], &[u8])],
        column: &[u8],
    ) -> Result<Vec<Vec<(Bytes, Bytes)>>, TxnError> {
        let ranges: Vec<RangeScan> =
            ranges.iter().map(|(start, end)| RangeScan::new(start, end, column)).collect();
        self.scan_each(&ranges).await
    }

    /// Several scans, each of its own range and column and each up to its own number of
    /// rows ([`RangeScan`]), in one scan call for all of them and one read of the values
    /// found (and as many more as the ranges need pieces): what [`Self::scan`] and
    /// [`Self::scan_first`] would find, one by one.
    pub async fn scan_each(
        &self,
        ranges: &[RangeScan<'_>],
    ) -> Result<Vec<Vec<(Bytes, Bytes)>>, TxnError> {
        let found = self.scan_pieces(ranges, Values::Read).await?;
        Ok(found.into_iter().map(|f| f.into_iter().map(|f| (f.row, f.value)).collect()).collect())
    }

    /// [`Self::scan_each`], with the commit timestamp of each value found: for a reader
    /// that keeps its own mark of what it has taken from a range (the rows committed before
    /// some timestamp), rather than deleting each row it took.
    pub async fn scan_each_found(
        &self,
        ranges: &[RangeScan<'_>],
    ) -> Result<Vec<Vec<Found>>, TxnError> {
        self.scan_pieces(ranges, Values::Read).await
    }

    /// The first `rows` rows of [`Self::scan`]: its cost follows them (and the versions
    /// and deleted rows among them, until GC drops those), not the whole range.
    pub async fn scan_first(
        &self,
        start: &[u8],
        end: &[u8],
        column: &[u8],
        rows: usize,
    ) -> Result<Vec<(Bytes, Bytes)>, TxnError> {
        let range = RangeScan::new(start, end, column).first(rows);
        let mut found = self.scan_pieces(&[range], Values::Read).await?;
        Ok(found.pop().unwrap_or_default().into_iter().map(|f| (f.row, f.value)).collect())
    }

    /// Each range read in pieces, each from where the last one stopped, until the range is
    /// read or has its rows. A range's first piece is `scan_piece_cells` records, or for a
    /// range of its first `rows` twice that many (at least 64, at most `scan_piece_cells`).
    /// A piece that leaves its range short grows fourfold, up to `scan_piece_cells`; beyond
    /// that only when one row holds more records than a piece (a row is read whole).
    async fn scan_pieces(
        &self,
        ranges: &[RangeScan<'_>],
        values: Values,
    ) -> Result<Vec<Vec<Found>>, TxnError> {
        let most = self.client.config().scan_piece_cells.max(1);
        let mut out: Vec<Vec<Found>> = vec![Vec::new(); ranges.len()];
        // Per range still to read: where its next piece starts, and the piece's size.
        let mut todo: Vec<(usize, Bytes, usize)> = ranges
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let piece = if r.rows == usize::MAX {
                    most
                } else {
                    r.rows.saturating_mul(2).max(64).min(most)
                };
                (i, Bytes::copy_from_slice(r.start), piece)
            })
            .collect();
        while !todo.is_empty() {
            let (found, cuts) = {
                let pieces: Vec<(RangeScan, usize)> = todo
                    .iter()
                    .map(|(i, start, size)| (RangeScan { start, ..ranges[*i] }, *size))
                    .collect();
                self.scan_cut(&pieces, values).await?
            };
            let mut next = Vec::new();
            for ((i, start, size), (found, cut)) in
                todo.into_iter().zip(found.into_iter().zip(cuts))
            {
                // Rows from the cut on were not read whole: the next piece starts there.
                out[i]
                    .extend(found.into_iter().filter(|f| cut.as_ref().is_none_or(|c| f.row < *c)));
                match cut {
                    Some(cut) if out[i].len() < ranges[i].rows => {
                        let grown = size.saturating_mul(4);
                        let size = if cut == start { grown } else { grown.min(most).max(size) };
                        next.push((i, cut, size));
                    }
                    _ => out[i].truncate(ranges[i].rows),
                }
            }
            todo = next;
        }
        Ok(out)
    }

    /// One piece of each range: at most its `cells` records of each family. With each range's
    /// values (empty ones with [`Values::Skip`], but for locked cells), the row where its
    /// reading stopped short (rows from it on are missing or partial), if it did.
    async fn scan_cut(
        &self,
        ranges: &[(RangeScan<'_>, usize)],
        values: Values,
    ) -> Result<(Vec<Vec<Found>>, Vec<Option<Bytes>>), TxnError> {
        if ranges.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let store = self.client.store();
        let scans: Vec<perc_store::Scan> = ranges
            .iter()
            .flat_map(|(r, cells)| {
                [actions::LOCK.name, actions::WRITE.name].map(|family| perc_store::Scan {
                    family,
                    start: Bytes::copy_from_slice(r.start),
                    end: Bytes::copy_from_slice(r.end),
                    limit: *cells,
                })
            })
            .collect();
        let mut scanned = store.scan_many(&scans).await?.into_iter();
        let mut cuts: Vec<Option<Bytes>> = Vec::new();
        // Per range: cells locked at or below start_ts, read one by one (which waits on or
        // resolves the lock exactly as `get` does), and the newest committed record at or
        // below start_ts of each other row (cells come newest first).
        let mut per_range: Vec<(BTreeSet<Bytes>, Newest)> = Vec::new();
        for (r, cells) in ranges {
            let (locks, writes) = (scanned.next(), scanned.next());
            // A family read up to its limit stopped at its last row, or before.
            let cut = [&locks, &writes]
                .into_iter()
                .filter_map(|f| f.as_ref().filter(|f| f.len() >= *cells)?.last())
                .map(|c| c.row.clone())
                .min();
            cuts.push(cut);
            let mut locked = BTreeSet::new();
            for c in locks.into_iter().flatten() {
                if c.qualifier.as_ref() == r.column && c.ts <= self.start_ts {
                    locked.insert(c.row);
                }
            }
            let mut newest = Newest::new();
            for c in writes.into_iter().flatten() {
                if c.qualifier.as_ref() != r.column
                    || c.ts > self.start_ts
                    || locked.contains(&c.row)
                    || newest.contains_key(&c.row)
                {
                    continue;
                }
                let record = WriteRecord::decode(&c.value)?;
                if record.kind != WriteKind::Rollback {
                    newest.insert(c.row, (record, c.ts));
                }
            }
            per_range.push((locked, newest));
        }
        // The values of every range's puts, in one read.
        let puts: Vec<Put> = per_range
            .iter_mut()
            .enumerate()
            .flat_map(|(i, (_, newest))| {
                std::mem::take(newest)
                    .into_iter()
                    .filter(|(_, (r, _))| r.kind == WriteKind::Put)
                    .map(move |(row, (r, commit_ts))| Put {
                        range: i,
                        row,
                        start_ts: r.start_ts,
                        commit_ts,
                    })
            })
            .collect();
        let columns: Vec<&[u8]> = ranges.iter().map(|(r, _)| r.column).collect();
        let mut found = read_puts(store.as_ref(), &columns, puts, values).await?;
        for (i, (locked, _)) in per_range.into_iter().enumerate() {
            for row in locked {
                let cell = (row.clone(), Bytes::copy_from_slice(ranges[i].0.column));
                let version = self.versions(&[cell]).await?.pop().flatten();
                found[i].insert(row, version.and_then(|v| Some((v.commit_ts, v.value?))));
            }
        }
        for ((r, _), found) in ranges.iter().zip(found.iter_mut()) {
            for ((row, col), v) in &self.writes {
                if col.as_ref() == r.column
                    && row.as_ref() >= r.start
                    && (r.end.is_empty() || row.as_ref() < r.end)
                {
                    found.insert(row.clone(), v.clone().map(|v| (Ts::MAX, v)));
                }
            }
        }
        let found = found
            .into_iter()
            .map(|f| {
                f.into_iter()
                    .filter_map(|(row, v)| {
                        v.map(|(commit_ts, value)| Found { row, commit_ts, value })
                    })
                    .collect()
            })
            .collect();
        Ok((found, cuts))
    }
}

/// Per row of a range, its newest committed record in the snapshot and that record's
/// timestamp (its commit's).
type Newest = BTreeMap<Bytes, (WriteRecord, Ts)>;

/// A committed put a range scan found: in which of the ranges, where, and when.
struct Put {
    range: usize,
    row: Bytes,
    start_ts: Ts,
    commit_ts: Ts,
}

/// Per range, the values of the puts found by a range scan with their commit timestamps,
/// in one read; with [`Values::Skip`], an empty value each. `columns` are the ranges'
/// columns.
async fn read_puts(
    store: &dyn perc_store::Store,
    columns: &[&[u8]],
    puts: Vec<Put>,
    values: Values,
) -> Result<Vec<BTreeMap<Bytes, Option<(Ts, Bytes)>>>, TxnError> {
    let mut found: Vec<BTreeMap<Bytes, Option<(Ts, Bytes)>>> = vec![BTreeMap::new(); columns.len()];
    if values == Values::Skip {
        for p in puts {
            found[p.range].insert(p.row, Some((p.commit_ts, Bytes::new())));
        }
        return Ok(found);
    }
    if puts.is_empty() {
        return Ok(found);
    }
    // Each range's data column, made once rather than once a row.
    let data: Vec<_> = columns.iter().map(|c| data_col(&Bytes::copy_from_slice(c))).collect();
    let reads: Vec<RowRead> = puts
        .iter()
        .map(|p| RowRead {
            row: p.row.clone(),
            reads: vec![ColumnRead::newest(data[p.range].clone(), TsRange::at(p.start_ts))],
        })
        .collect();
    for (p, mut got) in puts.into_iter().zip(store.read_rows(&reads).await?) {
        let cell = got.remove(0).pop().ok_or_else(|| {
            TxnError::Corrupt(format!(
                "{}/{}: no data at {} for its write record",
                error::show(&p.row),
                error::show(&data[p.range].qualifier),
                p.start_ts
            ))
        })?;
        found[p.range].insert(p.row, Some((p.commit_ts, cell.value)));
    }
    Ok(found)
}
