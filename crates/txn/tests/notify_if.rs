//! Conditional weak notifications (`Transaction::notify_if_written`): set at commit only if
//! a probe column of the row has a committed write or a lock, whenever it was written.

mod common;

use std::sync::Arc;

use perc_store::{Scan, Store};
use perc_txn::CommitStep;

const PROBES: &[&[u8]] = &[b"meta", b"alias"];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// The rows that have a notify cell of column "dirty".
async fn notified(store: &Arc<dyn Store>) -> Vec<String> {
    let scan = Scan::whole("notify", usize::MAX);
    let mut rows: Vec<String> = store
        .scan(&scan)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.qualifier.as_ref() == b"dirty")
        .map(|c| String::from_utf8(c.row.to_vec()).unwrap())
        .collect();
    rows.dedup();
    rows
}

#[test]
fn a_conditional_notification_is_set_where_a_probe_was_ever_written_or_is_locked() {
    rt().block_on(async {
        let (counted, c) = common::counted_client().await;
        let store: Arc<dyn Store> = counted.clone();

        // "committed": a probe written and committed before the notifying transaction began.
        let mut t = c.begin().await.unwrap();
        t.set("committed", "meta", "page");
        t.commit().await.unwrap();
        let mut notifier = c.begin().await.unwrap();
        // "later": a probe (the second one) committed after the notifier began.
        let mut t = c.begin().await.unwrap();
        t.set("later", "alias", "x");
        t.commit().await.unwrap();
        // "locked": a probe prewritten by a transaction that has not committed.
        let mut t = c.begin().await.unwrap();
        t.set("locked", "meta", "page");
        t.commit_crashing_at(CommitStep::AfterPrewriteAll).await.unwrap();
        // "other": a column that is not a probe; "blank": nothing at all.
        let mut t = c.begin().await.unwrap();
        t.set("other", "text", "hello");
        t.commit().await.unwrap();

        notifier.set("source", "links", "five");
        for row in ["blank", "committed", "later", "locked", "other"] {
            notifier.notify_if_written(row, "dirty", PROBES);
        }
        // One also notified unconditionally: set, and not probed.
        notifier.notify_if_written("told", "dirty", PROBES);
        notifier.notify("told", "dirty");
        let before = counted.counts();
        notifier.commit().await.unwrap().unwrap();
        let after = counted.counts();
        assert_eq!(notified(&store).await, ["committed", "later", "locked", "told"]);
        // The probes of every row in one read.
        assert_eq!((after.read_rows - before.read_rows, after.read_row - before.read_row), (1, 0));

        // A transaction with no write has no commit timestamp to look by: it sets them all.
        let mut t = c.begin().await.unwrap();
        t.notify_if_written("blank", "dirty", PROBES);
        assert!(!t.is_empty());
        t.commit().await.unwrap();
        assert_eq!(notified(&store).await, ["blank", "committed", "later", "locked", "told"]);
    });
}
