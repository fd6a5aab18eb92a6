//! The search queue: which pages a search index must look at again (docs/serve.md,
//! "Search"). It is Fluo Recipes' ExportQueue: the stages that change what a page's search
//! document holds write a queue row in their own transaction; an indexer takes a batch of
//! rows (of one bucket or more) in a transaction T, reads the documents they name in T's
//! snapshot, applies them to its index, and deletes the rows in T. A change committed after
//! T's snapshot wrote a row of its own, which T never read and so does not delete: it is
//! taken next time. A crash between the index's commit and T's re-applies the rows, which
//! is idempotent. The index is never ahead of a committed transaction, and catches up after
//! any crash by draining the queue.
//!
//! - Written by: parse (a page parsed: its body is the record the indexer reads), export (a
//!   page's line written or removed), indegree (edges into a URL came
//!   or went), invert (the anchor of an edge that stays changed) and forward (a canonical's
//!   `fwd:names`, whose inlinks its document carries), as unchecked writes of an empty value
//!   to `q:<bucket>\0<url>\0<start_ts>` (`search:queued`; a row of its own for each
//!   writing transaction: see [`queue_row`]). The URL is the one whose facts changed; the
//!   indexer looks at it and at the page whose document shows them (its canonical, or its
//!   redirect chain's end's).
//! - Bounded when no index drains it (`perc crawl` and `perc replay` keep none, nor does a
//!   `perc serve` with search off): [`trim`] empties a queue that holds more than a bound
//!   and counts a new generation of it (`search:generation` of the config row). An index
//!   records the generation it was built in; one of an older generation missed the rows
//!   trimmed, and is built again from the pages (what a new index does anyway).
//! - A document: one per canonical page that is not noindex: its URL, title, the anchors of
//!   the inlinks its export line carries, its main text and language, and its in-degree.

use bytes::Bytes;
use perc_txn::{RangeScan, Transaction};

use crate::model::{self, col, rows, ExportLine};
use crate::IndexError;

/// Queue rows are spread over this many buckets (a byte of the URL's blake3), so that an
/// indexer's transaction reads and deletes a bounded share of them, and indexers of
/// different processes can take different buckets.
pub const BUCKETS: usize = 256;

/// The queue row of `url` written by the transaction that started at `start_ts`: unique
/// to it. An indexer deletes the rows it read; a row written meanwhile is another row, so
/// no write is lost, with no conflict check on either side (one row a URL, overwritten
/// unchecked, could be deleted by an indexer that read it before the overwrite).
pub fn queue_row(url: &str, start_ts: u64) -> Bytes {
    Bytes::from(format!("{}{:02x}\0{url}\0{start_ts:016x}", rows::QUEUE.prefix(), bucket_of(url)))
}

/// The URL a queue row names.
fn queued_url(row: &[u8]) -> Option<&str> {
    let key = model::child_key(row)?;
    Some(key.rsplit_once('\0').map_or(key, |(url, _)| url))
}

fn bucket_of(url: &str) -> u8 {
    blake3::hash(url.as_bytes()).as_bytes()[0]
}

/// The range of a bucket's rows; of all of them for `None`.
pub fn bucket_range(bucket: Option<u8>) -> (Vec<u8>, Vec<u8>) {
    match bucket {
        Some(b) => {
            let q = rows::QUEUE.prefix();
            (format!("{q}{b:02x}\0").into_bytes(), format!("{q}{b:02x}\u{1}").into_bytes())
        }
        None => (rows::QUEUE.start().to_vec(), rows::QUEUE.end().to_vec()),
    }
}

/// Queues `url` for the search index, in `txn`.
pub fn queue(txn: &mut Transaction, url: &str) {
    let row = queue_row(url, txn.start_ts().0);
    txn.set_unchecked(row, Bytes::from_static(col::SEARCH_QUEUED), Bytes::new());
}

/// A page as a search index holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchDoc {
    pub url: String,
    pub title: String,
    /// The anchor texts of its inlinks (its cluster's, forwarded), in the export's order.
    pub anchors: Vec<String>,
    /// Its main text ([`perc_crawl::text`]).
    pub body: String,
    /// Its main text's language, as its export line says.
    pub lang: Option<String>,
    pub in_degree: u64,
    /// Its PageRank when the document was made: the indexer is told again when the rank
    /// leaves its band ([`band`]).
    pub pagerank: f64,
}

/// What the index multiplies a document's text score (BM25) by: 1 + PR / (PR + 1), PageRank
/// saturated as Lucene's `FeatureField` and Elasticsearch's `rank_feature` saturate a
/// static feature, with the pivot at 1, the mean rank of the un-normalised form. A page
/// nothing links to (0.15) gets 1.13, an average page 1.5, the most linked pages of a site
/// nearly 2, and no page more: rank orders pages whose words match alike, and cannot lift a
/// page over one whose text scores twice its own. (A logarithm of the rank, unbounded, let
/// a site's home page outrank the page a query was about.)
pub fn importance(pagerank: f64) -> f64 {
    let pr = pagerank.max(0.0);
    1.0 + pr / (pr + 1.0)
}

/// The band of a rank, as the index sees it: ranks in one band have an [`importance`]
/// within 0.01 of each other (a score within 1%), and a page's document is made again when
/// its rank leaves its band. A URL with no rank has a band of its own.
pub fn band(pagerank: f64) -> i64 {
    if pagerank <= 0.0 {
        return i64::MIN;
    }
    (importance(pagerank) / 0.01).floor() as i64
}

/// What the index must do for one URL.
#[derive(Clone, Debug, PartialEq)]
pub enum Queued {
    /// The URL's document is this (added, or replacing the one it had).
    Index(SearchDoc),
    /// The URL has no document (not a page, not canonical, noindex, gone).
    Remove(String),
}

/// The first bucket at or after `from` that holds queue rows, in `txn`'s snapshot.
pub async fn next_bucket(txn: &Transaction, from: u8) -> Result<Option<u8>, IndexError> {
    let (start, _) = bucket_range(Some(from));
    let (_, end) = bucket_range(None);
    let first = txn.scan_first(&start, &end, col::SEARCH_QUEUED, 1).await?;
    Ok(first.first().and_then(|(row, _)| {
        let hex = std::str::from_utf8(row.get(2..4)?).ok()?;
        u8::from_str_radix(hex, 16).ok()
    }))
}

/// Takes up to `max` rows of `bucket`: deletes them in `txn` (the caller commits it after
/// its index has what this returns) and returns how many rows it took, and what the index
/// must do for the URLs they name and the pages whose documents show their facts, each URL
/// once. A row committed before `built_at` (the snapshot an index was just built at, which
/// holds its change) is taken without being looked at.
pub async fn take(
    txn: &mut Transaction,
    bucket: u8,
    max: usize,
    built_at: Option<u64>,
) -> Result<(usize, Vec<Queued>), IndexError> {
    let (start, end) = bucket_range(Some(bucket));
    let found = txn
        .scan_each_found(&[RangeScan::new(&start, &end, col::SEARCH_QUEUED).first(max)])
        .await?
        .pop()
        .unwrap_or_default();
    let taken = found.len();
    let mut urls: Vec<String> = Vec::new();
    for f in found {
        let url = queued_url(&f.row)
            .ok_or_else(|| IndexError::corrupt("a search queue row", f.row.escape_ascii()))?
            .to_string();
        txn.delete(f.row, Bytes::from_static(col::SEARCH_QUEUED));
        if built_at.is_none_or(|at| f.commit_ts.0 >= at) {
            urls.push(url);
        }
    }
    let mut looked = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    let mut todo = urls;
    while let Some(url) = todo.pop() {
        if !looked.insert(url.clone()) {
            continue;
        }
        let row = model::page(&url);
        let line = model::get_json::<ExportLine>(txn, &row, col::EXPORT_LINE).await?;
        match line {
            Some(line) if line.canonical != url => {
                todo.push(line.canonical);
                out.push(Queued::Remove(url));
            }
            Some(line) if line.noindex => out.push(Queued::Remove(url)),
            Some(line) => out.push(Queued::Index(document(txn, line).await?)),
            None => {
                // An alias: its inlinks are its chain's end's.
                if let Some(end) = txn.get(&row, col::ALIAS_OF).await?.filter(|e| !e.is_empty()) {
                    todo.push(String::from_utf8_lossy(&end).into_owned());
                }
                out.push(Queued::Remove(url));
            }
        }
    }
    Ok((taken, out))
}

/// The document of a canonical page, from its line, the inlinks joined to it and its body.
async fn document(txn: &Transaction, line: ExportLine) -> Result<SearchDoc, IndexError> {
    let row = model::page(&line.url);
    let joined = txn.get_many(&model::join_keys(&line)).await?;
    let cells = [joined[0].clone(), joined[1].clone(), joined[2].clone()];
    let line = model::full_line(txn, line, cells).await?;
    let body = match (txn.get(&row, col::RAW).await?, url::Url::parse(&line.url)) {
        (Some(raw), Ok(url)) => {
            let (head, body) = model::decode_raw(&raw)
                .map_err(|e| IndexError::corrupt(format!("crawl:raw of {}", line.url), e))?;
            perc_crawl::parse::main_text(&url, &body, head.charset.as_deref())
        }
        _ => String::new(),
    };
    Ok(SearchDoc {
        anchors: line.inlinks.into_iter().map(|i| i.anchor).filter(|a| !a.is_empty()).collect(),
        url: line.url,
        title: line.title,
        body,
        lang: line.lang,
        in_degree: line.in_degree,
        pagerank: line.pagerank,
    })
}

/// Every document of the index, in URL order, at `txn`'s snapshot: what an index built from
/// nothing holds (before it drains the queue rows written after this snapshot).
pub async fn all_documents<E: From<IndexError>>(
    txn: &Transaction,
    mut each: impl FnMut(SearchDoc) -> Result<(), E>,
) -> Result<(), E> {
    for (row, v) in txn
        .scan(rows::PAGES.start(), rows::PAGES.end(), col::EXPORT_LINE)
        .await
        .map_err(IndexError::from)?
    {
        let line: ExportLine = serde_json::from_slice(&v).map_err(|e| {
            IndexError::corrupt(format!("export:line of {}", row.escape_ascii()), e)
        })?;
        if line.canonical == line.url && !line.noindex {
            each(document(txn, line).await?)?;
        }
    }
    Ok(())
}

/// Drains the whole queue into `apply`, up to `max` rows a transaction, taken bucket after
/// bucket: `apply` makes its index hold what the rows ask for durably, then they are
/// deleted. A conflict (another indexer taking the same rows) takes them again, and `apply`
/// gets them again (it must be idempotent). Rows committed before `built_at` are deleted
/// without being applied (see [`take`]): an index built at that snapshot drains only the
/// changes since. `apply`'s error leaves the rows queued and is returned inside; the outer
/// error is the store's. Returns the URLs applied.
pub async fn drain<E>(
    client: &perc_txn::Client,
    max: usize,
    built_at: Option<u64>,
    mut apply: impl FnMut(&[Queued]) -> Result<(), E>,
) -> Result<Result<usize, E>, IndexError> {
    let mut applied = 0;
    let mut from = Some(0);
    while let Some(bucket) = from {
        match drain_some(client, bucket, max.max(1), built_at, &mut apply).await? {
            Ok((next, n)) => {
                applied += n;
                from = next;
            }
            Err(e) => return Ok(Err(e)),
        }
    }
    Ok(Ok(applied))
}

/// One transaction of [`drain`]: up to `max` rows of the buckets from `from` on, in one
/// call of `apply`; the bucket to go on from (none when the queue was empty as of its
/// snapshot: rows written since are the next drain's) and the URLs applied.
async fn drain_some<E>(
    client: &perc_txn::Client,
    from: u8,
    max: usize,
    built_at: Option<u64>,
    apply: &mut impl FnMut(&[Queued]) -> Result<(), E>,
) -> Result<Result<(Option<u8>, usize), E>, IndexError> {
    // Each attempt's future borrows `apply` for as long as it runs, one attempt at a time.
    let apply = &std::sync::Mutex::new(apply);
    client
        .retrying(|c| async move {
            let mut t = c.begin().await?;
            let (mut rows, mut queued) = (0, Vec::new());
            let mut next = next_bucket(&t, from).await?;
            while let Some(bucket) = next {
                let room = max - rows;
                let (n, q) = take(&mut t, bucket, room, built_at).await?;
                rows += n;
                queued.extend(q);
                if n == room {
                    // The bucket may hold more: the next transaction goes on from it.
                    break;
                }
                next = match bucket.checked_add(1) {
                    Some(b) => next_bucket(&t, b).await?,
                    None => None,
                };
            }
            if rows == 0 {
                return Ok(Ok((None, 0)));
            }
            if !queued.is_empty() {
                if let Err(e) = (apply.lock().unwrap_or_else(|p| p.into_inner()))(&queued) {
                    return Ok(Err(e));
                }
            }
            t.commit().await?;
            Ok::<_, IndexError>(Ok((next, queued.len())))
        })
        .await
}

/// Whether no queue row waits: an index that drained the queue holds every change
/// committed before.
pub async fn caught_up(client: &perc_txn::Client) -> Result<bool, IndexError> {
    Ok(first_bucket(client, 0).await?.is_none())
}

/// The first bucket at or after `from` that holds queue rows now.
async fn first_bucket(client: &perc_txn::Client, from: u8) -> Result<Option<u8>, IndexError> {
    let t = client.begin().await?;
    next_bucket(&t, from).await
}

/// What [`each_document`] read: how many documents, the queue's generation then (an index
/// built from them is of that generation) and the snapshot's timestamp (the queue rows
/// committed before it hold no change the documents lack: see [`drain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Documents {
    pub count: usize,
    pub generation: u64,
    pub at: u64,
}

/// Every document, at one snapshot (see [`all_documents`]).
pub async fn each_document<E: From<IndexError>>(
    client: &perc_txn::Client,
    mut each: impl FnMut(SearchDoc) -> Result<(), E>,
) -> Result<Documents, E> {
    let t = client.begin().await.map_err(IndexError::from)?;
    let generation = read_generation(&t).await?;
    let mut count = 0;
    all_documents(&t, |d| {
        count += 1;
        each(d)
    })
    .await?;
    Ok(Documents { count, generation, at: t.start_ts().0 })
}

/// The queue's generation now: how many times [`trim`] emptied it.
pub async fn generation(client: &perc_txn::Client) -> Result<u64, IndexError> {
    read_generation(&client.begin().await?).await
}

async fn read_generation(t: &Transaction) -> Result<u64, IndexError> {
    let row = Bytes::from_static(model::CONFIG_ROW);
    match t.get(&row, col::SEARCH_GENERATION).await? {
        None => Ok(0),
        Some(v) => std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| IndexError::corrupt("the search queue's generation", v.escape_ascii())),
    }
}

/// Queue rows deleted in one transaction of [`trim`].
const TRIM_BATCH: usize = 1_000;

/// Empties the queue if it holds more than `keep_max` rows: nothing drains it, or not fast
/// enough to be worth keeping. The generation is counted first, in a transaction of its
/// own: an index that drains meanwhile or later sees a generation newer than its own and
/// is built again, so the rows deleted here are never needed. Returns the rows deleted
/// (0: the queue was within the bound, and is left as it is).
pub async fn trim(client: &perc_txn::Client, keep_max: usize) -> Result<usize, IndexError> {
    let (start, end) = bucket_range(None);
    let t = client.begin().await?;
    let counted = t.scan_first(&start, &end, col::SEARCH_QUEUED, keep_max + 1).await?.len();
    drop(t);
    if counted <= keep_max {
        return Ok(0);
    }
    client
        .retrying(|c| async move {
            let mut t = c.begin().await?;
            let next = read_generation(&t).await? + 1;
            let row = Bytes::from_static(model::CONFIG_ROW);
            t.set(row, Bytes::from_static(col::SEARCH_GENERATION), next.to_string());
            t.commit().await?;
            Ok::<_, IndexError>(())
        })
        .await?;
    let mut deleted = 0;
    loop {
        let n = client
            .retrying(|c| {
                let (start, end) = (&start, &end);
                async move {
                    let mut t = c.begin().await?;
                    let rows = t.scan_first(start, end, col::SEARCH_QUEUED, TRIM_BATCH).await?;
                    let n = rows.len();
                    for (row, _) in rows {
                        t.delete(row, Bytes::from_static(col::SEARCH_QUEUED));
                    }
                    t.commit().await?;
                    Ok::<_, IndexError>(n)
                }
            })
            .await?;
        deleted += n;
        // Rows queued since the count are the next trim's.
        if n < TRIM_BATCH || deleted >= counted {
            return Ok(deleted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn importance_grows_with_the_rank_and_stays_under_two() {
        assert!((importance(0.15) - 1.130_434_8).abs() < 1e-6, "a page nothing links to");
        assert_eq!(importance(1.0), 1.5, "an average page");
        let ranks = [0.0, 0.15, 0.5, 1.0, 3.0, 10.0, 100.0, 1e6];
        for pair in ranks.windows(2) {
            assert!(importance(pair[0]) < importance(pair[1]), "{pair:?}");
        }
        assert!(importance(1e12) < 2.0);
        // A band is a hundredth of the factor; no rank shares the band of no rank.
        assert!(band(0.0) < band(1e-9));
        assert_eq!(band(2.0), band(2.02), "1.6667 and 1.6689");
        assert_ne!(band(0.5), band(0.6));
    }
}
