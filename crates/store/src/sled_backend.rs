//! The embedded, durable backend on sled 0.34.
//!
//! Layout (one sled database, several trees):
//!
//! ```text
//!   tree "rows"         row key            -> RowCells record: every cell of the row's
//!                                             Row-locality families (see row.rs)
//!   tree "values"       blake3(value)      -> where the value log holds it (values/)
//!   tree "blobs"        blob id (u64 BE)   -> a large value, in stores made before the value log
//!   tree "own/<fam>"    enc(row) enc(q) !ts -> value, for a family in its own locality group
//!   values/*.seg                           -> the value log's segments (values/mod.rs)
//! ```
//!
//! Why this shape: sled's fast atomic primitive is a single-key `compare_and_swap`; its
//! multi-key `transaction` and `apply_batch` are several times slower and leave a flush
//! backlog (measured; see docs/architecture.md). So a row's atomic unit is one
//! sled value, and `check_and_mutate` is get + decode + check + apply + CAS, retried if another
//! writer changed the row in between. Large values go to the value log first, named by their
//! content: a row refers to a value by its name, and a value no row refers to (a failed
//! condition's, a replaced version's, one a crash wrote before its row) is dropped by the
//! value log's cleaner. Stores made before the value log hold large values in the `blobs`
//! tree; those still read, and go when their rows are rewritten or compacted.
//!
//! Durability: sled writes to in-memory log buffers; [`Store::sync`] flushes them, making every
//! earlier write durable, and concurrent `sync` calls share one flush (group commit). What was
//! not flushed is not recovered in order: sled's buffers are written by several threads, and
//! after a crash a later write may survive an earlier one. A write that must not outlive
//! another (a commit record and its primary's, a notification's clear and the run it
//! answered) is made after a flush. A flush first fsyncs the value log's active segment, so a
//! flushed row never names a frame a power loss could take.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::row::{self, RowCells, Stored};
use crate::sled_compact::Compacted;
use crate::sled_open::{io, open_db, sled_config, stored_conf, SledOptions};
use crate::values::{Cleaned, Pin, Values};
use crate::{
    keycode, validate, validate_check_and_mutate, validate_row_mutation, Cell, ColumnRead,
    Condition, Locality, Mutation, Result, RowMutation, Scan, ScanCell, Schema, Store, StoreError,
};

/// The tree of the row records, and the tree of the values kept out of them.
pub(crate) const ROWS: &str = "rows";
pub(crate) const BLOBS: &str = "blobs";

/// Values longer than this are kept out of the row record, as blobs.
const INLINE_BYTES_MAX: usize = 256;
/// How often a reader retries a row whose blob vanished under it (a concurrent delete).
const BLOB_RETRIES: usize = 8;

/// What [`SledStore::usage`] found.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub disk_bytes: u64,
    pub trees: Vec<TreeUsage>,
    /// By `family/group` of the rows tree.
    pub columns: BTreeMap<String, ColumnUsage>,
    /// The rows tree's keys by kind of row (the key's first byte: perc's row keys begin with
    /// a letter and a colon): sled keeps a record of every node, 16 keys at most, in memory.
    pub rows_by_kind: BTreeMap<u8, u64>,
}

impl Usage {
    /// Bytes of keys and values held now, in every tree: what `disk_bytes` would be without
    /// sled's log-structured space amplification.
    pub fn live_bytes(&self) -> u64 {
        self.trees.iter().map(|t| t.key_bytes + t.value_bytes).sum()
    }
}

#[derive(Clone, Debug, Default)]
pub struct TreeUsage {
    pub name: String,
    pub keys: u64,
    pub key_bytes: u64,
    pub value_bytes: u64,
}

#[derive(Clone, Debug, Default)]
pub struct ColumnUsage {
    pub versions: u64,
    pub inline_bytes: u64,
    pub blob_bytes: u64,
}

pub struct SledStore {
    schema: Schema,
    db: sled::Db,
    rows: sled::Tree,
    blobs: sled::Tree,
    own: BTreeMap<&'static str, sled::Tree>,
    values: Arc<Values>,
    group: GroupCommit,
    written: Written,
}

/// What the store gave sled to write into the rows tree, by kind of row (a key's first byte:
/// perc's row keys begin with a letter and a colon): row writes, and the bytes of their keys
/// and records. sled's log holds each record it was given until its cleaner drops it, so
/// this is what the log's volume is made of. For measurements (`perc-bench datapath`).
struct Written {
    by_kind: Vec<(AtomicU64, AtomicU64)>,
}

impl Default for Written {
    fn default() -> Self {
        Written { by_kind: (0..256).map(|_| (AtomicU64::new(0), AtomicU64::new(0))).collect() }
    }
}

impl Written {
    fn add(&self, row: &[u8], bytes: usize) {
        let (writes, total) = &self.by_kind[usize::from(row.first().copied().unwrap_or(0))];
        writes.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

impl SledStore {
    /// Whether directory `path` holds a store: sled's `conf` file is the first it writes, and a
    /// compaction cut short while the files change places leaves its mark.
    pub fn exists(path: impl AsRef<Path>) -> bool {
        path.as_ref().join("conf").exists() || crate::sled_compact::finishing(path.as_ref())
    }

    /// Compacts the store in directory `path`, which must not be open: its live data copied
    /// into a new database that takes the old one's place (see `sled_compact`). `None`: `stop`
    /// said so during the copy, and the store is as it was.
    pub fn compact(
        path: impl AsRef<Path>,
        options: &SledOptions,
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<Compacted>> {
        crate::sled_compact::compact(path.as_ref(), options, stop)
    }

    /// Opens (or creates) the store in directory `path`.
    pub fn open(path: impl AsRef<Path>, schema: Schema, options: &SledOptions) -> Result<Self> {
        let path = path.as_ref();
        crate::sled_compact::recover(path)?;
        crate::sled_open::forget_unfinished_creation(path)?;
        let db = open_db(path, &sled_config(path, &stored_conf(path), options))?;
        let rows = db.open_tree(ROWS).map_err(io)?;
        let blobs = db.open_tree(BLOBS).map_err(io)?;
        let mut own = BTreeMap::new();
        for f in schema.families().iter().filter(|f| f.locality == Locality::Own) {
            own.insert(f.name, db.open_tree(format!("own/{}", f.name)).map_err(io)?);
        }
        let values = Arc::new(Values::open(path, &db, options.value_segment_bytes)?);
        Ok(SledStore {
            schema,
            db,
            rows,
            blobs,
            own,
            values,
            group: GroupCommit::default(),
            written: Written::default(),
        })
    }

    /// Bytes on disk: sled's, as it reports them, and the value log's segments.
    pub fn size_on_disk(&self) -> Result<u64> {
        Ok(self.db.size_on_disk().map_err(io)? + self.values.disk_bytes()?)
    }

    /// The row writes given to sled since the store opened, by the first byte of the row's
    /// key: (that byte, writes, bytes of keys and records), the kinds written to only.
    pub fn written(&self) -> Vec<(u8, u64, u64)> {
        let kinds = self.written.by_kind.iter().enumerate();
        kinds
            .map(|(b, (w, n))| (b as u8, w.load(Ordering::Relaxed), n.load(Ordering::Relaxed)))
            .filter(|(_, w, _)| *w > 0)
            .collect()
    }

    /// Runs a pass of the value log's cleaner now (`Store::maintain` runs one when due).
    pub fn clean_values(&self) -> Result<Cleaned> {
        self.values.clean(&|found| self.value_names(found))
    }

    /// Every name of a value some row record refers to (see `Values::clean`).
    fn value_names(&self, found: &mut dyn FnMut(&crate::values::Hash)) -> Result<()> {
        for kv in self.rows.iter() {
            let (_, raw) = kv.map_err(io)?;
            row::value_names(&raw, found)?;
        }
        Ok(())
    }

    /// Where the bytes are: per sled tree, its keys and their key and value bytes; per
    /// column group of the rows tree (a row-locality family and its qualifier up to the first
    /// `:`, e.g. `data/crawl`), its versions and the bytes of their values, inline or in
    /// blobs. A full scan: for measurements, not for serving.
    pub fn usage(&self) -> Result<Usage> {
        let mut u = Usage::default();
        let named = [(ROWS.to_string(), &self.rows), (BLOBS.to_string(), &self.blobs)];
        let own = self.own.iter().map(|(f, t)| (format!("own/{f}"), t));
        for (name, tree) in named.into_iter().chain(own) {
            let mut t = TreeUsage { name, ..TreeUsage::default() };
            for kv in tree.iter() {
                let (k, v) = kv.map_err(io)?;
                t.keys += 1;
                t.key_bytes += k.len() as u64;
                t.value_bytes += v.len() as u64;
                if t.name == ROWS {
                    *u.rows_by_kind.entry(k.first().copied().unwrap_or(0)).or_default() += 1;
                    for (family, qualifier, versions) in self.decode_row(Some(&v))?.columns() {
                        let group = qualifier.split(|b| *b == b':').next().unwrap_or(qualifier);
                        let key = format!("{family}/{}", String::from_utf8_lossy(group));
                        let c = u.columns.entry(key).or_default();
                        for (_, stored) in versions {
                            c.versions += 1;
                            match stored {
                                Stored::Inline(b) => c.inline_bytes += b.len() as u64,
                                Stored::Blob { len, .. } | Stored::Value { len, .. } => {
                                    c.blob_bytes += len
                                }
                            }
                        }
                    }
                }
            }
            u.trees.push(t);
        }
        u.trees.push(self.values.usage()?);
        u.disk_bytes = self.size_on_disk()?;
        Ok(u)
    }

    fn decode_row(&self, raw: Option<&[u8]>) -> Result<RowCells<Stored>> {
        match raw {
            None => Ok(RowCells::default()),
            Some(raw) => row::decode(&self.schema, raw),
        }
    }

    fn own_tree(&self, family: &str) -> &sled::Tree {
        // validate() has checked the family against the schema, and open() made a tree for
        // every Own family in it.
        &self.own[family]
    }

    /// Turns a value into its stored form, putting it in the value log if it is large.
    /// `pin` is held for a write with a large value (`mutate_row`).
    fn store_value(&self, pin: Option<&Pin<'_>>, value: &Bytes) -> Result<Stored> {
        if value.len() <= INLINE_BYTES_MAX {
            return Ok(Stored::Inline(value.clone()));
        }
        let hash = self.values.put(pin.expect("a write of a large value holds a pin"), value)?;
        Ok(Stored::Value { hash, len: value.len() as u64 })
    }

    /// Lets go of stored values no longer referred to: a legacy blob is removed, a value
    /// log reference counted toward the cleaner's next pass.
    fn drop_values(&self, values: impl IntoIterator<Item = Stored>) -> Result<()> {
        for v in values {
            match v {
                Stored::Inline(_) => {}
                Stored::Blob { id, .. } => {
                    self.blobs.remove(id.to_be_bytes()).map_err(io)?;
                }
                Stored::Value { len, .. } => self.values.dropped(len),
            }
        }
        Ok(())
    }

    /// The bytes of a stored value; `None` if its blob is gone (deleted concurrently).
    fn load(&self, v: &Stored) -> Result<Option<Bytes>> {
        match v {
            Stored::Inline(b) => Ok(Some(b.clone())),
            Stored::Blob { id, .. } => {
                Ok(self.blobs.get(id.to_be_bytes()).map_err(io)?.map(|iv| Bytes::from(iv.to_vec())))
            }
            Stored::Value { hash, .. } => self.values.get(hash),
        }
    }

    /// The read-modify-CAS loop behind every row mutation. `conditions` empty: unconditional.
    fn mutate_row(
        &self,
        row: &[u8],
        conditions: &[Condition],
        mutations: &[Mutation],
    ) -> Result<bool> {
        // A row gains a reference into the value log only by a put of a large value: such a
        // write holds the cleaner off until the row is written (values/); the others keep or
        // drop references the row has, which a pass sees in the row before or after.
        let large = |m: &Mutation| matches!(m, Mutation::Put { value, .. } if value.len() > INLINE_BYTES_MAX);
        let pin = mutations.iter().any(large).then(|| self.values.pin());
        let mut prepared = Vec::with_capacity(mutations.len());
        for m in mutations {
            prepared.push(match m {
                Mutation::Put { column, ts, value } => {
                    (m, Some((column, *ts, self.store_value(pin.as_ref(), value)?)))
                }
                Mutation::Delete { .. } => (m, None),
            });
        }
        loop {
            let current = self.rows.get(row).map_err(io)?;
            let mut cells = self.decode_row(current.as_deref())?;
            if !conditions.iter().all(|c| cells.holds(c)) {
                self.drop_values(prepared.into_iter().filter_map(|(_, put)| Some(put?.2)))?;
                return Ok(false);
            }
            let mut replaced = Vec::new();
            for (m, put) in &prepared {
                match (m, put) {
                    (_, Some((column, ts, stored))) => {
                        replaced.extend(cells.put(column, *ts, stored.clone()));
                    }
                    (Mutation::Delete { column, range }, None) => {
                        replaced.extend(cells.delete(column, *range));
                    }
                    (Mutation::Put { .. }, None) => unreachable!("puts are prepared above"),
                }
            }
            let next = if cells.is_empty() { None } else { Some(row::encode(&cells)) };
            let written = row.len() + next.as_ref().map_or(0, Vec::len);
            match self.rows.compare_and_swap(row, current, next).map_err(io)? {
                Ok(()) => {
                    self.written.add(row, written);
                    drop(pin);
                    self.drop_values(replaced)?;
                    return Ok(true);
                }
                // Another writer changed the row between our get and CAS: decide again.
                Err(_) => continue,
            }
        }
    }

    fn read_own(&self, row: &[u8], read: &ColumnRead) -> Result<Vec<Cell>> {
        let tree = self.own_tree(read.column.family);
        let lo = keycode::cell_key(row, &read.column.qualifier, read.range.max);
        let hi = keycode::cell_key(row, &read.column.qualifier, read.range.min);
        let mut out = Vec::new();
        for kv in tree.range(lo..=hi).take(read.versions as usize) {
            let (k, v) = kv.map_err(io)?;
            let ts = keycode::decode_ts_desc(&k[k.len() - 8..]).ok_or_else(|| {
                StoreError::Corrupt { backend: "sled", detail: "cell key too short".into() }
            })?;
            out.push(Cell { ts, value: Bytes::from(v.to_vec()) });
        }
        Ok(out)
    }

    fn read_row_sync(&self, row: &[u8], reads: &[ColumnRead]) -> Result<Vec<Vec<Cell>>> {
        validate(
            &self.schema,
            row,
            reads.iter().map(|r| (r.column.family, r.column.qualifier.len())),
            [],
            false,
        )?;
        // Only the columns read are decoded, not the row's others.
        let asked = |family: &str, qualifier: &[u8]| {
            reads.iter().any(|r| r.column.family == family && r.column.qualifier == qualifier)
        };
        'retry: for _ in 0..BLOB_RETRIES {
            let raw = self.rows.get(row).map_err(io)?;
            let cells = match raw {
                Some(raw) => row::decode_only(&self.schema, &raw, &asked)?,
                None => RowCells::default(),
            };
            let mut out = Vec::with_capacity(reads.len());
            for read in reads {
                let got = match self.schema.locality(read.column.family)? {
                    Locality::Own => self.read_own(row, read)?,
                    Locality::Row => {
                        let mut got = Vec::new();
                        for (ts, v) in cells.read(read) {
                            match self.load(&v)? {
                                Some(value) => got.push(Cell { ts, value }),
                                None => continue 'retry,
                            }
                        }
                        got
                    }
                };
                out.push(got);
            }
            return Ok(out);
        }
        Err(StoreError::Corrupt {
            backend: "sled",
            detail: format!(
                "row {:?} references a blob that does not exist",
                Bytes::copy_from_slice(row)
            ),
        })
    }

    fn mutate_own(&self, row: &[u8], m: &Mutation) -> Result<()> {
        let tree = self.own_tree(m.column().family);
        match m {
            Mutation::Put { column, ts, value } => {
                tree.insert(keycode::cell_key(row, &column.qualifier, *ts), value.as_ref())
                    .map_err(io)?;
            }
            Mutation::Delete { column, range } => {
                let lo = keycode::cell_key(row, &column.qualifier, range.max);
                let hi = keycode::cell_key(row, &column.qualifier, range.min);
                for kv in tree.range(lo..=hi) {
                    let (k, _) = kv.map_err(io)?;
                    tree.remove(k).map_err(io)?;
                }
            }
        }
        Ok(())
    }

    fn scan_sync(&self, scan: &Scan) -> Result<Vec<ScanCell>> {
        match self.schema.locality(scan.family)? {
            Locality::Row => Ok(self.scan_row_families(&[scan])?.pop().unwrap_or_default()),
            Locality::Own => {
                let mut out = Vec::new();
                let tree = self.own_tree(scan.family);
                let mut lo = Vec::new();
                keycode::encode_bytes(&mut lo, &scan.start);
                let end = if scan.end.is_empty() {
                    Bound::Unbounded
                } else {
                    let mut hi = Vec::new();
                    keycode::encode_bytes(&mut hi, &scan.end);
                    Bound::Excluded(hi)
                };
                for kv in tree.range((Bound::Included(lo), end)).take(scan.limit) {
                    let (k, v) = kv.map_err(io)?;
                    let (row, qualifier, ts) =
                        keycode::decode_cell_key(&k).ok_or_else(|| StoreError::Corrupt {
                            backend: "sled",
                            detail: format!("undecodable key in family {}", scan.family),
                        })?;
                    out.push(ScanCell {
                        row: row.into(),
                        qualifier: qualifier.into(),
                        ts,
                        value: Bytes::from(v.to_vec()),
                    });
                }
                Ok(out)
            }
        }
    }

    /// Several scans in one pass per range of row families: the row-family scans of one
    /// range share a walk over its rows, each row decoded once (a transaction's scan reads
    /// the `lock` and `write` families of its range so; `perc status` the locks and leases
    /// of the whole table). Own families' scans read their own trees.
    fn scan_many_sync(&self, scans: &[Scan]) -> Result<Vec<Vec<ScanCell>>> {
        let in_rows: Vec<bool> = scans
            .iter()
            .map(|s| Ok(self.schema.locality(s.family)? == Locality::Row))
            .collect::<Result<_>>()?;
        let mut out: Vec<Option<Vec<ScanCell>>> = vec![None; scans.len()];
        for i in 0..scans.len() {
            if out[i].is_some() {
                continue;
            }
            if !in_rows[i] {
                out[i] = Some(self.scan_sync(&scans[i])?);
                continue;
            }
            let (start, end) = (&scans[i].start, &scans[i].end);
            let group: Vec<usize> = (i..scans.len())
                .filter(|&j| {
                    out[j].is_none()
                        && in_rows[j]
                        && scans[j].start == *start
                        && scans[j].end == *end
                })
                .collect();
            let shared: Vec<&Scan> = group.iter().map(|&j| &scans[j]).collect();
            for (j, cells) in group.into_iter().zip(self.scan_row_families(&shared)?) {
                out[j] = Some(cells);
            }
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// Row-family scans that share one range (the first's), in one walk over its rows: each
    /// scan gets the cells of its family, up to its limit, as a scan of its own would.
    fn scan_row_families(&self, scans: &[&Scan]) -> Result<Vec<Vec<ScanCell>>> {
        let mut out: Vec<Vec<ScanCell>> = vec![Vec::new(); scans.len()];
        let Some(first) = scans.first() else { return Ok(out) };
        let full = |out: &[Vec<ScanCell>]| scans.iter().zip(out).all(|(s, f)| f.len() >= s.limit);
        // The walk ends with the row at which one scan has its limit (see `Store::scan_many`).
        let one_full = |out: &[Vec<ScanCell>]| {
            scans.iter().zip(out).any(|(s, f)| s.limit > 0 && f.len() >= s.limit)
        };
        // Only the scanned families are decoded (a scan of `lock` skips the pages' records).
        let scanned = |family: &str, _: &[u8]| scans.iter().any(|s| s.family == family);
        if full(&out) {
            return Ok(out);
        }
        let end = if first.end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(first.end.as_ref())
        };
        for kv in self.rows.range::<&[u8], _>((Bound::Included(first.start.as_ref()), end)) {
            let (row, raw) = kv.map_err(io)?;
            let cells = row::decode_only(&self.schema, &raw, &scanned)?;
            let row = Bytes::from(row.to_vec());
            for (scan, found) in scans.iter().zip(out.iter_mut()) {
                for (q, ts, v) in cells.family_cells(scan.family) {
                    if found.len() >= scan.limit {
                        break;
                    }
                    // A blob deleted since we read the row is a cell deleted since the scan
                    // began; a scan is not a snapshot, so skipping it is correct.
                    if let Some(value) = self.load(v)? {
                        found.push(ScanCell { row: row.clone(), qualifier: q.clone(), ts, value });
                    }
                }
            }
            if one_full(&out) {
                break;
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Store for SledStore {
    fn schema(&self) -> &Schema {
        &self.schema
    }

    async fn read_row(&self, row: &[u8], reads: &[ColumnRead]) -> Result<Vec<Vec<Cell>>> {
        self.read_row_sync(row, reads)
    }

    async fn check_and_mutate(
        &self,
        row: &[u8],
        conditions: &[Condition],
        mutations: &[Mutation],
    ) -> Result<bool> {
        validate_check_and_mutate(&self.schema, row, conditions, mutations)?;
        self.mutate_row(row, conditions, mutations)
    }

    async fn mutate_rows(&self, rows: &[RowMutation]) -> Result<()> {
        for rm in rows {
            validate_row_mutation(&self.schema, rm)?;
        }
        for rm in rows {
            let mut in_row = Vec::new();
            for m in &rm.mutations {
                match self.schema.locality(m.column().family)? {
                    Locality::Row => in_row.push(m.clone()),
                    Locality::Own => self.mutate_own(&rm.row, m)?,
                }
            }
            if !in_row.is_empty() {
                self.mutate_row(&rm.row, &[], &in_row)?;
            }
        }
        Ok(())
    }

    async fn scan(&self, scan: &Scan) -> Result<Vec<ScanCell>> {
        self.scan_sync(scan)
    }

    async fn scan_many(&self, scans: &[Scan]) -> Result<Vec<Vec<ScanCell>>> {
        self.scan_many_sync(scans)
    }

    async fn sync(&self) -> Result<()> {
        self.group.sync(&self.db, &self.values).await
    }

    async fn maintain(&self) -> Result<()> {
        self.values.maintain(&|found| self.value_names(found))?;
        Ok(())
    }
}

/// Group commit: a flush that starts after a caller's request covers that caller's writes,
/// so callers that queue behind a running flush are served by the next one together.
#[derive(Default)]
struct GroupCommit {
    requested: AtomicU64,
    completed: AtomicU64,
    flushing: tokio::sync::Mutex<()>,
}

impl GroupCommit {
    async fn sync(&self, db: &sled::Db, values: &Arc<Values>) -> Result<()> {
        let mine = self.requested.fetch_add(1, Ordering::SeqCst) + 1;
        let _turn = self.flushing.lock().await;
        if self.completed.load(Ordering::SeqCst) >= mine {
            return Ok(());
        }
        // Every request numbered up to `covers` was made before this flush starts.
        let covers = self.requested.load(Ordering::SeqCst);
        let values = values.clone();
        if values.unsynced() {
            tokio::task::spawn_blocking(move || values.sync()).await.map_err(|e| {
                StoreError::Io {
                    backend: "sled",
                    detail: format!("the value log's sync did not finish: {e}"),
                }
            })??;
        }
        db.flush_async().await.map_err(io)?;
        self.completed.fetch_max(covers, Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for SledStore {
    fn drop(&mut self) {
        // Best effort on a clean shutdown; acknowledged commits were already synced.
        if self.values.sync().is_ok() {
            let _ = self.db.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sled_open::{compressed, segment_bytes, SEGMENT_BYTES};
    use crate::{Column, FamilySpec, Ts};

    #[tokio::test]
    async fn large_values_live_out_of_line_and_are_reclaimed() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Schema::new([FamilySpec { name: "f", locality: Locality::Row }]);
        let store = SledStore::open(dir.path(), schema, &SledOptions::default()).unwrap();
        let col = Column::new("f", "body");
        let big = Bytes::from(vec![7u8; 100_000]);
        let put = |ts: u64, v: Bytes| Mutation::Put { column: col.clone(), ts: Ts(ts), value: v };
        let entries = |s: &SledStore| s.values.usage().unwrap().keys;
        assert!(store.check_and_mutate(b"r", &[], &[put(1, big.clone())]).await.unwrap());
        assert_eq!(entries(&store), 1);
        assert!(store.rows.get(b"r").unwrap().unwrap().len() < 100, "the row holds a name");
        // A failed condition's value is dropped by the next pass.
        let never = Condition::CellAt { column: col.clone(), ts: Ts(99) };
        let other = Bytes::from(vec![8u8; 100_000]);
        assert!(!store.check_and_mutate(b"r", &[never], &[put(2, other)]).await.unwrap());
        assert_eq!(entries(&store), 2);
        assert_eq!(store.clean_values().unwrap().dropped, 1);
        assert_eq!(entries(&store), 1);
        let got = store
            .read_row(b"r", &[ColumnRead::newest(col.clone(), crate::TsRange::ALL)])
            .await
            .unwrap();
        assert_eq!(got[0][0].value, big);
        let del = Mutation::Delete { column: col.clone(), range: crate::TsRange::ALL };
        assert!(store.check_and_mutate(b"r", &[], &[del]).await.unwrap());
        assert_eq!(store.rows.len(), 0);
        assert_eq!(store.clean_values().unwrap().dropped, 1);
        assert_eq!(entries(&store), 0);
    }

    #[test]
    fn a_store_in_use_is_refused_and_a_closed_one_reopens_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let schema = || Schema::new([FamilySpec { name: "f", locality: Locality::Row }]);
        let first = SledStore::open(dir.path(), schema(), &SledOptions::default()).unwrap();
        let Err(e) = SledStore::open(dir.path(), schema(), &SledOptions::default()) else {
            panic!("a second handle on a store in use");
        };
        assert!(e.to_string().contains("holds it"), "{e}");
        drop(first);
        // Dropped and reopened in a loop: the flusher of the last handle may still hold the
        // lock for a moment, which opening waits out.
        for _ in 0..20 {
            drop(SledStore::open(dir.path(), schema(), &SledOptions::default()).unwrap());
        }
    }

    #[test]
    fn new_stores_get_large_segments_and_old_stores_keep_theirs() {
        let schema = || Schema::new([FamilySpec { name: "f", locality: Locality::Row }]);
        let new = tempfile::tempdir().unwrap();
        drop(SledStore::open(new.path(), schema(), &SledOptions::default()).unwrap());
        assert_eq!(segment_bytes(&stored_conf(new.path())), SEGMENT_BYTES);
        // A store made with sled's default segment size (as every store was before) opens,
        // with what it holds.
        let old = tempfile::tempdir().unwrap();
        {
            let db = sled::Config::new().path(old.path()).segment_size(512 * 1024).open().unwrap();
            db.open_tree("rows").unwrap().insert(b"k", b"v".to_vec()).unwrap();
            db.flush().unwrap();
        }
        assert_eq!(segment_bytes(&stored_conf(old.path())), 512 * 1024);
        assert!(!compressed(&stored_conf(old.path()), 1), "an uncompressed store stays so");
        let store = SledStore::open(old.path(), schema(), &SledOptions::default()).unwrap();
        assert_eq!(store.rows.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    }

    #[tokio::test]
    async fn a_store_whose_making_a_kill_cut_short_is_made_again() {
        let schema = || Schema::new([FamilySpec { name: "f", locality: Locality::Row }]);
        let made = tempfile::tempdir().unwrap();
        drop(SledStore::open(made.path(), schema(), &SledOptions::default()).unwrap());
        // What a kill in sled's first milliseconds leaves: its conf, and no log yet.
        let cut = tempfile::tempdir().unwrap();
        std::fs::copy(made.path().join("conf"), cut.path().join("conf")).unwrap();
        std::fs::create_dir(cut.path().join("blobs")).unwrap();
        assert!(sled::Config::new().path(cut.path()).open().is_err(), "sled refuses it");
        let col = Column::new("f", "q");
        {
            let store = SledStore::open(cut.path(), schema(), &SledOptions::default()).unwrap();
            let put = Mutation::Put { column: col.clone(), ts: Ts(1), value: Bytes::from("v") };
            store
                .mutate_rows(&[RowMutation { row: "r".into(), mutations: vec![put] }])
                .await
                .unwrap();
            store.sync().await.unwrap();
        }
        let store = SledStore::open(cut.path(), schema(), &SledOptions::default()).unwrap();
        let got =
            store.read_row(b"r", &[ColumnRead::newest(col, crate::TsRange::ALL)]).await.unwrap();
        assert_eq!(got[0][0].value, Bytes::from("v"), "made again, and kept what it was given");
    }

    #[tokio::test]
    async fn whether_a_store_compresses_is_fixed_when_it_is_made() {
        let schema = || Schema::new([FamilySpec { name: "f", locality: Locality::Row }]);
        let level = |zstd_level| SledOptions { zstd_level, ..SledOptions::default() };
        let col = Column::new("f", "q");
        let value = Bytes::from("perc compresses its log ".repeat(400));
        for (made, reopened) in [(0, 3), (1, 0), (3, 1)] {
            let dir = tempfile::tempdir().unwrap();
            {
                let store = SledStore::open(dir.path(), schema(), &level(made)).unwrap();
                let put = Mutation::Put { column: col.clone(), ts: Ts(1), value: value.clone() };
                assert!(store.check_and_mutate(b"r", &[], &[put]).await.unwrap());
                store.sync().await.unwrap();
            }
            assert_eq!(compressed(&stored_conf(dir.path()), reopened), made > 0, "made at {made}");
            // Reopened at another level (or none), it opens as it was made, and reads back.
            let store = SledStore::open(dir.path(), schema(), &level(reopened)).unwrap();
            let read = ColumnRead::newest(col.clone(), crate::TsRange::ALL);
            let got = store.read_row(b"r", &[read]).await.unwrap();
            assert_eq!(got[0][0].value, value, "made at {made}");
        }
    }
}
