//! Beside the scanners: the heartbeat (liveness, the low watermark, samples of the time)
//! and the collector of old versions, which takes a bounded share of the time.

use std::sync::Arc;

use perc_txn::gc;

use super::Shared;

pub(super) async fn heartbeat(shared: Arc<Shared>) {
    let client = shared.engine.client().clone();
    let every = (client.config().liveness_ttl_ms / 3).max(1);
    while !shared.stop.is_cancelled() {
        if let Err(e) = client.heartbeat().await {
            shared.engine.note(&e);
            if shared.engine.fatal().is_none() {
                tracing::warn!(error = %e, "heartbeat failed");
            }
        }
        if let Err(e) = shared.engine.note_time().await {
            tracing::debug!(error = %e, "cannot sample the time of a timestamp");
        }
        tokio::select! {
            _ = shared.stop.cancelled() => {}
            _ = client.clock().sleep_ms(every) => {}
        }
    }
}

/// The collector's share of the time: a pass starts at most every `gc_interval_ms`, and
/// waits after a pass at least this many times as long as the pass took, so that on a big
/// store (a pass over 100k pages takes half a minute) collecting never takes more than a
/// tenth of the time.
const GC_SHARE: u32 = 10;

/// The wait before the next collection pass, after one that took `took_ms`: what is left of
/// `every_ms`, but at least `(GC_SHARE - 1) × took_ms`.
fn gc_wait_ms(every_ms: u64, took_ms: u64) -> u64 {
    every_ms.saturating_sub(took_ms).max(took_ms.saturating_mul(u64::from(GC_SHARE - 1)))
}

/// How often the prompt collection ([`gc::collect_deleted`]) runs between passes.
const PROMPT_MS: u64 = 1_000;

/// Collects old versions in passes over the store. Often enough that a row rewritten every
/// few seconds (a page recrawled at a high rate) carries few old versions each time it is
/// rewritten: the versions are bytes every rewrite writes again into sled's log (at ~400
/// refetches a second the log grew 30-70 MiB a minute collected every minute, ~10 MiB a
/// minute collected every 10 s). Between passes, every second, the rows this worker's
/// commits emptied are collected as soon as no reader can see them: on a big store a pass
/// comes minutes apart, and the change rows a bulk load writes and takes would otherwise stay
/// until then (each a key that sled keeps a record of in memory).
pub(super) async fn collector(shared: Arc<Shared>) {
    let engine = shared.engine.clone();
    let client = engine.client();
    let clock = client.clock().clone();
    let every = engine.config().gc_interval_ms;
    let mut next_pass = clock.now_ms().saturating_add(every);
    while !shared.stop.is_cancelled() {
        let wait = next_pass.saturating_sub(clock.now_ms()).min(PROMPT_MS.min(every));
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            _ = clock.sleep_ms(wait) => {}
        }
        let started = clock.now_ms();
        let full = started >= next_pass;
        let done = if full {
            gc::collect(client, engine.config().scan_batch).await
        } else {
            gc::collect_deleted(client, engine.config().scan_batch).await
        };
        match done {
            Ok(r) => tracing::debug!(?r, full, "garbage collection"),
            Err(e) => {
                engine.note(&e);
                tracing::warn!(error = %e, "garbage collection failed");
            }
        }
        if full {
            let ended = clock.now_ms();
            next_pass = ended.saturating_add(gc_wait_ms(every, ended.saturating_sub(started)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_collector_takes_at_most_a_tenth_of_the_time() {
        // A quick pass: the next starts `every` after this one started.
        assert_eq!(gc_wait_ms(10_000, 300), 9_700);
        // A pass of 30 s (a big store): nine times as long before the next.
        assert_eq!(gc_wait_ms(10_000, 30_000), 270_000);
        assert_eq!(gc_wait_ms(10_000, 1_000), 9_000);
        assert_eq!(gc_wait_ms(10_000, 2_000), 18_000);
        assert_eq!(gc_wait_ms(u64::MAX, u64::MAX), u64::MAX);
    }
}
