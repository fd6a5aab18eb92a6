//! `Transaction::scan`: a snapshot-consistent range read of one column.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use perc_txn::{Clock, CommitStep, ManualClock, RangeScan, TxnConfig};

fn s(v: &[(Bytes, Bytes)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(r, v)| {
            (String::from_utf8(r.to_vec()).unwrap(), String::from_utf8(v.to_vec()).unwrap())
        })
        .collect()
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

async fn range(t: &perc_txn::Transaction) -> Vec<(String, String)> {
    s(&t.scan(b"e/a/", b"e/a0", b"in").await.unwrap())
}

/// Rows `n/0000`.. with `due` and `other` written in three transactions, then `due` deleted
/// from the first `deleted`.
async fn written_thrice(c: &perc_txn::Client, rows: usize, deleted: usize) {
    for round in 0..3 {
        let mut t = c.begin().await.unwrap();
        for i in 0..rows {
            t.set(format!("n/{i:04}"), "due", format!("v{round}"));
            t.set(format!("n/{i:04}"), "other", "x");
        }
        t.commit().await.unwrap();
    }
    let mut t = c.begin().await.unwrap();
    for i in 0..deleted {
        t.delete(format!("n/{i:04}"), "due");
    }
    t.commit().await.unwrap();
}

#[test]
fn scan_sees_its_snapshot_and_own_writes() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store = common::mem_store();
        let oracle = common::oracle(&store).await;
        let manual = Arc::new(ManualClock::new(1_000_000));
        let clock: Arc<dyn Clock> = manual.clone();
        let c = common::client(&store, &oracle, &clock, TxnConfig::default()).await;
        let mut t = c.begin().await.unwrap();
        for (row, v) in [("e/a/1", "one"), ("e/a/2", "two"), ("e/b/1", "other"), ("e/a/3", "three")]
        {
            t.set(row, "in", v);
            t.set(row, "noise", "x");
        }
        t.commit().await.unwrap();
        let old = c.begin().await.unwrap();
        let mut t = c.begin().await.unwrap();
        t.delete("e/a/2", "in");
        t.set("e/a/4", "in", "four");
        t.commit().await.unwrap();

        assert_eq!(
            range(&old).await,
            pairs(&[("e/a/1", "one"), ("e/a/2", "two"), ("e/a/3", "three")])
        );
        let mut now = c.begin().await.unwrap();
        assert_eq!(
            range(&now).await,
            pairs(&[("e/a/1", "one"), ("e/a/3", "three"), ("e/a/4", "four")])
        );
        now.set("e/a/0", "in", "zero");
        now.delete("e/a/3", "in");
        assert_eq!(
            range(&now).await,
            pairs(&[("e/a/0", "zero"), ("e/a/1", "one"), ("e/a/4", "four")])
        );
        assert_eq!(s(&now.scan(b"", b"", b"in").await.unwrap()).len(), 4);

        // A crashed writer's lock inside the range is resolved, as a get would.
        let dead = common::client(&store, &oracle, &clock, TxnConfig::default()).await;
        let mut t = dead.begin().await.unwrap();
        t.set("e/a/5", "in", "five");
        t.set("e/a/1", "in", "uno");
        t.commit_crashing_at(CommitStep::AfterCommitPrimary).await.unwrap();
        dead.deregister().await.unwrap();
        let later = c.begin().await.unwrap();
        assert_eq!(
            range(&later).await,
            pairs(&[("e/a/1", "uno"), ("e/a/3", "three"), ("e/a/4", "four"), ("e/a/5", "five")])
        );
    });
}

#[test]
fn scan_first_is_the_head_of_scan_whatever_the_versions_and_deletes_before_it() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (store, oracle, clock) = common::mem_parts().await;
        let c = common::client(&store, &oracle, &clock, TxnConfig::default()).await;
        // 300 rows, each written three times; the first 200 then deleted (their write
        // records stay until GC), and a few more rewritten by the reader itself.
        written_thrice(&c, 300, 200).await;
        let mut t = c.begin().await.unwrap();
        t.set("n/0100", "due", "mine");
        t.delete("n/0201", "due");
        let all = t.scan(b"n/", b"n0", b"due").await.unwrap();
        assert_eq!(all.len(), 100);
        for rows in [0, 1, 2, 7, 64, 99, 100, 500] {
            let first = t.scan_first(b"n/", b"n0", b"due", rows).await.unwrap();
            assert_eq!(s(&first), s(&all[..rows.min(all.len())]), "{rows} rows");
        }
    });
}

#[test]
fn a_scan_read_in_pieces_is_the_scan_read_at_once() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (store, oracle, clock) = common::mem_parts().await;
        let whole = common::client(&store, &oracle, &clock, TxnConfig::default()).await;
        // 100 rows with two columns written three times, the first 40 then deleted, and one
        // row with 30 versions: more records than a piece holds, so its piece must grow.
        written_thrice(&whole, 100, 40).await;
        for round in 0..30 {
            let mut t = whole.begin().await.unwrap();
            t.set("n/0050", "due", format!("hot{round}"));
            t.commit().await.unwrap();
        }
        for piece in [1, 2, 5, 7, 64] {
            let config = TxnConfig { scan_piece_cells: piece, ..TxnConfig::default() };
            let pieces = common::client(&store, &oracle, &clock, config).await;
            let (mut a, mut b) = (whole.begin().await.unwrap(), pieces.begin().await.unwrap());
            // The readers' own writes, on both sides of where pieces are cut.
            for t in [&mut a, &mut b] {
                t.set("n/0003", "due", "mine");
                t.delete("n/0077", "due");
                t.set("n/0200", "due", "new");
            }
            let at_once = a.scan(b"n/", b"n0", b"due").await.unwrap();
            assert_eq!(at_once.len(), 61, "60 rows left, one deleted, one added, one revived");
            assert_eq!(s(&b.scan(b"n/", b"n0", b"due").await.unwrap()), s(&at_once), "{piece}");
            // Its rows alone, without the values, are the same rows.
            let rows: Vec<Bytes> = at_once.iter().map(|(r, _)| r.clone()).collect();
            assert_eq!(b.scan_rows(b"n/", b"n0", b"due").await.unwrap(), rows, "{piece}");
            // Scans of their own columns and row counts at once, as one by one.
            let each = [
                RangeScan::new(b"n/", b"n0", b"due").first(7),
                RangeScan::new(b"n/0050", b"", b"other"),
                RangeScan::new(b"n/", b"n0", b"due"),
            ];
            let one_by_one = vec![
                a.scan_first(b"n/", b"n0", b"due", 7).await.unwrap(),
                a.scan(b"n/0050", b"", b"other").await.unwrap(),
                at_once.clone(),
            ];
            assert_eq!(one_by_one[0].len(), 7);
            assert_eq!(b.scan_each(&each).await.unwrap(), one_by_one, "{piece}");
            let ranges: [(&[u8], &[u8]); 2] = [(b"n/0000", b"n/0050"), (b"n/0050", b"")];
            assert_eq!(
                b.scan_ranges(&ranges, b"due").await.unwrap(),
                a.scan_ranges(&ranges, b"due").await.unwrap(),
                "{piece}"
            );
        }
    });
}

#[test]
fn the_rows_of_a_scan_are_found_without_reading_a_value() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let (counted, c) = common::counted_client().await;
        written_thrice(&c, 50, 10).await;
        let t = c.begin().await.unwrap();
        let before = counted.counts();
        let rows = t.scan_rows(b"n/", b"n0", b"due").await.unwrap();
        let after = counted.counts();
        assert_eq!(rows.first().map(|r| r.as_ref()), Some(&b"n/0010"[..]));
        assert_eq!(rows.len(), 40);
        // One scan of the lock and write families; no read of the data family.
        assert_eq!((after.scan - before.scan, after.read_rows - before.read_rows), (1, 0));
    });
}
