//! The pipeline's data: row keys, column names, and the records stored in them.
//!
//! ```text
//!   row                      columns (transactional)                     written by
//!   p:<url>                  crawl:want   {depth, gen, hops}             loader, discover
//!                            crawl:raw    fetch outcome + body           fetch, replay loader
//!                            page:meta    kind, reason, title, noindex…  parse
//!                            page:links   [[target, anchor]]             parse
//!                            page:follow  {depth, hops, targets}         parse
//!                            page:hash    content hash ("" if no page)   parse
//!                            page:redirect target ("" if none)           parse
//!                            page:canonical                              cluster
//!                            rank:indeg, rank:names (the alias set)      rank
//!                            fwd:names    the names whose inlinks the    forward
//!                                         canonical carries
//!                            export:line  the serving copy (JSON; its    export
//!                                         inlinks are read from the e: rows of fwd:names)
//!                            dedup:registered, invert:done, alias:done   their observers' memory
//!   e:<target>\0<source>     edge:anchor                                 invert
//!   d:<target>\0<source>     rank:delta   +n/-n edges not yet counted,   invert, rank
//!                                         or 0: look at this source      (rank folds them
//!                                         again                          and deletes them)
//!   p:<target>               rank:base    edges into this URL, counted   rank
//!                            rank:extra   sources reaching it only       rank
//!                                         through aliases
//!                            rank:alias_of  an alias: the page its       rank
//!                                         inlinks are counted at
//!                            rank:chain   commit timestamps of the       rank
//!                                         redirects its chain read
//!   x:<page>\0<source>       rank:via     how many of the page's aliases rank (the aliases'
//!                                         the source links to            runs)
//!                            rank:adds    set: the source counts through rank (the page's run)
//!                                         aliases only
//!   a:<page>\0<alias>        rank:alias   the alias's chain ends here    rank (the alias's run)
//!   r:<target>\0<source>     alias:from   (source redirects to target)   alias
//!   c:<hash>                 cluster:canonical, cluster:names (digest    cluster
//!                                         of what forward reads)
//!   c:<hash>\0<url>          cluster:member                              dedup
//!   m:config                 crawl:scope  {seeds, prefixes, limits}      loader
//! ```
//!
//! Inlinks live in rows of their own under the target's prefix, so that a page every page
//! links to is many small rows, not one huge one; readers get them with a prefix scan. No
//! observer copies them into a list: a list on a page every page links to would be rewritten,
//! whole, on every change of any of its inlinks (O(in-degree) per update). The export line
//! holds the page's own fields, and readers join the canonical's inlinks from the `e:` rows
//! of its `fwd:names` ([`inlinks`]). Hot
//! rows (`rank:dirty`, `cluster:dirty`, `fwd:dirty`, `export:dirty`) are only ever notified
//! weakly: many writers, no conflicts.

use bytes::Bytes;
use perc_txn::{Transaction, TxnError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub mod col {
    pub const WANT: &[u8] = b"crawl:want";
    pub const RAW: &[u8] = b"crawl:raw";
    pub const META: &[u8] = b"page:meta";
    pub const LINKS: &[u8] = b"page:links";
    pub const FOLLOW: &[u8] = b"page:follow";
    pub const HASH: &[u8] = b"page:hash";
    pub const REDIRECT: &[u8] = b"page:redirect";
    pub const CANONICAL: &[u8] = b"page:canonical";
    pub const DEDUP_DONE: &[u8] = b"dedup:registered";
    pub const INVERT_DONE: &[u8] = b"invert:done";
    pub const ALIAS_DONE: &[u8] = b"alias:done";
    pub const RANK_DIRTY: &[u8] = b"rank:dirty";
    pub const INDEG: &[u8] = b"rank:indeg";
    pub const NAMES: &[u8] = b"rank:names";
    pub const BASE: &[u8] = b"rank:base";
    pub const EXTRA: &[u8] = b"rank:extra";
    pub const ALIAS_OF: &[u8] = b"rank:alias_of";
    pub const CHAIN: &[u8] = b"rank:chain";
    pub const VIA: &[u8] = b"rank:via";
    pub const ADDS: &[u8] = b"rank:adds";
    pub const ALIAS: &[u8] = b"rank:alias";
    pub const DELTA: &[u8] = b"rank:delta";
    pub const CLUSTER_DIRTY: &[u8] = b"cluster:dirty";
    pub const CLUSTER_CANONICAL: &[u8] = b"cluster:canonical";
    pub const CLUSTER_NAMES: &[u8] = b"cluster:names";
    pub const MEMBER: &[u8] = b"cluster:member";
    pub const EDGE: &[u8] = b"edge:anchor";
    pub const ALIAS_FROM: &[u8] = b"alias:from";
    pub const FWD_DIRTY: &[u8] = b"fwd:dirty";
    pub const FWD_NAMES: &[u8] = b"fwd:names";
    pub const EXPORT_DIRTY: &[u8] = b"export:dirty";
    pub const EXPORT_LINE: &[u8] = b"export:line";
    pub const SCOPE: &[u8] = b"crawl:scope";
}

pub fn page(url: &str) -> Bytes {
    Bytes::from(format!("p:{url}"))
}

/// The URL of a page row.
pub fn url_of(row: &[u8]) -> Option<&str> {
    std::str::from_utf8(row.strip_prefix(b"p:")?).ok()
}

pub fn edge(target: &str, source: &str) -> Bytes {
    Bytes::from(format!("e:{target}\0{source}"))
}

/// The row holding a not yet counted change of the edges from `source` into `target`.
pub fn delta(target: &str, source: &str) -> Bytes {
    Bytes::from(format!("d:{target}\0{source}"))
}

/// The row counting, for the page `end`, its aliases that `source` links to.
pub fn via(end: &str, source: &str) -> Bytes {
    Bytes::from(format!("x:{end}\0{source}"))
}

/// The row saying that `alias` redirects, through any number of hops, to the page `end`.
pub fn alias_at(end: &str, alias: &str) -> Bytes {
    Bytes::from(format!("a:{end}\0{alias}"))
}

/// A counter cell's value (a decimal integer; absent: 0).
pub fn count_of(raw: Option<Bytes>) -> Result<i64, TxnError> {
    match raw {
        None => Ok(0),
        Some(v) => std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| TxnError::Corrupt(format!("counter {:?}", v))),
    }
}

/// The row range `[start, end)` of rows `<prefix><key>\0…`.
pub fn children(prefix: &str, key: &str) -> (Vec<u8>, Vec<u8>) {
    (format!("{prefix}{key}\0").into_bytes(), format!("{prefix}{key}\u{1}").into_bytes())
}

/// The keys of the child rows `<prefix><key>\0<child>` that have `column`: the `<child>`s.
pub async fn child_keys(
    txn: &Transaction,
    prefix: &str,
    key: &str,
    column: &[u8],
) -> Result<Vec<String>, TxnError> {
    let (start, end) = children(prefix, key);
    Ok(txn
        .scan(&start, &end, column)
        .await?
        .into_iter()
        .filter_map(|(r, _)| child_key(&r).map(str::to_string))
        .collect())
}

/// The part of a child row after `<prefix><key>\0`.
pub fn child_key(row: &[u8]) -> Option<&str> {
    let at = row.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&row[at + 1..]).ok()
}

pub fn redirect_in(target: &str, source: &str) -> Bytes {
    Bytes::from(format!("r:{target}\0{source}"))
}

pub fn cluster_head(hash: &str) -> Bytes {
    Bytes::from(format!("c:{hash}"))
}

pub fn member(hash: &str, url: &str) -> Bytes {
    Bytes::from(format!("c:{hash}\0{url}"))
}

pub const CONFIG_ROW: &[u8] = b"m:config";

/// A frontier entry: fetch this URL. `gen` changes when a fetch is asked for again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Want {
    pub depth: u32,
    pub gen: u64,
    /// Redirect hops that led here.
    pub hops: u32,
}

/// What a fetch produced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawHead {
    pub status: Option<u16>,
    pub content_type: Option<String>,
    pub charset: Option<String>,
    pub location: Option<String>,
    /// Why there is no response (unreachable, timeout, too large, robots…).
    pub error: Option<String>,
    pub depth: u32,
    pub hops: u32,
}

/// `crawl:raw` = JSON head, a newline, then the body bytes as received.
pub fn encode_raw(head: &RawHead, body: &[u8]) -> Bytes {
    let mut out = serde_json::to_vec(head).expect("serializable");
    out.push(b'\n');
    out.extend_from_slice(body);
    Bytes::from(out)
}

pub fn decode_raw(raw: &Bytes) -> Result<(RawHead, Bytes), String> {
    let at = raw.iter().position(|b| *b == b'\n').ok_or("raw record without a head")?;
    let head = serde_json::from_slice(&raw[..at]).map_err(|e| format!("raw record head: {e}"))?;
    Ok((head, raw.slice(at + 1..)))
}

/// What the page is, as `perc page` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// "page", "redirect" or "other".
    pub kind: String,
    /// For anything but a page: why not.
    pub reason: String,
    pub status: Option<u16>,
    pub title: String,
    pub noindex: bool,
    pub content_hash: String,
    pub canonical_hint: Option<String>,
    pub refresh: Option<String>,
    pub redirect_to: Option<String>,
    pub encoding: String,
    /// Links left out for their length (SPEC §6.1: longer than the URL limit, or too long
    /// to share a row key with this page's URL).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub long_links_dropped: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Targets for link discovery.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Follow {
    pub depth: u32,
    pub hops: u32,
    /// Links to follow (one hop deeper).
    pub links: Vec<String>,
    /// A redirect's target (same depth, one more hop).
    pub redirect: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Inlink {
    pub from: String,
    pub to: String,
    pub anchor: String,
}

/// One line of the export (SPEC §6.6), fields in the documented order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportLine {
    pub url: String,
    pub canonical: String,
    pub content_hash: String,
    pub title: String,
    pub in_degree: u64,
    pub noindex: bool,
    pub inlinks: Vec<Inlink>,
}

/// Every edge whose target is one of `names`, sorted by (from, to): one prefix scan of the
/// `e:` rows per name.
pub async fn inlinks(txn: &Transaction, names: &[String]) -> Result<Vec<Inlink>, TxnError> {
    let mut out = Vec::new();
    for name in names {
        let (start, end) = children("e:", name);
        for (edge_row, anchor) in txn.scan(&start, &end, col::EDGE).await? {
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

/// A page's export line with its inlinks joined in (SPEC §6.6): the stored line holds none;
/// the canonical page's are the edges into its `fwd:names`.
pub async fn full_line(
    txn: &Transaction,
    mut line: ExportLine,
    fwd_names: Option<Bytes>,
) -> Result<ExportLine, TxnError> {
    if let Some(raw) = fwd_names {
        let names: Vec<String> = serde_json::from_slice(&raw)
            .map_err(|e| TxnError::Corrupt(format!("fwd:names of {}: {e}", line.url)))?;
        line.inlinks = inlinks(txn, &names).await?;
    }
    Ok(line)
}

/// Crawl settings the observers need, stored once per store.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrawlScope {
    pub seeds: Vec<String>,
    pub prefixes: Vec<String>,
    pub max_depth: u32,
    pub max_redirects: u32,
}

/// The union of several pages' `rank:names` values (absent ones skipped), sorted: the names
/// whose inlinks a cluster's canonical carries.
pub fn names_union<'a>(raws: impl IntoIterator<Item = &'a Bytes>) -> Result<Vec<String>, TxnError> {
    let mut all: Vec<String> = Vec::new();
    for raw in raws {
        let part: Vec<String> = serde_json::from_slice(raw)
            .map_err(|e| TxnError::Corrupt(format!("rank:names: {e}")))?;
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
) -> Result<Option<T>, TxnError> {
    match txn.get(row, column).await? {
        None => Ok(None),
        Some(raw) => serde_json::from_slice(&raw)
            .map(Some)
            .map_err(|e| TxnError::Corrupt(format!("{}/{}: {e}", raw_show(row), raw_show(column)))),
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
    /// The row told, weakly, when a key gains or loses the page, and its column (if any).
    pub notify: Option<NotifyKey>,
}

/// A key's row (from the key) and column to notify.
pub type NotifyKey = (fn(&str) -> Bytes, &'static [u8]);

/// Moves the page's registration from the key it has to the key it should have, telling both
/// keys' rows; returns whether it moved. Nothing happens when they are the same, so running it
/// twice is harmless.
pub async fn reregister(
    txn: &mut Transaction,
    row: &Bytes,
    url: &str,
    r: &Registration,
) -> Result<bool, TxnError> {
    let key = txn.get(row, r.key).await?.unwrap_or_default();
    let registered = txn.get(row, r.registered).await?.unwrap_or_default();
    if key == registered {
        return Ok(false);
    }
    for (k, add) in [(registered.clone(), false), (key.clone(), true)] {
        if k.is_empty() {
            continue;
        }
        let k = String::from_utf8_lossy(&k).into_owned();
        let child = (r.child)(&k, url);
        if add {
            txn.set(child, Bytes::from_static(r.child_column), Bytes::new());
        } else {
            txn.delete(child, Bytes::from_static(r.child_column));
        }
        if let Some((notify, column)) = r.notify {
            txn.notify(notify(&k), Bytes::from_static(column));
        }
    }
    txn.set(row.clone(), Bytes::from_static(r.registered), key);
    Ok(true)
}
