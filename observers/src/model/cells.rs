//! Reading and writing cells through a transaction: counters, JSON records, writes that
//! happen only on change, child-row scans, registrations, the export's inlink join, and the
//! near-duplicate list. A stored value that cannot be read is an [`IndexError::Corrupt`]
//! naming its row and column.

use bytes::Bytes;
use perc_txn::{Transaction, TxnError};
use serde::de::DeserializeOwned;
use serde::Serialize;

use perc_crawl::simhash::{distance, NEAR_BITS_MAX};

use std::collections::BTreeMap;
use std::collections::BTreeSet;

use super::records::{ExportLine, Inlink, Meta, PageKind, NEAR_LISTED_MAX};
use super::schema::{child_key, children, cluster_head, col, page, rank_row, rows, BlockEntry};
use crate::IndexError;

/// A counter cell's value (a decimal integer; absent: 0).
pub fn count_of(raw: Option<Bytes>) -> Result<i64, IndexError> {
    match raw {
        None => Ok(0),
        Some(v) => std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok()).ok_or_else(|| {
            IndexError::corrupt("a counter cell", format!("{} is not an integer", v.escape_ascii()))
        }),
    }
}

/// The keys of the child rows `<prefix><key>\0<child>` that have `column`: the `<child>`s.
pub async fn child_keys(
    txn: &Transaction,
    kind: &'static rows::Prefix,
    key: &str,
    column: &[u8],
) -> Result<Vec<String>, TxnError> {
    let (start, end) = children(kind, key);
    Ok(child_keys_of(txn.scan(&start, &end, column).await?.iter().map(|(row, _)| row)))
}

/// The child keys of every row of `kind` under each of `keys` with `column` set, in one
/// call for them all.
pub async fn child_keys_under(
    txn: &Transaction,
    kind: &'static rows::Prefix,
    keys: &[&str],
    column: &[u8],
) -> Result<Vec<String>, TxnError> {
    let spans: Vec<(Vec<u8>, Vec<u8>)> = keys.iter().map(|k| children(kind, k)).collect();
    let ranges: Vec<(&[u8], &[u8])> = spans.iter().map(|(s, e)| (&s[..], &e[..])).collect();
    let found = txn.scan_ranges(&ranges, column).await?;
    Ok(found.iter().flat_map(|rows| child_keys_of(rows.iter().map(|(row, _)| row))).collect())
}

/// The child keys of the child rows `rows` (see [`child_key`]).
pub fn child_keys_of<'a>(rows: impl IntoIterator<Item = &'a Bytes>) -> Vec<String> {
    rows.into_iter().filter_map(|r| child_key(r).map(str::to_string)).collect()
}

/// Every edge whose target is one of `names`, sorted by (from, to): a prefix scan of the
/// `e:` rows per name, all in one call.
pub async fn inlinks(txn: &Transaction, names: &[String]) -> Result<Vec<Inlink>, TxnError> {
    let spans: Vec<(Vec<u8>, Vec<u8>)> = names.iter().map(|n| children(&rows::EDGES, n)).collect();
    let ranges: Vec<(&[u8], &[u8])> = spans.iter().map(|(s, e)| (&s[..], &e[..])).collect();
    let mut out = Vec::new();
    for (name, edges) in names.iter().zip(txn.scan_ranges(&ranges, col::EDGE).await?) {
        for (edge_row, anchor) in edges {
            let Some(source) = child_key(&edge_row) else { continue };
            out.push(Inlink {
                from: source.to_string(),
                to: name.clone(),
                anchor: String::from_utf8_lossy(&anchor).into_owned(),
            });
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The cells a line's join reads ([`full_line`]): the page's `fwd:names` and, for the
/// canonical's line, its cluster's `near:list`.
pub fn join_keys(line: &ExportLine) -> [(Bytes, Bytes); 3] {
    let near = if line.canonical == line.url {
        (cluster_head(&line.content_hash), Bytes::from_static(col::NEAR_LIST))
    } else {
        // A cell nobody writes: a line that is not its cluster's canonical lists none.
        (page(&line.url), Bytes::from_static(col::NEAR_LIST))
    };
    [
        (page(&line.url), Bytes::from_static(col::FWD_NAMES)),
        near,
        (rank_row(&line.url), Bytes::from_static(col::RANK)),
    ]
}

/// The cells `columns` of each of `rows`, row by row: the keys of one batched read.
pub fn cells_of(
    rows: impl IntoIterator<Item = Bytes>,
    columns: &[&'static [u8]],
) -> Vec<(Bytes, Bytes)> {
    rows.into_iter()
        .flat_map(|row| columns.iter().map(move |c| (row.clone(), Bytes::from_static(c))))
        .collect()
}

/// A page's `rank:rank`: its rank as shown (see [`crate::rank`]), a decimal as Rust writes
/// an f64 (which reads back exactly). A store of layout 3 wrote what its sources pushed it
/// after it: read, and left.
pub fn rank_of(raw: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(raw).ok()?;
    let x = text.split_once(' ').map_or(text, |(x, _)| x).parse::<f64>().ok()?;
    x.is_finite().then_some(x)
}

/// The text of a page's `rank:rank` ([`rank_of`]).
pub fn rank_text(x: f64) -> Bytes {
    Bytes::from(x.to_string())
}

/// A page's export line with its inlinks and near-duplicates joined in (spec §7): the
/// stored line holds neither; the canonical page's inlinks are the edges into its
/// `fwd:names`, its near-duplicates its cluster's `near:list`. `joined` holds the cells of
/// [`join_keys`].
pub async fn full_line(
    txn: &Transaction,
    mut line: ExportLine,
    joined: [Option<Bytes>; 3],
) -> Result<ExportLine, IndexError> {
    let [fwd_names, near, rank] = joined;
    if let Some(raw) = rank {
        let x = rank_of(&raw).ok_or_else(|| {
            IndexError::corrupt(format!("rank:rank of {}", line.url), raw.escape_ascii())
        })?;
        // Six decimals: far inside the bound the ranks are kept within (spec §6.4b).
        line.pagerank = (x * 1e6).round() / 1e6;
    }
    if let Some(raw) = near {
        line.near_duplicates = serde_json::from_slice(&raw)
            .map_err(|e| IndexError::corrupt(format!("near:list of {}", line.url), e))?;
    }
    if let Some(raw) = fwd_names {
        let names: Vec<String> = serde_json::from_slice(&raw)
            .map_err(|e| IndexError::corrupt(format!("fwd:names of {}", line.url), e))?;
        line.inlinks = inlinks(txn, &names).await?;
    }
    Ok(line)
}

/// The union of several pages' `indeg:names` values (absent ones skipped), sorted: the names
/// whose inlinks a cluster's canonical carries.
pub fn names_union<'a>(
    raws: impl IntoIterator<Item = &'a Bytes>,
) -> Result<Vec<String>, IndexError> {
    let mut all: Vec<String> = Vec::new();
    for raw in raws {
        let part: Vec<String> = serde_json::from_slice(raw)
            .map_err(|e| IndexError::corrupt(String::from_utf8_lossy(col::NAMES), e))?;
        all.extend(part);
    }
    all.sort();
    all.dedup();
    Ok(all)
}

pub async fn get_json<T: DeserializeOwned>(
    txn: &Transaction,
    row: &[u8],
    column: &[u8],
) -> Result<Option<T>, IndexError> {
    match txn.get(row, column).await? {
        None => Ok(None),
        Some(raw) => serde_json::from_slice(&raw)
            .map(Some)
            .map_err(|e| IndexError::corrupt(format!("{}/{}", raw_show(row), raw_show(column)), e)),
    }
}

fn raw_show(b: &[u8]) -> String {
    b.escape_ascii().to_string()
}

/// Writes `value` unless the cell already holds exactly it; returns whether it wrote.
pub async fn set_if_changed(
    txn: &mut Transaction,
    row: &Bytes,
    column: &'static [u8],
    value: Bytes,
) -> Result<bool, TxnError> {
    if txn.get(row, column).await?.as_ref() == Some(&value) {
        return Ok(false);
    }
    txn.set(row.clone(), Bytes::from_static(column), value);
    Ok(true)
}

pub async fn set_json_if_changed<T: Serialize>(
    txn: &mut Transaction,
    row: &Bytes,
    column: &'static [u8],
    value: &T,
) -> Result<bool, TxnError> {
    set_if_changed(txn, row, column, Bytes::from(serde_json::to_vec(value).expect("serializable")))
        .await
}

/// Deletes the cell unless it is already absent; returns whether it deleted.
pub async fn delete_if_present(
    txn: &mut Transaction,
    row: &Bytes,
    column: &'static [u8],
) -> Result<bool, TxnError> {
    if txn.get(row, column).await?.is_none() {
        return Ok(false);
    }
    txn.delete(row.clone(), Bytes::from_static(column));
    Ok(true)
}

/// A page's registration under a key that another row range is organised by: dedup
/// registers a page under its content hash (`c:<hash>\0<url>`), alias a redirect under its
/// target (`r:<target>\0<source>`).
pub struct Registration {
    /// The page's column holding the key it should be registered under ("" for none).
    pub key: &'static [u8],
    /// The page's column remembering the key it is registered under.
    pub registered: &'static [u8],
    /// The registration row for (key, url), and its column.
    pub child: fn(&str, &str) -> Bytes,
    pub child_column: &'static [u8],
    /// The registration row's value: a function of the key (a member row holds its body's
    /// simhash), so that it is written only when the registration moves.
    pub value: Bytes,
}

/// Moves the page's registration from the key it has to the key it should have; returns the
/// move if there was one (the caller tells whom the keys concern). Nothing happens when they
/// are the same, so running it twice is harmless.
///
/// The registration rows are written unchecked (`Transaction::set_unchecked`): their key
/// holds the page's URL, so only the page's own runs write them, and each of those writes the
/// page's `registered` cell, checked, where two of them conflict. One batched prewrite then
/// takes them, rather than a conditional mutation each.
pub async fn reregister(
    txn: &mut Transaction,
    row: &Bytes,
    url: &str,
    r: &Registration,
) -> Result<Option<Moved>, TxnError> {
    let key = txn.get(row, r.key).await?.unwrap_or_default();
    let registered = txn.get(row, r.registered).await?.unwrap_or_default();
    if key == registered {
        return Ok(None);
    }
    let text = |k: &Bytes| String::from_utf8_lossy(k).into_owned();
    let moved = Moved { from: text(&registered), to: text(&key) };
    for (k, add) in [(&moved.from, false), (&moved.to, true)] {
        if k.is_empty() {
            continue;
        }
        let child = (r.child)(k, url);
        if add {
            txn.set_unchecked(child, Bytes::from_static(r.child_column), r.value.clone());
        } else {
            txn.delete_unchecked(child, Bytes::from_static(r.child_column));
        }
    }
    txn.set(row.clone(), Bytes::from_static(r.registered), key);
    Ok(Some(moved))
}

/// A registration that [`reregister`] moved: from the key it had to the key it has now
/// (either "" for none).
pub struct Moved {
    pub from: String,
    pub to: String,
}

/// Adds to `near` the entries of `cell` that are other clusters within 3 bits of `me`, once.
pub fn add_near(near: &mut Vec<BlockEntry>, me: &BlockEntry, cell: &[BlockEntry]) {
    for e in cell {
        if e.hash != me.hash
            && distance(e.simhash, me.simhash) <= NEAR_BITS_MAX
            && !near.iter().any(|n| n.hash == e.hash)
        {
            near.push(e.clone());
        }
    }
}

/// Writes the head's `near:list` for the clusters `near` (their canonicals, sorted, the
/// smallest [`NEAR_LISTED_MAX`]) if it is not what `current` holds; removes it when empty.
pub fn write_near_list(
    txn: &mut Transaction,
    head: &Bytes,
    current: Option<&Bytes>,
    near: &[BlockEntry],
) -> Result<(), IndexError> {
    let mut names: Vec<&str> = near.iter().map(|e| e.canonical.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names.truncate(NEAR_LISTED_MAX);
    let listed: Vec<String> = match current {
        Some(raw) => serde_json::from_slice(raw).map_err(|e| {
            IndexError::corrupt(format!("near:list of {}", String::from_utf8_lossy(head)), e)
        })?,
        None => Vec::new(),
    };
    if listed != names {
        if names.is_empty() {
            txn.delete(head.clone(), Bytes::from_static(col::NEAR_LIST));
        } else {
            let value = serde_json::to_vec(&names).expect("serializable");
            txn.set(head.clone(), Bytes::from_static(col::NEAR_LIST), value);
        }
    }
    Ok(())
}

/// For each URL, the page of the export its inlinks count for: itself if it is a page, the
/// end of its redirect chain if it is an alias whose end is a page (as the in-degree counts
/// them), else none. Two reads of the store for them all.
pub async fn pages_counted_for<'u>(
    t: &Transaction,
    urls: BTreeSet<&'u str>,
) -> Result<BTreeMap<&'u str, Option<String>>, IndexError> {
    let keys: Vec<(Bytes, Bytes)> = urls
        .iter()
        .flat_map(|u| {
            let row = page(u);
            [(row.clone(), Bytes::from_static(col::META)), (row, Bytes::from_static(col::ALIAS_OF))]
        })
        .collect();
    let cells = t.get_many(&keys).await?;
    let is_page = |meta: &Option<Bytes>| -> Result<bool, IndexError> {
        let Some(raw) = meta else { return Ok(false) };
        let meta: Meta =
            serde_json::from_slice(raw).map_err(|e| IndexError::corrupt("page:meta", e))?;
        Ok(meta.kind == PageKind::Page)
    };
    let mut found = BTreeMap::new();
    let mut ends = BTreeMap::new();
    for (url, pair) in urls.into_iter().zip(cells.chunks(2)) {
        if is_page(&pair[0])? {
            found.insert(url, Some(url.to_string()));
        } else {
            let end = pair[1].as_ref().map(|e| String::from_utf8_lossy(e).into_owned());
            found.insert(url, None);
            if let Some(end) = end.filter(|e| !e.is_empty()) {
                ends.insert(url, end);
            }
        }
    }
    let end_keys: Vec<(Bytes, Bytes)> =
        ends.values().map(|e| (page(e), Bytes::from_static(col::META))).collect();
    let end_metas = t.get_many(&end_keys).await?;
    for ((url, end), meta) in ends.into_iter().zip(end_metas) {
        if is_page(&meta)? {
            found.insert(url, Some(end));
        }
    }
    Ok(found)
}
