//! Read batching and the transaction's read cache: cells read together cost one store call,
//! one row read per row; a cell read again costs nothing; the cache never hides a lock.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use perc_txn::{Clock, CommitStep, ManualClock, TxnConfig, Version};

fn key(row: &str, column: &str) -> (Bytes, Bytes) {
    (Bytes::copy_from_slice(row.as_bytes()), Bytes::copy_from_slice(column.as_bytes()))
}

#[test]
fn cells_read_together_cost_one_call_and_rereads_are_free() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (counted, c) = common::counted_client().await;
        let mut t = c.begin().await.unwrap();
        t.set("a", "x", "ax");
        t.set("a", "y", "ay");
        t.set("b", "x", "bx");
        t.delete("b", "y");
        let committed = t.commit().await.unwrap().unwrap();

        let mut t = c.begin().await.unwrap();
        let before = counted.counts();
        let got = t
            .versions(&[key("a", "x"), key("a", "y"), key("a", "z"), key("b", "x"), key("a", "x")])
            .await
            .unwrap();
        let after = counted.counts();
        assert_eq!(after.row_ops() - before.row_ops(), 1, "one batched call");
        assert_eq!(after.read_rows - before.read_rows, 1);
        assert_eq!(after.batched_rows - before.batched_rows, 2, "one row read per row");
        let v = |s: &str| {
            Some(Version { commit_ts: committed, value: Some(Bytes::from(s.to_owned())) })
        };
        assert_eq!(got, vec![v("ax"), v("ay"), None, v("bx"), v("ax")]);

        // Read again, singly or together: no store call. Own writes still win.
        let before = counted.counts();
        assert_eq!(t.get(b"a", b"y").await.unwrap(), Some(Bytes::from_static(b"ay")));
        let newest = t.versions(&[key("b", "x")]).await.unwrap().pop().flatten();
        assert_eq!(newest.map(|v| v.commit_ts), Some(committed));
        t.set("a", "x", "mine");
        let got = t.get_many(&[key("a", "x"), key("b", "x"), key("a", "z")]).await.unwrap();
        assert_eq!(got, vec![Some("mine".into()), Some("bx".into()), None]);
        assert_eq!(counted.counts().row_ops(), before.row_ops());
        // A delete is a version with no value.
        let deleted = t.versions(&[key("b", "y")]).await.unwrap();
        assert_eq!(deleted, vec![Some(Version { commit_ts: committed, value: None })]);
        let mut read = t.read_set();
        read.sort();
        assert_eq!(
            read,
            vec![key("a", "x"), key("a", "y"), key("a", "z"), key("b", "x"), key("b", "y")]
        );
    });
}

#[test]
fn a_batched_read_resolves_a_dead_writers_lock_like_a_single_read() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = common::mem_store();
        let oracle = common::oracle(&store).await;
        let manual = Arc::new(ManualClock::new(1_000_000));
        let clock: Arc<dyn Clock> = manual.clone();
        let config = TxnConfig { lock_ttl_ms: 1_000, ..TxnConfig::default() };
        let c = common::client(&store, &oracle, &clock, config.clone()).await;
        let mut t = c.begin().await.unwrap();
        t.set("a", "x", "old");
        t.commit().await.unwrap();
        // A writer of a and b committed its primary, then died before the secondaries.
        let dead = common::client(&store, &oracle, &clock, config).await;
        let mut w = dead.begin().await.unwrap();
        w.set("a", "x", "new");
        w.set("b", "x", "new");
        let ts = match w.commit_crashing_at(CommitStep::AfterCommitPrimary).await.unwrap() {
            perc_txn::Crashed::AfterCommitPoint(ts) => ts,
            other => panic!("expected a commit, got {other:?}"),
        };
        manual.advance_ms(2_000);
        let r = c.begin().await.unwrap();
        let got = r.versions(&[key("a", "x"), key("b", "x")]).await.unwrap();
        let v = Some(Version { commit_ts: ts, value: Some(Bytes::from_static(b"new")) });
        assert_eq!(got, vec![v.clone(), v]);
    });
}
