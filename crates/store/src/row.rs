//! One row's atomic unit: the cells of its [`Locality::Row`](crate::Locality::Row) families,
//! and the semantics of reads, conditions and mutations on it, shared by every local backend.
//!
//! `RowCells<V>` is generic over how a value is held: the mem backend holds the bytes, the
//! sled backend holds either the bytes or a reference to an out-of-line blob. The sled
//! backend keeps a whole `RowCells` in one sled value, so that a conditional mutation of the
//! row is one `compare_and_swap`.
//!
//! ```text
//!   (family, qualifier) -> [(ts 9, v), (ts 7, v), (ts 2, v)]    versions newest first
//! ```

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::values::Hash;
use crate::{Column, ColumnRead, Condition, Schema, StoreError, Ts, TsRange};

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RowCells<V> {
    columns: BTreeMap<(&'static str, Bytes), Vec<(Ts, V)>>,
}

impl<V> Default for RowCells<V> {
    fn default() -> Self {
        RowCells { columns: BTreeMap::new() }
    }
}

impl<V: Clone> RowCells<V> {
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    fn versions(&self, column: &Column) -> &[(Ts, V)] {
        // Borrowed lookup would need a tuple of references; the clone of `Bytes` is a
        // reference-count increment.
        self.columns
            .get(&(column.family, column.qualifier.clone()))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// Up to `read.versions` cells in `read.range`, newest first.
    pub fn read(&self, read: &ColumnRead) -> Vec<(Ts, V)> {
        in_range(self.versions(&read.column), read.range)
            .take(read.versions as usize)
            .cloned()
            .collect()
    }

    pub fn holds(&self, condition: &Condition) -> bool {
        match condition {
            Condition::NoCellIn { column, range } => {
                in_range(self.versions(column), *range).next().is_none()
            }
            Condition::CellAt { column, ts } => self.versions(column).iter().any(|(t, _)| t == ts),
        }
    }

    /// Writes `value` at `ts`; returns the value it replaced.
    pub fn put(&mut self, column: &Column, ts: Ts, value: V) -> Option<V> {
        let versions = self.columns.entry((column.family, column.qualifier.clone())).or_default();
        match versions.binary_search_by(|(t, _)| ts.cmp(t)) {
            Ok(i) => Some(std::mem::replace(&mut versions[i].1, value)),
            Err(i) => {
                versions.insert(i, (ts, value));
                None
            }
        }
    }

    /// Deletes the cells of `column` in `range`; returns them.
    pub fn delete(&mut self, column: &Column, range: TsRange) -> Vec<V> {
        let key = (column.family, column.qualifier.clone());
        let Some(versions) = self.columns.get_mut(&key) else {
            return Vec::new();
        };
        let mut removed = Vec::new();
        versions.retain(|(t, v)| {
            let hit = range.contains(*t);
            if hit {
                removed.push(v.clone());
            }
            !hit
        });
        if versions.is_empty() {
            self.columns.remove(&key);
        }
        removed
    }

    /// Every cell of `family`, in (qualifier, ts desc) order.
    pub fn family_cells<'a>(
        &'a self,
        family: &'a str,
    ) -> impl Iterator<Item = (&'a Bytes, Ts, &'a V)> + 'a {
        self.columns
            .iter()
            .filter(move |((f, _), _)| *f == family)
            .flat_map(|((_, q), versions)| versions.iter().map(move |(t, v)| (q, *t, v)))
    }
}

impl<V> RowCells<V> {
    /// Every column with its versions, newest first.
    pub fn columns(&self) -> impl Iterator<Item = (&'static str, &Bytes, &[(Ts, V)])> {
        self.columns.iter().map(|((f, q), v)| (*f, q, v.as_slice()))
    }
}

fn in_range<V>(versions: &[(Ts, V)], range: TsRange) -> impl Iterator<Item = &(Ts, V)> {
    // Versions are newest first: skip those above the range, stop below it.
    let start = versions.partition_point(|(t, _)| *t > range.max);
    versions[start..].iter().take_while(move |(t, _)| *t >= range.min)
}

/// How the sled backend holds a value: small values inline in the row, large ones in the
/// value log under their content's name (so that rewriting the row does not copy page
/// bodies). Stores written before the value log hold large values as blobs in a sled tree,
/// which still read.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Stored {
    Inline(Bytes),
    Blob { id: u64, len: u64 },
    Value { hash: Hash, len: u64 },
}

const FORMAT_VERSION: u8 = 1;

/// Encodes a row for the sled backend.
pub(crate) fn encode(row: &RowCells<Stored>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_VERSION);
    put_varint(&mut out, row.columns.len() as u64);
    for ((family, qualifier), versions) in &row.columns {
        put_bytes(&mut out, family.as_bytes());
        put_bytes(&mut out, qualifier);
        put_varint(&mut out, versions.len() as u64);
        for (ts, v) in versions {
            put_varint(&mut out, ts.0);
            match v {
                Stored::Inline(b) => {
                    out.push(0);
                    put_bytes(&mut out, b);
                }
                Stored::Blob { id, len } => {
                    out.push(1);
                    put_varint(&mut out, *id);
                    put_varint(&mut out, *len);
                }
                Stored::Value { hash, len } => {
                    out.push(2);
                    out.extend_from_slice(hash);
                    put_varint(&mut out, *len);
                }
            }
        }
    }
    out
}

/// Decodes a row written by [`encode`]. Families are mapped back to the schema's names.
pub(crate) fn decode(schema: &Schema, raw: &[u8]) -> Result<RowCells<Stored>, StoreError> {
    decode_only(schema, raw, &|_, _| true)
}

/// [`decode`], keeping only the columns (family, qualifier) `keep` says yes to: the others
/// are read past, their qualifiers and values not copied (a scan of the `lock` family skips
/// the pages' records; a read of two columns, the row's others).
pub(crate) fn decode_only(
    schema: &Schema,
    raw: &[u8],
    keep: &dyn Fn(&str, &[u8]) -> bool,
) -> Result<RowCells<Stored>, StoreError> {
    let mut r = Reader { buf: raw };
    let mut row = RowCells { columns: BTreeMap::new() };
    for _ in 0..r.header()? {
        let (family, qualifier, n) = r.column()?;
        let family = schema.family(family).ok_or_else(|| {
            corrupt(&format!("family {:?} not in schema", String::from_utf8_lossy(family)))
        })?;
        let kept = keep(family.name, qualifier);
        let mut versions = Vec::with_capacity(if kept { n.min(1024) as usize } else { 0 });
        for _ in 0..n {
            let (ts, value) = r.version()?;
            if kept {
                versions.push((ts, value.stored()));
            }
        }
        if kept {
            row.columns.insert((family.name, Bytes::copy_from_slice(qualifier)), versions);
        }
    }
    r.end()?;
    Ok(row)
}

/// The ids of the blobs a row record refers to, appended to `out`. Read without a schema:
/// the compaction, which keeps only the blobs some row refers to, reads records as bytes.
pub(crate) fn blob_ids(raw: &[u8], out: &mut Vec<u64>) -> Result<(), StoreError> {
    each_value(raw, &mut |v| {
        if let Value::Blob { id, .. } = v {
            out.push(*id);
        }
    })
}

/// The names of the values in the value log a row record refers to, each given to `found`.
/// Read without a schema, as [`blob_ids`].
pub(crate) fn value_names(raw: &[u8], found: &mut dyn FnMut(&Hash)) -> Result<(), StoreError> {
    each_value(raw, &mut |v| {
        if let Value::Named { hash, .. } = v {
            found(hash);
        }
    })
}

/// Every version's value of every column of a record, in order, read without a schema; an
/// error if the record does not read whole.
fn each_value(raw: &[u8], f: &mut dyn FnMut(&Value<'_>)) -> Result<(), StoreError> {
    let mut r = Reader { buf: raw };
    for _ in 0..r.header()? {
        let (_, _, n) = r.column()?;
        for _ in 0..n {
            f(&r.version()?.1);
        }
    }
    r.end()
}

/// One version's value as a record holds it, borrowed from the record.
enum Value<'a> {
    Inline(&'a [u8]),
    Blob { id: u64, len: u64 },
    Named { hash: &'a Hash, len: u64 },
}

impl Value<'_> {
    fn stored(&self) -> Stored {
        match *self {
            Value::Inline(b) => Stored::Inline(Bytes::copy_from_slice(b)),
            Value::Blob { id, len } => Stored::Blob { id, len },
            Value::Named { hash, len } => Stored::Value { hash: *hash, len },
        }
    }
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt { backend: "sled", detail: format!("row record: {what}") }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// The record's format version, checked, and its column count.
    fn header(&mut self) -> Result<u64, StoreError> {
        if self.byte().ok_or_else(|| corrupt("empty"))? != FORMAT_VERSION {
            return Err(corrupt("unknown format version"));
        }
        self.varint().ok_or_else(|| corrupt("column count"))
    }
    /// A column's head: its family and qualifier as stored, and how many versions follow.
    fn column(&mut self) -> Result<(&'a [u8], &'a [u8], u64), StoreError> {
        let family = self.bytes().ok_or_else(|| corrupt("family"))?;
        let qualifier = self.bytes().ok_or_else(|| corrupt("qualifier"))?;
        let n = self.varint().ok_or_else(|| corrupt("version count"))?;
        Ok((family, qualifier, n))
    }
    /// One version: its timestamp and its value.
    fn version(&mut self) -> Result<(Ts, Value<'a>), StoreError> {
        let ts = Ts(self.varint().ok_or_else(|| corrupt("timestamp"))?);
        let value = match self.byte() {
            Some(0) => Value::Inline(self.bytes().ok_or_else(|| corrupt("value"))?),
            Some(1) => Value::Blob {
                id: self.varint().ok_or_else(|| corrupt("blob id"))?,
                len: self.varint().ok_or_else(|| corrupt("blob length"))?,
            },
            Some(2) => Value::Named {
                hash: self.hash().ok_or_else(|| corrupt("value name"))?,
                len: self.varint().ok_or_else(|| corrupt("value length"))?,
            },
            _ => return Err(corrupt("value tag")),
        };
        Ok((ts, value))
    }
    /// Nothing may follow the record's last column.
    fn end(&self) -> Result<(), StoreError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(corrupt("trailing bytes"))
        }
    }
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.buf.split_first()?;
        self.buf = rest;
        Some(b)
    }
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7F) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    fn hash(&mut self) -> Option<&'a Hash> {
        let (h, rest) = self.buf.split_first_chunk::<32>()?;
        self.buf = rest;
        Some(h)
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = usize::try_from(self.varint()?).ok()?;
        if n > self.buf.len() {
            return None;
        }
        let (b, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FamilySpec, Locality};

    #[test]
    fn encode_decode_round_trip() {
        let schema = Schema::new([FamilySpec { name: "f", locality: Locality::Row }]);
        let mut row = RowCells::default();
        let c = Column::new("f", "q");
        row.put(&c, Ts(3), Stored::Inline(Bytes::from_static(b"three")));
        row.put(&c, Ts(9), Stored::Blob { id: 7, len: 1 << 20 });
        row.put(&Column::new("f", ""), Ts(1), Stored::Inline(Bytes::new()));
        row.put(&Column::new("f", "v"), Ts(4), Stored::Value { hash: [9; 32], len: 70_000 });
        let decoded = decode(&schema, &encode(&row)).unwrap();
        assert_eq!(decoded, row);
        let read = decoded.read(&ColumnRead::all(c, TsRange::ALL));
        assert_eq!(read.iter().map(|(t, _)| t.0).collect::<Vec<_>>(), vec![9, 3]);
        assert!(decode(&schema, &encode(&row)[..5]).is_err());
    }

    #[test]
    fn a_decode_of_some_columns_keeps_those_whole_and_only_those() {
        let families = ["a", "b", "c"].map(|name| FamilySpec { name, locality: Locality::Row });
        let schema = Schema::new(families);
        let mut row = RowCells::default();
        for (f, q) in [("a", "x"), ("b", "x"), ("b", "y"), ("c", "")] {
            row.put(&Column::new(f, q), Ts(2), Stored::Inline(Bytes::from(format!("{f}{q}"))));
            row.put(&Column::new(f, q), Ts(5), Stored::Blob { id: 4, len: 9000 });
        }
        let raw = encode(&row);
        let kept = decode_only(&schema, &raw, &|f, q| f != "b" || q == b"y").unwrap();
        let mut expected = decode(&schema, &raw).unwrap();
        expected.columns.retain(|(f, q), _| *f != "b" || q == "y");
        assert_eq!(kept, expected);
        assert_eq!(kept.columns.len(), 3);
        assert!(decode_only(&schema, &raw, &|_, _| false).unwrap().is_empty());
        // What it reads past is checked as a whole decode checks it.
        for cut in 1..raw.len() {
            assert!(decode_only(&schema, &raw[..cut], &|f, _| f == "a").is_err(), "{cut}");
        }
    }

    #[test]
    fn the_blob_ids_of_a_record_are_every_blob_of_every_column_and_version() {
        let mut row = RowCells::default();
        row.put(&Column::new("a", "x"), Ts(2), Stored::Inline(Bytes::from_static(b"small")));
        row.put(&Column::new("a", "x"), Ts(5), Stored::Blob { id: 300, len: 9000 });
        row.put(&Column::new("a", "x"), Ts(7), Stored::Blob { id: 1 << 40, len: 1 });
        row.put(&Column::new("b", ""), Ts(3), Stored::Blob { id: 4, len: 300 });
        let raw = encode(&row);
        let mut ids = vec![99];
        blob_ids(&raw, &mut ids).unwrap();
        ids.sort_unstable();
        assert_eq!(ids, [4, 99, 300, 1 << 40], "appended to what was there");
        let mut none = Vec::new();
        blob_ids(&encode(&RowCells::default()), &mut none).unwrap();
        assert!(none.is_empty());
        for cut in 0..raw.len() {
            assert!(blob_ids(&raw[..cut], &mut Vec::new()).is_err(), "{cut}");
        }
        let mut longer = raw.clone();
        longer.push(0);
        assert!(blob_ids(&longer, &mut Vec::new()).is_err(), "trailing bytes");
    }

    #[test]
    fn the_value_names_of_a_record_are_every_one_of_every_column_and_version() {
        let mut row = RowCells::default();
        row.put(&Column::new("a", "x"), Ts(2), Stored::Inline(Bytes::from_static(b"small")));
        row.put(&Column::new("a", "x"), Ts(5), Stored::Value { hash: [5; 32], len: 9000 });
        row.put(&Column::new("a", "x"), Ts(7), Stored::Blob { id: 1, len: 300 });
        row.put(&Column::new("b", ""), Ts(3), Stored::Value { hash: [3; 32], len: 300 });
        let raw = encode(&row);
        let mut names = Vec::new();
        value_names(&raw, &mut |h| names.push(*h)).unwrap();
        names.sort_unstable();
        assert_eq!(names, [[3; 32], [5; 32]]);
        for cut in 0..raw.len() {
            assert!(value_names(&raw[..cut], &mut |_| ()).is_err(), "{cut}");
        }
    }
}
