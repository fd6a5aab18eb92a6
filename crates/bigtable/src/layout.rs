//! Where perc's cells sit in the Bigtable table: the row-key layout that gives each family of
//! [`Locality::Own`](perc_store::Locality::Own) a key range of its own.
//!
//! Cloud Bigtable keeps every column family of a row together, so a scan of one family over a
//! key range reads every row in it, whatever families they hold (the emulator even copies each
//! whole row before filtering). A notification scan over the table would read every page. So a
//! cell of an `Own` family is not stored in its row but in a row of that family's own range:
//!
//! ```text
//!   perc row r, a Row family          stored at r                 (r does not start with FF)
//!                                     stored at FF 01 ++ r[1..]   (r starts with FF)
//!   perc row r, Own family f          stored at FF 00 ++ f ++ 00 ++ r
//!   the layout's mark                 stored at FF 00 00 ++ "layout"
//! ```
//!
//! The map of rows is monotone, so a range of perc rows is a range of stored rows, with the
//! own ranges (`FF 00 ..`) cut out of it when it spans them; family names never hold a 00
//! byte, so each Own family's range is contiguous and ordered as its perc rows. perc's own
//! row keys never start with FF, so a table written before this layout keeps its rows of Row
//! families where they are; its Own families' cells are moved once, when a process of this
//! version first opens the table ([`crate::BigtableStore::open`]).

use bigtable_rs::google::bigtable::v2::{
    mutation, row_filter, Mutation as BtMutation, ReadRowsRequest, RowSet,
};
use bytes::Bytes;
use perc_store::Locality;

use crate::convert::{filter, row_range, rpc, set_cell};
use crate::{Entry, Error, LAYOUT_VERSION};

const FF: u8 = 0xFF;
/// The second byte of a stored key under FF: an Own family's range.
const OWN: u8 = 0x00;
/// The second byte of a stored key under FF: a perc row that itself starts with FF.
const ESCAPED: u8 = 0x01;

/// The stored key of perc row `row` in a Row family.
pub fn row_key(row: &[u8]) -> Vec<u8> {
    match row.split_first() {
        Some((&FF, rest)) => [&[FF, ESCAPED][..], rest].concat(),
        _ => row.to_vec(),
    }
}

/// The first stored key of family `family`'s own range.
fn own_prefix(family: &str) -> Vec<u8> {
    [&[FF, OWN][..], family.as_bytes(), &[0]].concat()
}

/// The stored key of perc row `row` in the Own family `family`.
pub fn own_key(family: &str, row: &[u8]) -> Vec<u8> {
    [own_prefix(family).as_slice(), row].concat()
}

/// The stored key of `row`'s cells of the Own family `own`, or of its Row families (`None`).
pub fn key(own: Option<&str>, row: &[u8]) -> Vec<u8> {
    match own {
        Some(family) => own_key(family, row),
        None => row_key(row),
    }
}

/// The stored key of the row that records the layout.
pub fn mark_key() -> Vec<u8> {
    [&[FF, OWN, 0][..], b"layout"].concat()
}

/// The perc row a stored key holds: of a Row family's row, or of an Own family's row (whose
/// family the caller knows). `None` for a key of neither (the mark). Copies nothing but an
/// escaped key.
pub fn perc_row(mut stored: Vec<u8>) -> Option<Bytes> {
    match stored.as_slice() {
        [FF, ESCAPED, ..] => {
            stored.remove(1);
            Some(Bytes::from(stored))
        }
        [FF, OWN, rest @ ..] => {
            let end = rest.iter().position(|&b| b == 0)?;
            (end > 0).then(|| Bytes::from(stored).slice(2 + end + 1..))
        }
        _ => Some(Bytes::from(stored)),
    }
}

/// A half-open range of stored keys; an empty end is the end of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub start: Vec<u8>,
    pub end: Vec<u8>,
}

/// The stored ranges of perc rows `start..end` (an empty end: every row from `start`) in a
/// Row family: one range, or two around the own ranges when it spans them.
pub fn row_ranges(start: &[u8], end: &[u8]) -> Vec<KeyRange> {
    let (start, end) = (row_key(start), if end.is_empty() { Vec::new() } else { row_key(end) });
    let gap_start = vec![FF, OWN];
    let gap_end = vec![FF, ESCAPED];
    let spans = start < gap_start && (end.is_empty() || end > gap_start);
    if !spans {
        return vec![KeyRange { start, end }];
    }
    let mut out = vec![KeyRange { start, end: gap_start }];
    if end.is_empty() || end > gap_end {
        out.push(KeyRange { start: gap_end, end });
    }
    out
}

/// The stored range of perc rows `start..end` (an empty end: every row from `start`) in the
/// Own family `family`.
pub fn own_range(family: &str, start: &[u8], end: &[u8]) -> KeyRange {
    let end = if end.is_empty() {
        [&[FF, OWN][..], family.as_bytes(), &[1]].concat()
    } else {
        own_key(family, end)
    };
    KeyRange { start: own_key(family, start), end }
}

/// Moving a table of an older layout into this one.
impl crate::BigtableStore {
    /// Makes sure the table is in this version's layout: a table this process created is
    /// marked; a table without the mark, written by an older perc, has every Own family's
    /// cells moved from their rows into the family's range, then is marked. Moving twice (two
    /// processes starting at once, or a start after a crash in the middle) only writes the
    /// same cells again.
    pub(crate) async fn settle_layout(&self, created: bool) -> Result<(), Error> {
        let Some(marker) = self.schema.families().first().map(|f| f.name) else {
            return Ok(());
        };
        if !created {
            let rows = RowSet { row_keys: vec![mark_key()], row_ranges: vec![] };
            let got = self
                .read(rows, filter(row_filter::Filter::PassAllFilter(true)))
                .await
                .map_err(|e| Error::Rpc(e.to_string()))?;
            if got.iter().any(|(_, cells)| !cells.is_empty()) {
                return Ok(());
            }
            for family in self.schema.families().iter().filter(|f| f.locality == Locality::Own) {
                self.move_own_family(family.name).await.map_err(|e| Error::Rpc(e.to_string()))?;
            }
        }
        let mark = Entry {
            key: mark_key(),
            mutations: vec![set_cell(marker, b"layout".to_vec(), 0, LAYOUT_VERSION.to_vec())],
        };
        self.mutate_entries(vec![mark]).await.map_err(|e| Error::Rpc(e.to_string()))
    }

    /// Moves `family`'s cells from the rows of an older layout into its own range: each
    /// batch's cells are written there first, then deleted where they were.
    async fn move_own_family(&self, family: &str) -> perc_store::Result<()> {
        const BATCH_ROWS: usize = 1000;
        let mut start: Vec<u8> = Vec::new();
        let mut moved = 0usize;
        loop {
            let req = ReadRowsRequest {
                table_name: self.table.clone(),
                rows: Some(RowSet {
                    row_keys: vec![],
                    // The older layout's rows never start with FF.
                    row_ranges: vec![row_range(KeyRange { start: start.clone(), end: vec![0xFF] })],
                }),
                filter: Some(filter(row_filter::Filter::FamilyNameRegexFilter(format!(
                    "^{family}$"
                )))),
                rows_limit: BATCH_ROWS as i64,
                ..ReadRowsRequest::default()
            };
            let got = self.client().read_rows(req).await.map_err(|e| rpc("ReadRows", e))?;
            let (puts, deletes): (Vec<Entry>, Vec<Entry>) = got
                .iter()
                .map(|(row, cells)| {
                    let put = Entry {
                        key: own_key(family, row),
                        mutations: cells
                            .iter()
                            .map(|c| {
                                set_cell(
                                    family,
                                    c.qualifier.clone(),
                                    c.timestamp_micros,
                                    c.value.clone(),
                                )
                            })
                            .collect(),
                    };
                    let delete = Entry {
                        key: row.clone(),
                        mutations: vec![BtMutation {
                            mutation: Some(mutation::Mutation::DeleteFromFamily(
                                mutation::DeleteFromFamily { family_name: family.to_string() },
                            )),
                        }],
                    };
                    (put, delete)
                })
                .unzip();
            self.mutate_entries(puts).await?;
            self.mutate_entries(deletes).await?;
            moved += got.len();
            match got.last() {
                Some((last, _)) if got.len() == BATCH_ROWS => {
                    start = [last.as_slice(), &[0]].concat()
                }
                _ => break,
            }
        }
        if moved > 0 {
            tracing::info!(family, rows = moved, "moved a family into its own key range");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte string of one to `len` bytes over an alphabet that holds the edges.
    fn keys(len: usize) -> Vec<Vec<u8>> {
        let alphabet = [0x00u8, 0x01, 0x61, 0xFE, 0xFF];
        let mut out = vec![Vec::new()];
        let mut last = vec![Vec::new()];
        for _ in 0..len {
            last = last
                .iter()
                .flat_map(|k| alphabet.iter().map(move |&b| [k.as_slice(), &[b]].concat()))
                .collect();
            out.extend(last.iter().cloned());
        }
        out.retain(|k| !k.is_empty());
        out.sort();
        out
    }

    #[test]
    fn the_map_of_rows_keeps_their_order_and_comes_back() {
        let keys = keys(3);
        for pair in keys.windows(2) {
            assert!(row_key(&pair[0]) < row_key(&pair[1]), "{pair:?}");
            assert!(own_key("notify", &pair[0]) < own_key("notify", &pair[1]), "{pair:?}");
        }
        for k in &keys {
            assert_eq!(perc_row(row_key(k)).unwrap(), &k[..]);
            assert_eq!(perc_row(own_key("notify", k)).unwrap(), &k[..]);
        }
        assert_eq!(perc_row(mark_key()), None);
    }

    fn within(r: &[KeyRange], k: &[u8]) -> bool {
        r.iter().any(|r| k >= &r.start[..] && (r.end.is_empty() || k < &r.end[..]))
    }

    #[test]
    fn a_range_of_rows_holds_exactly_its_rows_and_no_own_cell() {
        let keys = keys(3);
        let mut bounds = self::keys(2);
        bounds.push(Vec::new());
        for start in bounds.iter().filter(|b| !b.is_empty()) {
            for end in &bounds {
                let rows = row_ranges(start, end);
                let own = own_range("notify", start, end);
                for k in &keys {
                    let expect = k >= start && (end.is_empty() || k < end);
                    assert_eq!(within(&rows, &row_key(k)), expect, "{start:?}..{end:?} {k:?}");
                    assert_eq!(
                        within(std::slice::from_ref(&own), &own_key("notify", k)),
                        expect,
                        "{start:?}..{end:?} {k:?}"
                    );
                    for f in ["notify", "notif", "notifyx", "worker"] {
                        assert!(!within(&rows, &own_key(f, k)), "{start:?}..{end:?} {f} {k:?}");
                    }
                    assert!(!within(std::slice::from_ref(&own), &row_key(k)));
                    for f in ["notif", "notifyx", "worker"] {
                        let other = own_key(f, k);
                        assert!(!within(std::slice::from_ref(&own), &other), "{f} {k:?}");
                    }
                }
                assert!(!within(&rows, &mark_key()));
                assert!(!within(std::slice::from_ref(&own), &mark_key()));
            }
        }
    }
}
