//! rank's shards: the rank state of many pages in one row, so that a run that moves the
//! state of thousands of pages writes [`SHARDS`] rows, not thousands.
//!
//! A page's state is its rank x, what its sources pushed it, A, and the rank shown: the one
//! its `k:` row holds (`rank:rank`), which the export, the cluster and search read. Every
//! absorb moves x; the shown rank follows only when x leaves it by more than the bound
//! allows (see [`leeway`]), so an update that moves the ranks of thousands of pages by a
//! hair writes the `k:` rows of the few that moved visibly.
//!
//! The row of a shard is `h:<bucket><shard>` (hex bytes; the shard is picked by the second
//! byte of the URL's blake3, the bucket by the first), its cell `rank:state`: a format
//! byte, then one entry per page, sorted by key: the first 16 bytes of the URL's blake3,
//! then x, A and the shown rank as little-endian f64s. A page whose state is all zero has
//! no entry.

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, Bytes, BytesMut};
use perc_txn::Transaction;

use crate::model::{self, col};
use crate::IndexError;

/// How far x may leave the shown rank, as a share of x, before the shown rank follows it,
/// for a rank past about 1 (see [`leeway`]).
pub const SHOWN: f64 = 3e-4;

/// How far x may leave the shown rank before the shown rank follows it: the bound less what
/// x itself may be off. x is within e · x̂ of the exact rank x̂, e = ε / 0.15 = 0.000667
/// (so e · x̂ < 0.00067 · x); the shown rank is within the leeway more. Past a rank of about
/// 1 that is [`SHOWN`] of x, for 0.00097 · x̂ in all, inside the bound's 0.001 · x̂; below,
/// 0.00099 − 0.00067 · x, for 0.00099 in all, inside the bound's 0.001: a page of rank 0.15
/// (linked from nowhere) shows a move of 0.0009, not one of 0.000045.
pub fn leeway(x: f64) -> f64 {
    (SHOWN * x.abs()).max(0.00099 - 0.00067 * x.abs())
}

/// The shown rank after a run leaves a page's rank at `x`: `x` when it left `shown` by more
/// than the [`leeway`], or when one of them is zero and the other is not (a page that
/// became or stopped being one); `shown` otherwise.
pub fn shown_after(x: f64, shown: f64) -> f64 {
    if (x - shown).abs() > leeway(x) || (x == 0.0) != (shown == 0.0) {
        x
    } else {
        shown
    }
}

/// The shards of a bucket. Fewer rows cost less to read and write (each a record in sled,
/// its value in the value log): with 64 rather than 256, a 1,000-page web's update took
/// 33-38 ms rather than 50-55, a 10,000-page web's 65-76 rather than 79-81. An update of a
/// web of 10,000 pages or more touches every shard, whatever their number: the bytes are
/// the whole state's, 40 a page.
pub const SHARDS: u16 = 64;

/// Shards written whole a transaction (settle, an upgrade).
pub const SHARDS_A_TXN: usize = 16;

/// The format byte of a shard's cell.
const FORMAT: u8 = 1;
const KEY: usize = 16;
const ENTRY: usize = KEY + 3 * 8;

/// A page's rank state.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Entry {
    pub x: f64,
    pub a: f64,
    pub shown: f64,
}

impl Entry {
    fn is_zero(&self) -> bool {
        self.x == 0.0 && self.a == 0.0 && self.shown == 0.0
    }
}

/// Where a page's state lives: its shard's row and its key in it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Slot {
    row: Bytes,
    key: [u8; KEY],
}

impl Slot {
    pub fn of(url: &str) -> Slot {
        let hash = blake3::hash(url.as_bytes());
        let bytes = hash.as_bytes();
        let shard = u8::try_from(u16::from(bytes[1]) * SHARDS / 256).expect("below SHARDS");
        let row = model::rank_shard(model::rank_bucket_of(bytes[0]), shard);
        Slot { row, key: bytes[..KEY].try_into().expect("16 bytes") }
    }

    /// The row of the shard.
    pub fn row(&self) -> &Bytes {
        &self.row
    }
}

/// The shards a transaction read, and the ones it changed.
#[derive(Debug, Default)]
pub struct Shards {
    read: BTreeMap<Bytes, BTreeMap<[u8; KEY], Entry>>,
    changed: BTreeSet<Bytes>,
}

impl Shards {
    /// Reads, in one call, the shards of `slots` not read yet.
    pub async fn load<'s>(
        &mut self,
        txn: &Transaction,
        slots: impl IntoIterator<Item = &'s Slot>,
    ) -> Result<(), IndexError> {
        let rows: BTreeSet<&Bytes> =
            slots.into_iter().map(|s| &s.row).filter(|r| !self.read.contains_key(*r)).collect();
        if rows.is_empty() {
            return Ok(());
        }
        let keys: Vec<(Bytes, Bytes)> =
            rows.iter().map(|r| ((*r).clone(), Bytes::from_static(col::RANK_STATE))).collect();
        let cells = txn.get_many(&keys).await?;
        for (row, cell) in rows.into_iter().zip(cells) {
            let entries = match cell {
                Some(raw) => decode(&raw).ok_or_else(|| {
                    IndexError::corrupt(
                        format!("rank:state of {}", row.escape_ascii()),
                        format!("{} bytes", raw.len()),
                    )
                })?,
                None => BTreeMap::new(),
            };
            self.read.insert(row.clone(), entries);
        }
        Ok(())
    }

    /// The state of the page at `slot`, its shard read: all zero when it has none.
    pub fn get(&self, slot: &Slot) -> Entry {
        let shard = self.read.get(&slot.row).expect("the shard is read first");
        shard.get(&slot.key).copied().unwrap_or_default()
    }

    /// Sets the state of the page at `slot`, its shard read.
    pub fn set(&mut self, slot: &Slot, entry: Entry) {
        let shard = self.read.get_mut(&slot.row).expect("the shard is read first");
        let before = shard.get(&slot.key).copied().unwrap_or_default();
        if before == entry {
            return;
        }
        if entry.is_zero() {
            shard.remove(&slot.key);
        } else {
            shard.insert(slot.key, entry);
        }
        self.changed.insert(slot.row.clone());
    }

    /// Writes each shard changed, unchecked: every transaction that writes a shard writes its
    /// bucket's mark, checked, and conflicts there.
    pub fn write(self, txn: &mut Transaction) {
        for row in self.changed {
            let value = encode(&self.read[&row]);
            txn.set_unchecked(row.clone(), Bytes::from_static(col::RANK_STATE), value);
            // Rewritten by most runs: its old versions are collected soon after.
            txn.collect_soon(row);
        }
    }
}

/// Every page's state, by shard: what [`super::settle`] writes over every shard.
#[derive(Debug, Default)]
pub struct Whole(BTreeMap<Bytes, BTreeMap<[u8; KEY], Entry>>);

impl Whole {
    pub fn insert(&mut self, url: &str, entry: Entry) {
        if !entry.is_zero() {
            let slot = Slot::of(url);
            self.0.entry(slot.row).or_default().insert(slot.key, entry);
        }
    }

    /// The row of every shard, those with no page included.
    pub fn rows(&self) -> Vec<Bytes> {
        (0..model::RANK_BUCKETS)
            .flat_map(|b| {
                (0..SHARDS).map(move |s| model::rank_shard(b, u8::try_from(s).expect("a byte")))
            })
            .collect()
    }

    /// Writes the shards of `rows` as they are here, unchecked (as [`Shards::write`]).
    pub fn write(&self, txn: &mut Transaction, rows: &[Bytes]) {
        let none = BTreeMap::new();
        for row in rows {
            let value = encode(self.0.get(row).unwrap_or(&none));
            txn.set_unchecked(row.clone(), Bytes::from_static(col::RANK_STATE), value);
        }
    }
}

fn encode(entries: &BTreeMap<[u8; KEY], Entry>) -> Bytes {
    let mut out = BytesMut::with_capacity(1 + entries.len() * ENTRY);
    out.put_u8(FORMAT);
    for (key, e) in entries {
        out.put_slice(key);
        out.put_f64_le(e.x);
        out.put_f64_le(e.a);
        out.put_f64_le(e.shown);
    }
    out.freeze()
}

fn decode(raw: &[u8]) -> Option<BTreeMap<[u8; KEY], Entry>> {
    let (&format, body) = raw.split_first()?;
    if format != FORMAT || body.len() % ENTRY != 0 {
        return None;
    }
    let f = |b: &[u8]| f64::from_le_bytes(b.try_into().expect("8 bytes"));
    body.chunks_exact(ENTRY)
        .map(|c| {
            let e = Entry { x: f(&c[16..24]), a: f(&c[24..32]), shown: f(&c[32..40]) };
            let finite = e.x.is_finite() && e.a.is_finite() && e.shown.is_finite();
            finite.then(|| (c[..KEY].try_into().expect("16 bytes"), e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_reads_back_what_it_wrote_and_refuses_a_torn_one() {
        let mut entries = BTreeMap::new();
        for (i, url) in ["http://a/", "http://b/", "http://c/"].iter().enumerate() {
            let e = Entry { x: 0.15 + i as f64, a: i as f64, shown: 0.1 * i as f64 };
            entries.insert(Slot::of(url).key, e);
        }
        let raw = encode(&entries);
        assert_eq!(decode(&raw), Some(entries));
        assert_eq!(decode(&raw[..raw.len() - 1]), None);
        assert_eq!(decode(b""), None);
    }

    #[test]
    fn the_shown_rank_follows_only_a_visible_move() {
        assert_eq!(shown_after(2.0005, 2.0), 2.0);
        assert_eq!(shown_after(2.0007, 2.0), 2.0007);
        assert_eq!(shown_after(0.1508, 0.15), 0.15);
        assert_eq!(shown_after(0.1510, 0.15), 0.1510);
        assert_eq!(shown_after(0.0, 0.5), 0.0);
        assert_eq!(shown_after(0.15, 0.0), 0.15);
        assert_eq!(shown_after(0.0, 0.0), 0.0);
    }

    #[test]
    fn the_shown_rank_stays_within_the_bound() {
        // x within e · x̂ of x̂ either way, the shown rank within the leeway of x.
        let e = super::super::EPSILON / super::super::TELEPORT;
        for i in 0..=4000 {
            let exact = 0.15 + i as f64 * 0.005;
            for x in [exact * (1.0 - e), exact * (1.0 + e)] {
                for shown in [x - leeway(x), x + leeway(x)] {
                    let off = (shown - exact).abs();
                    assert!(off <= super::super::bound(exact), "{exact} {x} {shown}: {off}");
                }
            }
        }
    }
}
