//! near: near-duplicate clusters (SPEC §6.4a), kept current through a band index.
//!
//! - Trigger: `near:dirty` of `c:<hash>` (weak: set by cluster when the cluster's canonical
//!   or its band rows change, and by the near runs of its near-duplicates when theirs did).
//! - Reads: the head's `near:registered` (its simhash while it is in the index, see
//!   [`crate::cluster`]), `near:published`, `near:told` and `near:list`; the `s:` rows of the
//!   four bands of its simhash, in one scan call (clusters within 3 bits share a 16-bit
//!   block: one band at least); and the near ones' `cluster:canonical`, in one read.
//! - Writes: `near:list`, the canonical URLs of the clusters within 3 bits, sorted, the 20
//!   smallest (removed when there are none; readers join it into the canonical's line, see
//!   [`crate::model::full_line`]); `near:told` = the `near:published` it told (only when
//!   there was someone to tell: a lone cluster's run writes nothing).
//! - Notifies: when `near:published` is not what it last told (cluster changed the canonical
//!   or the band rows since), the `near:dirty` of every cluster within 3 bits (weakly):
//!   their lists may name this one's canonical, or miss it.
//! - Why nothing is missed: whatever a neighbour Y saw of this cluster X (its band rows and
//!   canonical) was committed by one of X's cluster runs, which also wrote a new
//!   `near:published`. When X changes again, its near run starts after that change
//!   committed; if Y's list was read before it, Y's band rows were committed before that
//!   too (Y's cluster run precedes Y's near run), so X's run finds Y and tells it. A change
//!   that no near run saw still changed `near:published`, so it is told, never lost. And Y's
//!   run that comes after X's change reads X as it is.
//! - Twice is harmless: the list is a function of the current rows, written only when it
//!   differs; neighbours are told only when what they were told changed.

use async_trait::async_trait;
use bytes::Bytes;
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use perc_crawl::simhash::{distance, NEAR_BITS_MAX};

use crate::model::{self, col, NEAR_LISTED_MAX};
use crate::IndexError;

pub struct Near;

#[async_trait]
impl Observer for Near {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        let Some(hash) = row.strip_prefix(b"c:").and_then(|h| std::str::from_utf8(h).ok()) else {
            return Ok(());
        };
        let hash = hash.to_string();
        let keys = [col::NEAR_REGISTERED, col::NEAR_PUBLISHED, col::NEAR_TOLD, col::NEAR_LIST]
            .map(|c| (row.clone(), Bytes::from_static(c)));
        let [registered, published, told, list] =
            <[Option<Bytes>; 4]>::try_from(txn.get_many(&keys).await?).expect("four cells");
        let simhash = registered.as_deref().and_then(model::parse_simhash);
        // A cluster's simhash is its body's: the same whenever it is registered.
        let tell = published.is_some() && published != told;
        let published_simhash = published
            .as_deref()
            .and_then(|p| p.rsplit(|b| *b == b' ').next())
            .and_then(model::parse_simhash);
        let Some(around) = simhash.or(published_simhash) else { return Ok(()) };
        let near = neighbours(txn, &hash, around).await?;
        // The list: the canonicals of the clusters near it, if it is in the index.
        let mut names: Vec<String> = Vec::new();
        if simhash.is_some() {
            let keys: Vec<(Bytes, Bytes)> = near
                .iter()
                .map(|h| (model::cluster_head(h), Bytes::from_static(col::CLUSTER_CANONICAL)))
                .collect();
            names = txn
                .get_many(&keys)
                .await?
                .into_iter()
                .flatten()
                .map(|c| String::from_utf8_lossy(&c).into_owned())
                .collect();
            names.sort();
            names.dedup();
            names.truncate(NEAR_LISTED_MAX);
        }
        let listed: Vec<String> = match &list {
            Some(raw) => serde_json::from_slice(raw)
                .map_err(|e| IndexError::corrupt(format!("near:list of c:{hash}"), e))?,
            None => Vec::new(),
        };
        if listed != names {
            if names.is_empty() {
                txn.delete(row.clone(), Bytes::from_static(col::NEAR_LIST));
            } else {
                let value = serde_json::to_vec(&names).expect("serializable");
                txn.set(row.clone(), Bytes::from_static(col::NEAR_LIST), value);
            }
        }
        // With nobody near, there is nobody to tell, and nothing is written: telling again
        // later is harmless, and a lone cluster's run (most of them) commits nothing.
        if tell && !near.is_empty() {
            for h in &near {
                txn.notify(model::cluster_head(h), Bytes::from_static(col::NEAR_DIRTY));
            }
            let value = published.expect("tell implies published");
            txn.set(row.clone(), Bytes::from_static(col::NEAR_TOLD), value);
        }
        Ok(())
    }
}

/// The clusters other than `hash` within 3 bits of `simhash`: the band rows of its four
/// blocks, in one scan call.
async fn neighbours(
    txn: &Transaction,
    hash: &str,
    simhash: u64,
) -> Result<Vec<String>, ObserverError> {
    let prefixes: Vec<(Vec<u8>, Vec<u8>)> = (0..4)
        .map(|b| {
            let start = model::band_prefix(simhash, b).into_bytes();
            let mut end = start.clone();
            *end.last_mut().expect("a prefix ends in \\0") = 1;
            (start, end)
        })
        .collect();
    let ranges: Vec<(&[u8], &[u8])> = prefixes.iter().map(|(s, e)| (&s[..], &e[..])).collect();
    let mut out: Vec<String> = Vec::new();
    for (band_row, value) in txn.scan_ranges(&ranges, col::BAND).await?.into_iter().flatten() {
        let (Some(other), Some(theirs)) =
            (model::child_key(&band_row), model::parse_simhash(&value))
        else {
            continue;
        };
        if other != hash
            && distance(simhash, theirs) <= NEAR_BITS_MAX
            && !out.iter().any(|h| h == other)
        {
            out.push(other.to_string());
        }
    }
    Ok(out)
}
