//! fetch: the crawl frontier becomes raw pages.
//!
//! - Trigger: `crawl:want` of `f:<url>` (strong), written by the loader, by discover and by
//!   `perc serve`'s scheduler.
//! - Reads: the want (depth, hops) and the fetch state (`crawl:state`), both in `f:<url>`.
//! - Writes: `crawl:raw` of `p:<url>` (status, headers, body; or the reason there is none), through the
//!   [`Source`] it is handed (robots.txt and politeness live there), unless it is what the
//!   last fetch wrote: a refetch answered 304 (it is conditional on the last `ETag` and
//!   `Last-Modified`) or with the same head and body writes no new version and runs no
//!   observer after it. Then the fetch state (when, the validators, the interval: halved
//!   by a change, doubled by none, within the bounds `[recrawl]` gives the URL) in `f:<url>`,
//!   and the URL's row in the due-time index (`n:<next fetch ms>\0<url>`, which `perc
//!   serve`'s scheduler reads). An unchanged refetch writes only these small rows.
//! - Notifies: parse, through `crawl:raw`.
//! - Metrics: `perc_fetches_total{outcome}`, `perc_fetch_bytes_total` (this process's).
//! - A fetch with no answer worth keeping (no response: no connection, a timeout, robots.txt
//!   unreachable; or a 5xx or 429) leaves a stored answer as it is: a page keeps its last
//!   version through an outage, and is asked again after the minimum interval, doubled for
//!   each failure in a row ([`crate::model::Recrawl::retry`]). A URL with no stored answer
//!   is recorded with the reason.
//! - Twice is harmless: it fetches the page again and writes what it got; parse and all after
//!   it change nothing when nothing changed.

use crate::IndexError;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use perc_crawl::{Fetched, Source, Validators};
use perc_notify::{Observer, ObserverError};
use perc_txn::Transaction;

use crate::model::{self, col, FetchState, RawHead, Schedule, Want};

pub struct Fetch {
    pub source: Arc<dyn Source>,
    pub schedule: Schedule,
}

#[async_trait]
impl Observer for Fetch {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        _column: &Bytes,
    ) -> Result<(), ObserverError> {
        // A notification of a page row's want is one a store of the earlier layout held:
        // the upgrade moved its want to the fetch row, and notified that.
        let Some(url) = model::url_of_fetch(row) else { return Ok(()) };
        let Some(want) = model::get_json::<Want>(txn, row, col::WANT).await? else { return Ok(()) };
        let page = model::page(url);
        let url = url::Url::parse(url).map_err(|e| IndexError::BadRow {
            row: url.into(),
            problem: format!("not a URL: {e}"),
        })?;
        let state = model::get_json::<FetchState>(txn, row, col::FETCH_STATE).await?;
        let asked = state.as_ref().map_or_else(Validators::default, |s| Validators {
            etag: s.etag.clone(),
            last_modified: s.last_modified.clone(),
        });
        let mut head = RawHead { depth: want.depth, hops: want.hops, ..RawHead::default() };
        let fetched = self.source.get_if(&url, &asked).await;
        // A 304 answers a conditional request only: validators come from a stored state.
        let not_modified = asked != Validators::default()
            && matches!(&fetched, Fetched::Response(r) if r.status == 304);
        metrics::counter!("perc_fetches_total", "outcome" => outcome(&fetched)).increment(1);
        if let Fetched::Response(r) = &fetched {
            metrics::counter!("perc_fetch_bytes_total").increment(r.body.len() as u64);
        }
        let (body, mut validators, failure) = answer(fetched, &mut head);
        let (written, kept) = keep_or_write(
            txn,
            &page,
            state.as_ref(),
            &want,
            (&head, &body),
            not_modified,
            failure.is_some(),
        )
        .await?;
        let content = match &state {
            Some(s) if kept => s.content.clone(),
            _ => fingerprint(&RawHead { depth: 0, hops: 0, ..head.clone() }, &body),
        };
        // A change of what the server sends; a state of before `content` compares `written`.
        let changed = failure.is_none()
            && state.as_ref().is_none_or(|s| match s.content.is_empty() {
                true => s.written != written,
                false => s.content != content,
            });
        if not_modified || failure.is_some() {
            validators = asked;
        }
        let now = txn.client().clock().now_ms();
        let failures = match &failure {
            Some(_) => state.as_ref().map_or(0, |s| s.failures).saturating_add(1),
            None => 0,
        };
        let (interval_s, next_ms) =
            schedule_next(txn, &self.schedule, &url, state.as_ref(), failures, changed, now);
        let (was_changed, was_unchanged) =
            state.as_ref().map_or((0, 0), |s| (s.changed, s.unchanged));
        let answered = failure.is_none();
        let new_state = FetchState {
            last_ms: now,
            next_ms,
            interval_s,
            etag: validators.etag,
            last_modified: validators.last_modified,
            written,
            content,
            changed: was_changed + u32::from(changed && state.is_some()),
            unchanged: was_unchanged + u32::from(answered && !changed),
            failures,
            failure,
        };
        txn.set(
            row.clone(),
            Bytes::from_static(col::FETCH_STATE),
            serde_json::to_vec(&new_state).expect("serializable"),
        );
        Ok(())
    }

    /// A fetch waits on hosts (and on its turn at a polite one): it runs on permits of its
    /// own, so that the stages after it never wait for a permit a waiting fetch holds.
    fn waits_on_io(&self) -> bool {
        true
    }
}

/// The page's raw cell after a fetch, and whether the stored one was kept. The stored raw
/// stands when the server says nothing changed (`not_modified`), and when a fetch that
/// `failed` finds an answer stored (a page keeps its last version through an outage, and
/// nothing stored is lost); only a new depth or hop count is written into it. Otherwise what was fetched is written, unless it is what the cell holds.
/// Returns the fingerprint of what the cell holds.
async fn keep_or_write(
    txn: &mut Transaction,
    page: &Bytes,
    state: Option<&FetchState>,
    want: &Want,
    (head, body): (&RawHead, &Bytes),
    not_modified: bool,
    failed: bool,
) -> Result<(String, bool), ObserverError> {
    let stored = match (not_modified || failed, state) {
        (true, Some(_)) => match txn.get(page, col::RAW).await? {
            Some(raw) => Some(model::decode_raw(&raw).map_err(|e| {
                let url = model::url_of(page).unwrap_or_default();
                IndexError::corrupt(format!("crawl:raw of {url}"), e)
            })?),
            None => None,
        },
        _ => None,
    };
    let stands = stored.filter(|(old, _)| not_modified || old.status.is_some());
    let kept = stands.is_some();
    let written = match stands {
        Some((mut old, old_body)) => {
            if (old.depth, old.hops) != (want.depth, want.hops) {
                (old.depth, old.hops) = (want.depth, want.hops);
                write_raw(txn, page, &old, &old_body)
            } else {
                state.map(|s| s.written.clone()).unwrap_or_default()
            }
        }
        None if not_modified => write_raw(txn, page, head, body),
        None => {
            let print = fingerprint(head, body);
            if state.is_none_or(|s| s.written != print) {
                txn.set(page.clone(), Bytes::from_static(col::RAW), model::encode_raw(head, body));
            }
            print
        }
    };
    Ok((written, kept))
}

/// What a fetch got, written into `head`: the body, the server's validators, and the
/// failure if it is no answer worth keeping (none this time, or the server failing).
fn answer(fetched: Fetched, head: &mut RawHead) -> (Bytes, Validators, Option<String>) {
    let failure = match &fetched {
        Fetched::Unavailable(why) => Some(why.clone()),
        Fetched::Response(r) if r.status >= 500 || r.status == 429 => {
            Some(format!("HTTP {}", r.status))
        }
        _ => None,
    };
    let mut validators = Validators::default();
    let body = match fetched {
        Fetched::Response(r) => {
            validators = r.validators();
            head.status = Some(r.status);
            head.content_type = r.content_type;
            head.charset = r.charset;
            head.location = r.location.map(|l| l.to_string());
            r.body
        }
        Fetched::Failed(why) | Fetched::Unavailable(why) => {
            head.error = Some(why);
            Bytes::new()
        }
        Fetched::Disallowed => {
            head.error = Some("disallowed by robots.txt".into());
            Bytes::new()
        }
    };
    (body, validators, failure)
}

/// When `url` is fetched next, written into the due index: a failure (the `failures`-th in
/// a row) keeps the interval and asks again sooner; an answer sets the interval by whether
/// the page `changed`. Returns the interval and the due time (ms).
fn schedule_next(
    txn: &mut Transaction,
    schedule: &Schedule,
    url: &url::Url,
    state: Option<&FetchState>,
    failures: u32,
    changed: bool,
    now: u64,
) -> (u64, u64) {
    let recrawl = schedule.for_url(url);
    let (interval_s, wait_s) = match failures {
        0 => {
            let interval_s = recrawl.next(state.map(|s| s.interval_s), changed);
            (interval_s, interval_s)
        }
        _ => {
            let interval_s = state.map_or(recrawl.interval_s, |s| s.interval_s);
            (interval_s, recrawl.retry(interval_s, failures))
        }
    };
    let next_ms = now.saturating_add(wait_s.saturating_mul(1000));
    if let Some(s) = state {
        txn.delete(model::due_row(s.next_ms, url.as_str()), Bytes::from_static(col::DUE));
    }
    txn.set(model::due_row(next_ms, url.as_str()), Bytes::from_static(col::DUE), Bytes::new());
    (interval_s, next_ms)
}

/// A fetch's outcome as the metrics name it: the status class, "not_modified", "failed"
/// (no answer) or "disallowed" (robots.txt).
fn outcome(fetched: &Fetched) -> &'static str {
    match fetched {
        Fetched::Response(r) => match r.status {
            304 => "not_modified",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        },
        Fetched::Failed(_) | Fetched::Unavailable(_) => "failed",
        Fetched::Disallowed => "disallowed",
    }
}

/// blake3 (hex) of a raw head and body: what a fetch would write.
fn fingerprint(head: &RawHead, body: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(&serde_json::to_vec(head).expect("serializable"));
    h.update(b"\n");
    h.update(body);
    h.finalize().to_hex().to_string()
}

/// Writes `crawl:raw`; its fingerprint.
fn write_raw(txn: &mut Transaction, row: &Bytes, head: &RawHead, body: &Bytes) -> String {
    txn.set(row.clone(), Bytes::from_static(col::RAW), model::encode_raw(head, body));
    fingerprint(head, body)
}
