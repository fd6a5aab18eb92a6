//! settle: a bulk load's ranks at once, from a power iteration over the graph it left, and
//! the switch that defers the rank runs while the load runs.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use perc_txn::RangeScan;

use super::shard::{Entry, Whole, SHARDS_A_TXN};
use super::{
    hold_every_mark, hold_mark, out_of, shown, tell_cluster, Out, DAMPING, TAKEN, TELEPORT,
};
use crate::model::{self, col, rows};
use crate::search;
use crate::IndexError;

/// A rank within this share of the settled one is left as it is by [`settle`].
const SETTLED: f64 = 1e-9;

/// Pages [`settle`] writes a transaction.
const SETTLE_CHUNK: usize = 256;

/// Defers the rank runs of the whole store until [`settle`]: a crawl's or a replay's pages
/// are ranked once, at its end, instead of by ~35 rounds of pushes from nothing.
pub async fn defer(client: &perc_txn::Client) -> Result<(), perc_txn::TxnError> {
    client
        .retrying(|c| async move {
            let mut t = c.begin().await?;
            t.set(
                Bytes::from_static(model::CONFIG_ROW),
                Bytes::from_static(col::RANK_DEFERRED),
                Bytes::from_static(b"1"),
            );
            t.commit().await
        })
        .await
        .map(drop)
}

/// Whether the rank runs are deferred ([`defer`]): a bulk load not settled yet.
pub async fn deferred(client: &perc_txn::Client) -> Result<bool, perc_txn::TxnError> {
    let t = client.begin().await?;
    Ok(t.get(model::CONFIG_ROW, col::RANK_DEFERRED).await?.is_some())
}

/// Sets every page's rank from a power iteration over the graph at one snapshot, and what
/// its sources push it (A) as the sum of their weights then, and resumes the runs. Push
/// rows and words to resolve committed before the graph was read are taken with it (deleted
/// by [`clear_settled`], and the bucket's mark moves past them: A holds their effect); the
/// words written since are folded by the next run, which finds every residual within ε (or
/// absorbs what changed since). A URL with rank cells that is no page of the snapshot has
/// no rank and pushes nothing. Returns the pages set.
pub async fn settle(client: &perc_txn::Client) -> Result<usize, IndexError> {
    // Every row committed before this is in the graph read below.
    let mark = client.begin().await?.start_ts().0;
    let mut pages: Vec<String> = Vec::new();
    crate::query::export_each(client, |l| {
        pages.push(l.url);
        Ok::<_, IndexError>(())
    })
    .await?;
    let index: BTreeMap<&str, usize> =
        pages.iter().enumerate().map(|(i, u)| (u.as_str(), i)).collect();
    let mut out: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); pages.len()];
    crate::query::links_each(client, |l| {
        if let (Some(&from), Some(to)) =
            (index.get(l.from.as_str()), l.target.as_deref().and_then(|t| index.get(t)))
        {
            if from != *to {
                out[from].insert(*to);
            }
        }
        Ok::<_, IndexError>(())
    })
    .await?;
    let x = power_iteration(&out);
    let mut a = vec![0.0f64; pages.len()];
    for (q, targets) in out.iter().enumerate() {
        for &t in targets {
            a[t] += DAMPING * x[q] / targets.len() as f64;
        }
    }
    // The ranks to write: every page's, and none for a URL ranked before that is no page now.
    let mut rows: Vec<(String, f64, f64, Out)> = pages
        .iter()
        .enumerate()
        .map(|(q, url)| {
            let targets = out[q].iter().map(|&t| pages[t].clone()).collect();
            (url.clone(), x[q], a[q], Out { targets })
        })
        .collect();
    let ranked =
        client.begin().await?.scan(rows::RANKS.start(), rows::RANKS.end(), col::RANK).await?;
    for (row, _) in ranked {
        if let Some(url) = rows::RANKS.key_of(&row).filter(|u| !index.contains_key(u)) {
            rows.push((url.to_string(), 0.0, 0.0, Out::default()));
        }
    }
    let mut whole = Whole::default();
    for chunk in rows.chunks(SETTLE_CHUNK) {
        let shown = client.retrying(|c| async move { write_settled(&c, chunk).await }).await??;
        for ((url, x, a, _), shown) in chunk.iter().zip(shown) {
            whole.insert(url, Entry { x: *x, a: *a, shown });
        }
    }
    let shards = whole.rows();
    for chunk in shards.chunks(SHARDS_A_TXN) {
        let whole = &whole;
        client
            .retrying(|c| async move {
                let mut t = c.begin().await?;
                whole.write(&mut t, chunk);
                hold_every_mark(&mut t).await?;
                t.commit().await
            })
            .await?;
    }
    clear_settled(client, mark).await?;
    // Resumed: the buckets' marks moved past the pushes the ranks hold, and every bucket runs.
    client
        .retrying(|c| async move {
            let mut t = c.begin().await?;
            t.delete(Bytes::from_static(model::CONFIG_ROW), Bytes::from_static(col::RANK_DEFERRED));
            for b in 0..model::RANK_BUCKETS {
                let head = model::rank_head(b);
                let before = t.get(&head, col::RANK_FOLDED).await?;
                let before = before.and_then(|m| std::str::from_utf8(&m).ok()?.parse::<u64>().ok());
                let moved = before.unwrap_or(0).max(mark);
                t.set(
                    head.clone(),
                    Bytes::from_static(col::RANK_FOLDED),
                    Bytes::from(moved.to_string()),
                );
                t.notify(head, Bytes::from_static(col::RANK_DIRTY));
            }
            t.commit().await
        })
        .await?;
    Ok(pages.len())
}

/// Rows [`clear_settled`] deletes a transaction.
const CLEAR_CHUNK: usize = 4096;

/// Deletes every push row and word to resolve committed before `mark` (the settled ranks
/// hold what they say), in one pass over each bucket's rows and column, a chunk a
/// transaction. Left to the runs, a load's rows (a word for each edge a source made:
/// ~21 a page on the synthetic web) would be taken [`super::FOLD_MAX`] a run, each run walking
/// every row left: at 100k pages, two million rows and a hundred runs.
async fn clear_settled(client: &perc_txn::Client, mark: u64) -> Result<(), IndexError> {
    for b in 0..model::RANK_BUCKETS {
        let (start, end) = model::children(&rows::PUSHES, &format!("{b:02x}"));
        for column in TAKEN {
            let mut from = Some(start.clone());
            while let Some(at) = from {
                let (at, end) = (&at, &end);
                from = client
                    .retrying(|c| async move { clear_chunk(&c, b, (at, end), column, mark).await })
                    .await?;
            }
        }
    }
    Ok(())
}

/// One transaction of [`clear_settled`]: deletes the rows of `bucket` with `column` in
/// `range`, [`CLEAR_CHUNK`] at most, committed before `mark`; returns where the next
/// chunk starts, if the range may hold more.
async fn clear_chunk(
    c: &perc_txn::Client,
    bucket: u8,
    (from, end): (&[u8], &[u8]),
    column: &'static [u8],
    mark: u64,
) -> Result<Option<Vec<u8>>, perc_txn::TxnError> {
    let mut t = c.begin().await?;
    let found = t
        .scan_each_found(&[RangeScan::new(from, end, column).first(CLEAR_CHUNK)])
        .await?
        .pop()
        .unwrap_or_default();
    let next = (found.len() >= CLEAR_CHUNK)
        .then(|| found.last().map(|f| [&f.row[..], b"\0"].concat()))
        .flatten();
    for f in found.into_iter().filter(|f| f.commit_ts.0 < mark) {
        t.delete_at_commit(f.row, column);
    }
    // A transaction with a write applies its deletes.
    hold_mark(&mut t, bucket).await?;
    t.commit().await?;
    Ok(next)
}

/// PageRank by power iteration over `out` (each page's targets), to a change below 1e-12.
fn power_iteration(out: &[BTreeSet<usize>]) -> Vec<f64> {
    let mut x = vec![1.0f64; out.len()];
    for _ in 0..1000 {
        let mut next = vec![TELEPORT; out.len()];
        for (q, targets) in out.iter().enumerate() {
            if !targets.is_empty() {
                let w = DAMPING * x[q] / targets.len() as f64;
                for &t in targets {
                    next[t] += w;
                }
            }
        }
        let moved = x.iter().zip(&next).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        x = next;
        if moved < 1e-12 {
            break;
        }
    }
    x
}

/// Writes the settled cells of the `k:` rows of `chunk` (URL, x, A, out-set) that differ
/// from the stored ones, in one transaction; returns each page's shown rank after it.
async fn write_settled(
    c: &perc_txn::Client,
    chunk: &[(String, f64, f64, Out)],
) -> Result<Result<Vec<f64>, IndexError>, perc_txn::TxnError> {
    let mut t = c.begin().await?;
    let keys = model::cells_of(
        chunk.iter().map(|(url, ..)| model::rank_row(url)),
        &[col::RANK, col::RANK_OUT, col::RANK_CLUSTER],
    );
    let cells = t.get_many(&keys).await?;
    let mut buckets = BTreeSet::new();
    let mut shown = Vec::with_capacity(chunk.len());
    for ((url, x, _, out), cells) in chunk.iter().zip(cells.chunks(3)) {
        let before = match shown_and_out(url, &cells[0], &cells[1]) {
            Ok(before) => before,
            Err(e) => return Ok(Err(e)),
        };
        let close = |v: f64, w: f64| (v - w).abs() <= SETTLED * v.abs().max(1.0);
        if *out == before.1 && close(*x, before.0) {
            // Settled already (a load that changed little): left as it is.
            shown.push(before.0);
            continue;
        }
        shown.push(*x);
        let row = model::rank_row(url);
        t.set_unchecked(row.clone(), Bytes::from_static(col::RANK), model::rank_text(*x));
        if search::band(*x) != search::band(before.0) {
            search::queue(&mut t, url);
        }
        tell_cluster(&mut t, &cells[2], !close(*x, before.0));
        let raw = serde_json::to_vec(out).expect("serializes");
        t.set_unchecked(row, Bytes::from_static(col::RANK_OUT), raw);
        buckets.insert(model::rank_bucket(url));
    }
    // The cells are written unchecked, as a run writes them.
    for b in buckets {
        hold_mark(&mut t, b).await?;
    }
    t.commit().await.map(|_| Ok(shown))
}

fn shown_and_out(
    url: &str,
    rank: &Option<Bytes>,
    out: &Option<Bytes>,
) -> Result<(f64, Out), IndexError> {
    Ok((shown(url, rank)?, out_of(url, out)?))
}
