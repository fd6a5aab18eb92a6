//! The in-memory backend, for tests: the same semantics as sled, nothing durable.
//!
//! One mutex guards the whole table; it is never held across an `.await`.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;

use crate::row::RowCells;
use crate::{
    keycode, validate, validate_check_and_mutate, validate_row_mutation, Cell, ColumnRead,
    Condition, Locality, Mutation, Result, RowMutation, Scan, ScanCell, Schema, Store,
};

pub struct MemStore {
    schema: Schema,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    rows: BTreeMap<Bytes, RowCells<Bytes>>,
    /// Families with a locality group of their own: `cell_key -> value` per family.
    own: BTreeMap<&'static str, BTreeMap<Vec<u8>, Bytes>>,
}

impl MemStore {
    pub fn new(schema: Schema) -> MemStore {
        MemStore { schema, inner: Mutex::new(Inner::default()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves a consistent map (every mutation is applied
        // to a clone first), so poisoning carries no information here.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn read_own(own: &BTreeMap<Vec<u8>, Bytes>, row: &[u8], read: &ColumnRead) -> Vec<Cell> {
    let lo = keycode::cell_key(row, &read.column.qualifier, read.range.max);
    let hi = keycode::cell_key(row, &read.column.qualifier, read.range.min);
    own.range(lo..=hi)
        .take(read.versions as usize)
        .map(|(k, v)| Cell {
            ts: keycode::decode_ts_desc(&k[k.len() - 8..]).unwrap(),
            value: v.clone(),
        })
        .collect()
}

fn apply(row: &mut RowCells<Bytes>, mutations: &[Mutation]) {
    for m in mutations {
        match m {
            Mutation::Put { column, ts, value } => {
                row.put(column, *ts, value.clone());
            }
            Mutation::Delete { column, range } => {
                row.delete(column, *range);
            }
        }
    }
}

#[async_trait]
impl Store for MemStore {
    fn schema(&self) -> &Schema {
        &self.schema
    }

    async fn read_row(&self, row: &[u8], reads: &[ColumnRead]) -> Result<Vec<Vec<Cell>>> {
        validate(
            &self.schema,
            row,
            reads.iter().map(|r| (r.column.family, r.column.qualifier.len())),
            [],
            false,
        )?;
        let inner = self.lock();
        let cells = inner.rows.get(row);
        let mut out = Vec::with_capacity(reads.len());
        for read in reads {
            out.push(match self.schema.locality(read.column.family)? {
                Locality::Row => cells
                    .map(|c| {
                        c.read(read).into_iter().map(|(ts, value)| Cell { ts, value }).collect()
                    })
                    .unwrap_or_default(),
                Locality::Own => inner
                    .own
                    .get(read.column.family)
                    .map(|own| read_own(own, row, read))
                    .unwrap_or_default(),
            });
        }
        Ok(out)
    }

    async fn check_and_mutate(
        &self,
        row: &[u8],
        conditions: &[Condition],
        mutations: &[Mutation],
    ) -> Result<bool> {
        validate_check_and_mutate(&self.schema, row, conditions, mutations)?;
        let mut inner = self.lock();
        let empty = RowCells::default();
        let current = inner.rows.get(row).unwrap_or(&empty);
        if !conditions.iter().all(|c| current.holds(c)) {
            return Ok(false);
        }
        let mut next = current.clone();
        apply(&mut next, mutations);
        if next.is_empty() {
            inner.rows.remove(row);
        } else {
            inner.rows.insert(Bytes::copy_from_slice(row), next);
        }
        Ok(true)
    }

    async fn mutate_rows(&self, rows: &[RowMutation]) -> Result<()> {
        for rm in rows {
            validate_row_mutation(&self.schema, rm)?;
        }
        let mut inner = self.lock();
        for rm in rows {
            let (in_row, own): (Vec<Mutation>, Vec<Mutation>) =
                rm.mutations.iter().cloned().partition(|m| {
                    self.schema.locality(m.column().family).ok() == Some(Locality::Row)
                });
            if !in_row.is_empty() {
                let mut next = inner.rows.get(&rm.row).cloned().unwrap_or_default();
                apply(&mut next, &in_row);
                if next.is_empty() {
                    inner.rows.remove(&rm.row);
                } else {
                    inner.rows.insert(rm.row.clone(), next);
                }
            }
            for m in own {
                let tree = inner.own.entry(m.column().family).or_default();
                match m {
                    Mutation::Put { column, ts, value } => {
                        tree.insert(keycode::cell_key(&rm.row, &column.qualifier, ts), value);
                    }
                    Mutation::Delete { column, range } => {
                        let lo = keycode::cell_key(&rm.row, &column.qualifier, range.max);
                        let hi = keycode::cell_key(&rm.row, &column.qualifier, range.min);
                        let doomed: Vec<Vec<u8>> =
                            tree.range(lo..=hi).map(|(k, _)| k.clone()).collect();
                        for k in doomed {
                            tree.remove(&k);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn scan(&self, scan: &Scan) -> Result<Vec<ScanCell>> {
        let locality = self.schema.locality(scan.family)?;
        let inner = self.lock();
        let mut out = Vec::new();
        match locality {
            Locality::Row => {
                let end = if scan.end.is_empty() {
                    Bound::Unbounded
                } else {
                    Bound::Excluded(scan.end.clone())
                };
                for (row, cells) in inner.rows.range((Bound::Included(scan.start.clone()), end)) {
                    for (q, ts, v) in cells.family_cells(scan.family) {
                        if out.len() >= scan.limit {
                            return Ok(out);
                        }
                        out.push(ScanCell {
                            row: row.clone(),
                            qualifier: q.clone(),
                            ts,
                            value: v.clone(),
                        });
                    }
                }
            }
            Locality::Own => {
                let Some(tree) = inner.own.get(scan.family) else {
                    return Ok(out);
                };
                let mut lo = Vec::new();
                keycode::encode_bytes(&mut lo, &scan.start);
                let end = if scan.end.is_empty() {
                    Bound::Unbounded
                } else {
                    let mut hi = Vec::new();
                    keycode::encode_bytes(&mut hi, &scan.end);
                    Bound::Excluded(hi)
                };
                for (k, v) in tree.range((Bound::Included(lo), end)).take(scan.limit) {
                    let (row, qualifier, ts) =
                        keycode::decode_cell_key(k).expect("mem keys are written by this module");
                    out.push(ScanCell {
                        row: row.into(),
                        qualifier: qualifier.into(),
                        ts,
                        value: v.clone(),
                    });
                }
            }
        }
        Ok(out)
    }

    async fn sync(&self) -> Result<()> {
        Ok(())
    }
}
