//! Unchecked writes (`Transaction::set_unchecked`): their rows are prewritten in one batched
//! call instead of one conditional mutation each, they commit and read like any write, and
//! conflicts are still found, at the checked cell every writer shares. (Crashes at each
//! commit step with unchecked rows: tests/failpoints.rs.)

mod common;

use bytes::Bytes;
use perc_txn::TxnError;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn unchecked_rows_share_one_prewrite_call_and_read_back() {
    rt().block_on(async {
        let (counted, c) = common::counted_client().await;
        for unchecked in [false, true] {
            let mut t = c.begin().await.unwrap();
            t.set("page", "links", "20 of them");
            for i in 0..20 {
                let row = format!("edge{i:02}-{unchecked}");
                if unchecked {
                    t.set_unchecked(row, "anchor", format!("a{i}"));
                } else {
                    t.set(row, "anchor", format!("a{i}"));
                }
            }
            let before = counted.counts();
            t.commit().await.unwrap().unwrap();
            let after = counted.counts();
            let conditional = after.check_and_mutate - before.check_and_mutate;
            let batched = after.mutate_rows - before.mutate_rows;
            if unchecked {
                // The primary's prewrite and commit; one batch of prewrites, one of commits.
                assert_eq!((conditional, batched), (2, 2), "unchecked");
            } else {
                assert_eq!((conditional, batched), (22, 1), "checked");
            }
        }
        let t = c.begin().await.unwrap();
        for i in 0..20 {
            let v = t.get(format!("edge{i:02}-true").as_bytes(), b"anchor").await.unwrap();
            assert_eq!(v, Some(Bytes::from(format!("a{i}"))));
        }
        // A delete, unchecked, is a delete.
        let mut t = c.begin().await.unwrap();
        t.set("page", "links", "none");
        t.delete_unchecked("edge03-true", "anchor");
        t.commit().await.unwrap();
        let t = c.begin().await.unwrap();
        assert_eq!(t.get(b"edge03-true", b"anchor").await.unwrap(), None);
        assert!(t.get(b"edge04-true", b"anchor").await.unwrap().is_some());
    });
}

#[test]
fn writers_of_an_unchecked_cell_conflict_at_their_shared_checked_cell() {
    rt().block_on(async {
        let (_, c) = common::counted_client().await;
        let mut first = c.begin().await.unwrap();
        let mut second = c.begin().await.unwrap();
        for (t, v) in [(&mut first, "1"), (&mut second, "2")] {
            t.set("page", "links", v);
            t.set_unchecked("edge", "anchor", v);
        }
        first.commit().await.unwrap();
        let err = second.commit().await.unwrap_err();
        assert!(err.is_retryable(), "a conflict, not {err}");
        let t = c.begin().await.unwrap();
        // All of the first, none of the second: the second's unchecked row was rolled back.
        assert_eq!(t.get(b"edge", b"anchor").await.unwrap(), Some(Bytes::from("1")));
        assert_eq!(t.get(b"page", b"links").await.unwrap(), Some(Bytes::from("1")));
    });
}

#[test]
fn a_cell_written_checked_stays_checked() {
    rt().block_on(async {
        let (_, c) = common::counted_client().await;
        let mut late = c.begin().await.unwrap();
        let mut early = c.begin().await.unwrap();
        early.set("x", "c", "early");
        early.commit().await.unwrap();
        // Checked first, unchecked after: still checked, so the write-write conflict with
        // `early` is found at this very cell.
        late.set("x", "c", "late");
        late.set_unchecked("x", "c", "later");
        late.set("y", "c", "late");
        match late.commit().await {
            Err(e @ TxnError::WriteConflict { .. }) => assert!(e.is_retryable()),
            other => panic!("want a write conflict at x/c, got {other:?}"),
        }
    });
}
