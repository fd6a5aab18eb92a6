//! A queue's consumer that keeps a mark of what it took: scans that say when each row was
//! committed (`Transaction::scan_each_found`), and deletes that take no lock
//! (`Transaction::delete_at_commit`), written after the commit point like the
//! secondaries' commits; a late roll-forward of a row's writer stays under them, and the
//! collection removes the rows.

mod common;

use bytes::Bytes;
use perc_store::{Mutation, RowMutation, Scan, Store, Ts};
use perc_txn::{gc, RangeScan, Transaction, WriteKind, WriteRecord};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

const RANGE: (&[u8], &[u8]) = (b"q:", b"q;");

/// The rows of the queue in `t`'s snapshot, with their commit timestamps.
async fn queue(t: &Transaction) -> Vec<(Bytes, Ts)> {
    let scan = RangeScan::new(RANGE.0, RANGE.1, b"v");
    let found = t.scan_each_found(&[scan]).await.unwrap().pop().unwrap();
    found.into_iter().map(|f| (f.row, f.commit_ts)).collect()
}

async fn cells(store: &dyn Store, family: &'static str) -> usize {
    store.scan(&Scan::whole(family, usize::MAX)).await.unwrap().len()
}

#[test]
fn a_consumer_takes_rows_by_its_mark_and_deletes_them_without_locks() {
    rt().block_on(async {
        let (counted, c) = common::counted_client().await;
        let store: &dyn Store = counted.as_ref();
        // Two writers, each with a row of its own (unchecked) beside its checked cell.
        let mut commits = Vec::new();
        for i in 0..2 {
            let mut t = c.begin().await.unwrap();
            t.set(format!("w{i}"), "n", "1");
            t.set_unchecked(format!("q:{i}"), "v", format!("{i}"));
            commits.push(t.commit().await.unwrap().unwrap());
        }
        let mut consumer = c.begin().await.unwrap();
        let found = queue(&consumer).await;
        assert_eq!(found, vec![(Bytes::from("q:0"), commits[0]), (Bytes::from("q:1"), commits[1])]);
        // Its own buffered write reads as committed after everything in its snapshot.
        consumer.set_unchecked("q:own", "v", "x");
        assert_eq!(queue(&consumer).await.last(), Some(&(Bytes::from("q:own"), Ts::MAX)));
        drop(consumer);
        let mut consumer = c.begin().await.unwrap();
        let before_delete = c.begin().await.unwrap();
        consumer.set("mark", "folded", consumer.start_ts().0.to_string());
        for (row, _) in queue(&consumer).await {
            consumer.delete_at_commit(row, b"v");
        }
        let before = counted.counts();
        consumer.commit().await.unwrap().unwrap();
        let after = counted.counts();
        let conditional = after.check_and_mutate - before.check_and_mutate;
        let batched = after.mutate_rows - before.mutate_rows;
        // The mark's prewrite and commit; one batch for the deletes: no lock on the rows.
        assert_eq!((conditional, batched), (2, 1));
        assert_eq!(cells(store, "lock").await, 0);
        // Gone from later snapshots; an earlier one still reads them.
        assert_eq!(queue(&c.begin().await.unwrap()).await, vec![]);
        assert_eq!(queue(&before_delete).await.len(), 2);
        drop(before_delete);

        // A late roll-forward of a writer (its commit record written again) stays deleted.
        let record = WriteRecord { kind: WriteKind::Put, start_ts: Ts(commits[0].0 - 1) };
        let again = RowMutation {
            row: Bytes::from("q:0"),
            mutations: vec![Mutation::Put {
                column: perc_store::Column::new("write", Bytes::from_static(b"v")),
                ts: commits[0],
                value: record.encode(),
            }],
        };
        store.mutate_rows(&[again]).await.unwrap();
        assert_eq!(queue(&c.begin().await.unwrap()).await, vec![]);

        // The collection removes the rows whole, as any deleted ones.
        gc::collect(&c, 64).await.unwrap();
        let left = store.scan(&Scan::whole("write", usize::MAX)).await.unwrap();
        assert!(left.iter().all(|cell| !cell.row.starts_with(b"q:")), "{left:?}");
        let data = store.scan(&Scan::whole("data", usize::MAX)).await.unwrap();
        assert!(data.iter().all(|cell| !cell.row.starts_with(b"q:")), "{data:?}");
    });
}

#[test]
fn the_prompt_collection_removes_emptied_rows_once_no_reader_can_see_them() {
    rt().block_on(async {
        let (counted, c) = common::counted_client().await;
        let store: &dyn Store = counted.as_ref();
        c.collect_promptly(true);
        let mut t = c.begin().await.unwrap();
        for i in 0..3 {
            t.set_unchecked(format!("q:{i}"), "v", format!("{i}"));
        }
        t.set("keep", "v", "1");
        t.commit().await.unwrap();
        // One row taken by a delete at commit, one deleted in the transaction, and a row
        // that keeps a live cell beside its deleted one.
        let reader = c.begin().await.unwrap();
        let mut consumer = c.begin().await.unwrap();
        consumer.set("mark", "folded", "1");
        consumer.delete_at_commit(Bytes::from("q:0"), b"v");
        consumer.delete("q:1", "v");
        consumer.delete("keep", "v");
        consumer.set("keep", "w", "2");
        consumer.commit().await.unwrap().unwrap();
        // A reader older than the deletes still reads the rows: nothing is collected.
        let report = gc::collect_deleted(&c, 64).await.unwrap();
        assert_eq!(report.cells_cleaned, 0);
        assert_eq!(queue(&reader).await.len(), 3);
        drop(reader);
        let report = gc::collect_deleted(&c, 64).await.unwrap();
        assert_eq!(report.cells_cleaned, 2, "{report:?}");
        let rows_of = |family| async move {
            let cells = store.scan(&Scan::whole(family, usize::MAX)).await.unwrap();
            let mut rows: Vec<Bytes> = cells.into_iter().map(|c| c.row).collect();
            rows.dedup();
            rows
        };
        // Gone whole; the untouched row, and the row with a live cell, are still there.
        assert_eq!(rows_of("data").await, ["keep", "mark", "q:2"].map(Bytes::from));
        // Taken: a second call reads nothing.
        let again = gc::collect_deleted(&c, 64).await.unwrap();
        assert_eq!(again.cells_seen, 0);
        // A client that no collector drains remembers nothing.
        c.collect_promptly(false);
        let mut t = c.begin().await.unwrap();
        t.delete("q:2", "v");
        t.commit().await.unwrap().unwrap();
        assert_eq!(gc::collect_deleted(&c, 64).await.unwrap().cells_seen, 0);
    });
}

#[test]
fn the_prompt_collection_takes_the_old_versions_of_a_row_asked_for() {
    rt().block_on(async {
        let (counted, c) = common::counted_client().await;
        let store: &dyn Store = counted.as_ref();
        c.collect_promptly(true);
        for i in 0..4 {
            let mut t = c.begin().await.unwrap();
            t.set_unchecked("hot", "v", format!("{i}"));
            t.set_unchecked("cold", "v", format!("{i}"));
            t.set("mark", "m", format!("{i}"));
            t.collect_soon(Bytes::from("hot"));
            t.commit().await.unwrap().unwrap();
        }
        let versions = |row: &'static str| async move {
            let cells = store.scan(&Scan::whole("data", usize::MAX)).await.unwrap();
            cells.iter().filter(|c| c.row == row.as_bytes()).count()
        };
        assert_eq!((versions("hot").await, versions("cold").await), (4, 4));
        gc::collect_deleted(&c, 64).await.unwrap();
        // The newest version alone is left of the row asked for; the other keeps its four.
        assert_eq!((versions("hot").await, versions("cold").await), (1, 4));
        let t = c.begin().await.unwrap();
        assert_eq!(t.get(b"hot", b"v").await.unwrap().as_deref(), Some(&b"3"[..]));
    });
}

/// A client whose queue holds one row, `q:0`.
async fn with_a_row_queued() -> perc_txn::Client {
    let (_, c) = common::counted_client().await;
    let mut t = c.begin().await.unwrap();
    t.set_unchecked("q:0", "v", "0");
    t.set("w", "n", "1");
    t.commit().await.unwrap();
    c
}

#[test]
fn a_transaction_that_writes_nothing_deletes_nothing_at_commit() {
    rt().block_on(async {
        let c = with_a_row_queued().await;
        let mut consumer = c.begin().await.unwrap();
        consumer.delete_at_commit(Bytes::from("q:0"), b"v");
        assert_eq!(consumer.commit().await.unwrap(), None);
        assert_eq!(queue(&c.begin().await.unwrap()).await.len(), 1);
    });
}

/// A crash after the commit point loses the deletes: the mark, committed, still says the rows
/// were taken, and the next consumer deletes them again.
#[cfg(feature = "failpoints")]
#[test]
fn a_crash_after_the_commit_point_loses_only_the_deletes() {
    rt().block_on(async {
        let c = with_a_row_queued().await;
        let mut consumer = c.begin().await.unwrap();
        let mark = consumer.start_ts();
        consumer.set("mark", "folded", mark.0.to_string());
        consumer.delete_at_commit(Bytes::from("q:0"), b"v");
        let crashed = consumer.commit_crashing_at(perc_txn::CommitStep::AfterCommitPrimary);
        assert!(matches!(crashed.await.unwrap(), perc_txn::Crashed::AfterCommitPoint(_)));
        let next = c.begin().await.unwrap();
        let folded = next.get(b"mark", b"folded").await.unwrap();
        assert_eq!(folded, Some(Bytes::from(mark.0.to_string())));
        let left = queue(&next).await;
        assert!(left.len() == 1 && left[0].1 < mark, "a row older than the mark: {left:?}");
    });
}
