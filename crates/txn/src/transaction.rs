//! A transaction's reads: a snapshot at its start_ts, read in batches and cached, waiting on
//! or resolving the locks it meets; and its buffered writes and weak notifications, which
//! [`crate::commit`] turns into the two-phase commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use bytes::Bytes;
use perc_store::{ColumnRead, RowMutation, RowRead, Ts, TsRange};

use crate::actions::{self, data_col, lock_col, write_col};
use crate::{error, Client, LockRecord, Resolution, TxnError, WriteKind, WriteRecord};

/// The default most `lock` and `write` records of a range that one store call of a scan
/// reads ([`crate::TxnConfig::scan_piece_cells`]): as scan cells of a few hundred bytes, some
/// tens of MiB at most.
pub const SCAN_PIECE_CELLS: usize = 65_536;

/// The probe columns of a conditional notification ([`Transaction::notify_if_written`]).
pub type Probes = &'static [&'static [u8]];

/// One transaction: reads see the snapshot at `start_ts`; writes are buffered until commit.
pub struct Transaction {
    pub(crate) client: Client,
    pub(crate) start_ts: Ts,
    pub(crate) writes: BTreeMap<(Bytes, Bytes), Option<Bytes>>,
    /// Buffered writes whose conflicts another written cell detects (see [`Self::set_unchecked`]).
    pub(crate) unchecked: BTreeSet<(Bytes, Bytes)>,
    /// Weak notifications to set at commit.
    pub(crate) weak: BTreeSet<(Bytes, Bytes)>,
    /// Weak notifications to set at commit if their row's probe columns were ever written
    /// (see [`Self::notify_if_written`]).
    pub(crate) weak_if: BTreeMap<(Bytes, Bytes), Probes>,
    /// Bookkeeping outside the transaction, applied once it has committed (see
    /// [`Self::after_commit`]).
    pub(crate) after_commit: Vec<RowMutation>,
    /// Cells deleted at commit without a lock (see [`Self::delete_at_commit`]).
    pub(crate) deletes_at_commit: Vec<(Bytes, Bytes)>,
    /// Rows for the prompt collection once this commits (see [`Self::collect_soon`]).
    pub(crate) collect_soon: Vec<Bytes>,
    /// Snapshot reads already resolved. A snapshot never changes once its locks are
    /// resolved, so each cell is read from the store at most once per transaction.
    pub(crate) reads: Mutex<HashMap<(Bytes, Bytes), Option<Version>>>,
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
        self.buffer((row.into(), column.into()), Some(value.into()), false);
    }

    /// Asks the prompt collection (see [`crate::gc::collect_deleted`]) to clean the older
    /// versions of `row`, which this transaction rewrites, as soon as no reader can see them,
    /// once it has committed: for a row rewritten many times a second, whose old versions
    /// would otherwise be bytes each rewrite writes again, until the next pass over the store.
    pub fn collect_soon(&mut self, row: impl Into<Bytes>) {
        self.collect_soon.push(row.into());
    }

    /// Buffers a delete of `(row, column)`.
    pub fn delete(&mut self, row: impl Into<Bytes>, column: impl Into<Bytes>) {
        self.buffer((row.into(), column.into()), None, false);
    }

    /// Buffers a write of `(row, column)` that needs no conflict check of its own, because
    /// every transaction that writes this cell also writes, checked, a cell they all share
    /// (the page row whose links an edge row mirrors), or because its row key is unique to
    /// this transaction. Conflicts are then found at that shared cell, and the cell's
    /// prewrite (lock and data, as for any write) goes into one batched call with every other
    /// unchecked row's, instead of one conditional mutation per row. A cell with an
    /// independent second writer must use [`Self::set`]: a lost update otherwise.
    pub fn set_unchecked(
        &mut self,
        row: impl Into<Bytes>,
        column: impl Into<Bytes>,
        value: impl Into<Bytes>,
    ) {
        self.buffer((row.into(), column.into()), Some(value.into()), true);
    }

    /// [`Self::delete`], unchecked as [`Self::set_unchecked`] says.
    pub fn delete_unchecked(&mut self, row: impl Into<Bytes>, column: impl Into<Bytes>) {
        self.buffer((row.into(), column.into()), None, true);
    }

    /// Buffers a write; a cell written checked once stays checked.
    fn buffer(&mut self, key: (Bytes, Bytes), value: Option<Bytes>, unchecked: bool) {
        if !unchecked {
            self.unchecked.remove(&key);
        } else if !self.writes.contains_key(&key) {
            self.unchecked.insert(key.clone());
        }
        self.writes.insert(key, value);
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

    /// Whether the transaction has nothing to commit: no write and no notification buffered.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.weak.is_empty() && self.weak_if.is_empty()
    }

    /// What committing would write, in key order: each buffered cell, `None` for a delete,
    /// and whether it is unchecked ([`Self::set_unchecked`]). For tests and diagnostics that
    /// look at what a stage decided before it is committed.
    pub fn buffered_writes(&self) -> Vec<(Bytes, Bytes, Option<Bytes>, bool)> {
        self.writes
            .iter()
            .map(|((row, column), value)| {
                let unchecked = self.unchecked.contains(&(row.clone(), column.clone()));
                (row.clone(), column.clone(), value.clone(), unchecked)
            })
            .collect()
    }

    /// The weak notifications buffered, in key order, each with whether it is conditional
    /// ([`Self::notify_if_written`]). (Strong ones follow from the writes.)
    pub fn buffered_notifications(&self) -> Vec<(Bytes, Bytes, bool)> {
        let mut out: Vec<(Bytes, Bytes, bool)> =
            self.weak.iter().map(|(r, c)| (r.clone(), c.clone(), false)).collect();
        out.extend(self.weak_if.keys().map(|(r, c)| (r.clone(), c.clone(), true)));
        out.sort();
        out
    }

    /// Whether committing sets a notification: a weak one is buffered (set or not, for a
    /// conditional one), or a write goes to a column an observer watches.
    pub fn notifies(&self) -> bool {
        !self.weak.is_empty()
            || !self.weak_if.is_empty()
            || self.writes.keys().any(|(_, column)| self.client.inner.watch.watches(column))
    }

    /// An unconditional mutation outside the transaction, applied only if it commits, after
    /// the commit point, in the batched call that commits the secondaries (no call of its
    /// own). For bookkeeping whose loss in a crash is harmless, such as clearing the
    /// notification the transaction's run answered: not for data, which a reader must see
    /// atomically with the transaction's writes.
    pub fn after_commit(&mut self, mutation: RowMutation) {
        self.after_commit.push(mutation);
    }

    /// Deletes `(row, column)` at this transaction's commit without taking a lock on it:
    /// its delete record is written after the commit point, with the secondaries, and a
    /// crash there loses it. For a queue whose one consumer keeps, in a cell this
    /// transaction writes, its own mark of what it took (the rows committed before some
    /// timestamp, found with [`Self::scan_each_found`]): a row taken is dead by that mark
    /// from the commit on, so its delete needs no prewrite, and a lost one leaves a row the
    /// mark still says was taken. The committed record is what a delete's commit writes, so
    /// a late roll-forward of the row's writer stays under it and the collection removes
    /// the row as any deleted one. Dropped if the transaction writes nothing (it then has
    /// no commit).
    pub fn delete_at_commit(&mut self, row: Bytes, column: &[u8]) {
        self.deletes_at_commit.push((row, Bytes::copy_from_slice(column)));
    }

    /// The cells buffered for [`Self::delete_at_commit`], in the order given. For tests and
    /// diagnostics.
    pub fn buffered_deletes_at_commit(&self) -> &[(Bytes, Bytes)] {
        &self.deletes_at_commit
    }

    /// Buffers a weak notification of `(row, column)`: set at commit without a write, so
    /// it conflicts with nothing (for hot rows, such as counters with many writers).
    pub fn notify(&mut self, row: impl Into<Bytes>, column: impl Into<Bytes>) {
        self.weak.insert((row.into(), column.into()));
    }

    /// Buffers a weak notification of `(row, column)` that is set only if one of the
    /// `probes` columns of `row` has a committed write or a lock, at any timestamp, when
    /// this transaction commits (one batched read, after its commit timestamp is drawn and
    /// before its notifications are set).
    ///
    /// For an observer that does nothing on a row whose probes were never written, and
    /// whose run is notified by every transaction that first writes one. Then nothing is
    /// lost: a transaction that writes a probe either has its lock or write there when this
    /// one looks (the notification is set), or draws its commit timestamp after this one's,
    /// and the run its notification causes starts later still, so it reads this one's writes.
    pub fn notify_if_written(
        &mut self,
        row: impl Into<Bytes>,
        column: impl Into<Bytes>,
        probes: Probes,
    ) {
        self.weak_if.insert((row.into(), column.into()), probes);
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
}

pub(crate) fn is_rollback(raw: &Bytes) -> bool {
    matches!(WriteRecord::decode(raw), Ok(WriteRecord { kind: WriteKind::Rollback, .. }))
}
