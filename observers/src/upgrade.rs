//! Brings a store written by an earlier perc to the layout this one reads. It runs when a
//! pipeline opens, before its workers start: each step moves a batch of rows per
//! transaction, so a step cut short (a kill, a conflict with another process upgrading the
//! same shared store) is taken up where it stopped by the next opening; the store's layout
//! version (`crawl:layout` of `m:config`) is written once every step is done. A store of a
//! later layout than this perc reads is refused, before anything is written.
//!
//! The layouts:
//! 1. Everything about a URL in its page row `p:<url>`.
//! 2. A URL's frontier entry (`crawl:want`) and recrawl state (`crawl:state`) in a row of
//!    their own, `f:<url>` (see [`crate::model::schema`]). The upgrade moves both, and drops
//!    the page row's fetch ack; the want it writes notifies fetch at the fetch row, so a URL
//!    that was waiting for its fetch is fetched. A notification left at a page row's want
//!    finds no want there and does nothing.
//! 3. A URL's in-degree keeps a mark of the change rows it folded (`indeg:folded`), and
//!    erases them after its commit instead of deleting them in it; a perc of layout 2 would
//!    count again a row a crash kept from being erased. Nothing moves: a URL without the
//!    mark folds every change row it sees, as before.
//! 4. A page's rank state in its shard's row (`h:`, see [`crate::rank`]), its `k:` row
//!    holding the rank shown. The upgrade copies each `k:` row's rank and pushes (`<x> <a>`)
//!    into the shards, the rank shown being the rank; a perc of layout 3 would read a `k:`
//!    row as a page's whole state.
//! 5. A word to resolve out-sets may name a list of URLs in one row (`rank:resolves`); a
//!    perc of layout 4 would leave such rows untaken. Nothing moves.

use std::collections::BTreeMap;

use bytes::Bytes;
use perc_txn::Client;

use crate::model::{self, col, rows};
use crate::rank::shard::{Entry, Shards, Slot, SHARDS_A_TXN};
use crate::IndexError;

/// The layout this perc reads and writes.
pub const LAYOUT: u64 = 5;

/// Rows moved per transaction.
const BATCH: usize = 100;

/// What [`upgrade`] did: the layout it found, and the URLs it moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Upgraded {
    pub from: u64,
    pub moved: usize,
}

/// Upgrades the store to [`LAYOUT`] (a new store is marked as of it). `Err` for a store of a
/// later layout.
pub async fn upgrade(client: &Client) -> Result<Upgraded, IndexError> {
    let found = layout(client).await?;
    if found > LAYOUT {
        return Err(IndexError::Layout { found, reads: LAYOUT });
    }
    let mut done = Upgraded { from: found, moved: 0 };
    if found == LAYOUT {
        return Ok(done);
    }
    if found < 2 {
        done.moved = move_to_fetch_rows(client, WANTS).await?;
        move_to_fetch_rows(client, STATES).await?;
    }
    if found < 4 {
        ranks_to_shards(client).await?;
    }
    client
        .retrying(|c| async move {
            let mut t = c.begin().await?;
            t.set(
                Bytes::from_static(model::CONFIG_ROW),
                Bytes::from_static(col::LAYOUT),
                LAYOUT.to_string(),
            );
            t.commit().await
        })
        .await?;
    Ok(done)
}

/// The store's layout: its `crawl:layout`; for a store without one, 1 if a page row holds
/// a want (only layout 1 writes one there), else [`LAYOUT`] (a new store, or one with
/// nothing to move). The look reads no other column, so it never waits on the locks of a
/// loader that died mid-commit (those are for the commands that read what they lock).
async fn layout(client: &Client) -> Result<u64, IndexError> {
    let t = client.begin().await?;
    if let Some(raw) = t.get(model::CONFIG_ROW, col::LAYOUT).await? {
        let text = String::from_utf8_lossy(&raw);
        return text.trim().parse().map_err(|e| IndexError::corrupt("crawl:layout of m:config", e));
    }
    let wants = t.scan_first(rows::PAGES.start(), rows::PAGES.end(), col::WANT, 1).await?;
    Ok(if wants.is_empty() { LAYOUT } else { 1 })
}

/// A column that moves from the page rows to the fetch rows, and the observer it notifies,
/// if any: that observer's ack moves with it.
#[derive(Clone, Copy)]
struct Move {
    column: &'static [u8],
    observed_by: Option<&'static str>,
}

/// The frontier's wants, which notify fetch.
const WANTS: Move = Move { column: col::WANT, observed_by: Some("fetch") };
/// The fetch's recrawl state, which notifies nobody.
const STATES: Move = Move { column: col::FETCH_STATE, observed_by: None };

/// Moves a column of every page row that has it to the URL's fetch row (layout 2), a batch
/// per transaction, each batch read from where the last one ended. Returns how many moved.
///
/// A want written to the fetch row notifies fetch there. For a URL whose want its page row's
/// fetch had already served (the page row's ack at or after the want's commit), a second
/// transaction writes the fetch ack at the fetch row, after the move's commit, so that the
/// notification finds nothing new: the upgrade does not fetch every URL again. (Cut short
/// between the two, a batch's URLs are fetched once more: harmless.)
async fn move_to_fetch_rows(client: &Client, m: Move) -> Result<usize, IndexError> {
    let mut from = Bytes::from_static(rows::PAGES.start());
    let mut moved = 0;
    loop {
        let (n, last, served) = client.retrying(|c| move_batch(c, from.clone(), m)).await?;
        if let (false, Some(observer)) = (served.is_empty(), m.observed_by) {
            client
                .retrying(|c| {
                    let served = &served;
                    async move {
                        let mut t = c.begin().await?;
                        for row in served {
                            perc_notify::record_run(&mut t, row, observer);
                        }
                        t.commit().await
                    }
                })
                .await?;
        }
        moved += n;
        match last {
            Some(row) if n == BATCH => from = Bytes::from([row.as_ref(), b"\0"].concat()),
            _ => return Ok(moved),
        }
    }
}

/// One batch of [`move_to_fetch_rows`], from the page row `from` on: how many rows it moved,
/// the last of them, and the fetch rows of the wants already served.
async fn move_batch(
    c: Client,
    from: Bytes,
    m: Move,
) -> Result<(usize, Option<Bytes>, Vec<Bytes>), IndexError> {
    let column = m.column;
    let ack = m.observed_by.map(perc_notify::ack_column);
    let mut t = c.begin().await?;
    let batch = t.scan_first(&from, rows::PAGES.end(), column, BATCH).await?;
    let mut served = Vec::new();
    for (row, value) in &batch {
        let Some(url) = model::url_of(row) else { continue };
        let fetch = model::fetch_row(url);
        // A fetch row written since (by a discovery, a seed) is newer.
        if t.get(&fetch, column).await?.is_none() {
            if let Some(ack) = &ack {
                let cells = [(row.clone(), ack.clone()), (row.clone(), Bytes::from_static(column))];
                let versions = t.versions(&cells).await?;
                let acked = versions[0]
                    .as_ref()
                    .and_then(|v| v.value.as_deref())
                    .and_then(|v| Some(u64::from_be_bytes(v.try_into().ok()?)));
                let wanted = versions[1].as_ref().map(|v| v.commit_ts.0);
                if acked.zip(wanted).is_some_and(|(acked, wanted)| acked >= wanted) {
                    served.push(fetch.clone());
                }
            }
            t.set(fetch, Bytes::from_static(column), value.clone());
        }
        t.delete(row.clone(), Bytes::from_static(column));
        if let Some(ack) = &ack {
            t.delete(row.clone(), ack.clone());
        }
    }
    t.commit().await?;
    Ok((batch.len(), batch.last().map(|(row, _)| row.clone()), served))
}

/// Copies the rank of every `k:` row of layout 3 (`<x> <a>`) into its shard (layout 4) where
/// the shard holds none for it: done again, the same. A `k:` row holding a rank alone is of
/// layout 4 already.
async fn ranks_to_shards(client: &Client) -> Result<(), IndexError> {
    let ranked =
        client.begin().await?.scan(rows::RANKS.start(), rows::RANKS.end(), col::RANK).await?;
    let mut by_shard: BTreeMap<Bytes, Vec<(Slot, Entry)>> = BTreeMap::new();
    for (row, raw) in ranked {
        let Some(url) = rows::RANKS.key_of(&row) else { continue };
        let text = std::str::from_utf8(&raw).ok();
        let Some((x, a)) = text.and_then(|t| t.split_once(' ')) else { continue };
        let pair = (x.parse::<f64>().ok(), a.parse::<f64>().ok());
        let (Some(x), Some(a)) = pair else {
            return Err(IndexError::corrupt(format!("rank:rank of {url}"), raw.escape_ascii()));
        };
        let slot = Slot::of(url);
        by_shard.entry(slot.row().clone()).or_default().push((slot, Entry { x, a, shown: x }));
    }
    let shards: Vec<Vec<(Slot, Entry)>> = by_shard.into_values().collect();
    for chunk in shards.chunks(SHARDS_A_TXN) {
        client
            .retrying(|c| async move {
                let mut t = c.begin().await?;
                let mut shards = Shards::default();
                shards.load(&t, chunk.iter().flatten().map(|(slot, _)| slot)).await?;
                for (slot, entry) in chunk.iter().flatten() {
                    if shards.get(slot) == Entry::default() {
                        shards.set(slot, *entry);
                    }
                }
                shards.write(&mut t);
                crate::rank::hold_every_mark(&mut t).await?;
                t.commit().await.map_err(IndexError::from)
            })
            .await?;
    }
    Ok(())
}
