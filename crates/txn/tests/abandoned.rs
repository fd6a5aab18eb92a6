//! A commit left between its primary's prewrite and its commit point (a panic below it, its
//! future dropped) rolls its primary back, so its locks do not wait out their TTL while their
//! owner lives on.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use perc_store::{Call, Hook, Hooked, Scan, Store};
use perc_txn::TxnConfig;

/// Panics on the first conditional mutation of row `c` once armed: a bug below the commit,
/// in the middle of its secondaries' prewrites (`b`'s is made, `c`'s not).
struct PanicsOnC(AtomicBool);

#[async_trait::async_trait]
impl Hook for PanicsOnC {
    async fn before(&self, call: Call<'_>) {
        if matches!(call, Call::CheckAndMutate(row) if row == b"c")
            && self.0.swap(false, Ordering::SeqCst)
        {
            panic!("a bug below the commit");
        }
    }
}

#[test]
fn a_commit_that_panics_before_its_commit_point_leaves_no_lock_to_wait_out() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (store, oracle, clock) = common::mem_parts().await;
        let hooked: Arc<dyn Store> =
            Arc::new(Hooked::new(store.clone(), PanicsOnC(AtomicBool::new(true))));
        let writer = common::client(&hooked, &oracle, &clock, TxnConfig::default()).await;
        let mut t = writer.begin().await.unwrap();
        for row in ["a", "b", "c"] {
            t.set(row, "x", "first");
        }
        let panicked = tokio::spawn(t.commit()).await;
        assert!(panicked.is_err_and(|e| e.is_panic()));
        let locks = Scan::whole("lock", 10);
        let locked: Vec<Bytes> =
            store.scan(&locks).await.unwrap().into_iter().map(|c| c.row).collect();
        assert!(locked.contains(&Bytes::from_static(b"b")), "b's lock was made: {locked:?}");

        // The writer lives on: its locks are young and its heartbeat fresh (the manual clock
        // moves only while a reader backs off). A reader waits on them only for as long as
        // the primary's rollback takes to run, not the 5 s of the writer's liveness TTL.
        let reader = common::client(&store, &oracle, &clock, TxnConfig::default()).await;
        for row in [b"a", b"b", b"c"] {
            let before = clock.now_ms();
            let r = reader.begin().await.unwrap();
            assert_eq!(r.get(row, b"x").await.unwrap(), None);
            let waited = clock.now_ms() - before;
            assert!(waited < 1_000, "{row:?}: waited {waited} ms on the abandoned commit's lock");
        }
        assert!(store.scan(&locks).await.unwrap().is_empty(), "every lock is cleaned");
        let mut t = reader.begin().await.unwrap();
        t.set("b", "x", "again");
        assert!(t.commit().await.unwrap().is_some());
        let r = reader.begin().await.unwrap();
        assert_eq!(r.get(b"b", b"x").await.unwrap(), Some(Bytes::from_static(b"again")));
    });
}
