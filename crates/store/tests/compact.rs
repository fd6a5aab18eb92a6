//! `SledStore::compact` through the store's own API: every cell, large value and own-family
//! cell is there after a compaction, and so are the values written after it.

use bytes::Bytes;
use perc_store::conformance::schema;
use perc_store::{
    Column, ColumnRead, Mutation, RowMutation, SledOptions, SledStore, Store, Ts, TsRange,
};

/// Never stops a compaction.
fn go() -> bool {
    false
}

fn big(row: u32, version: u32) -> Bytes {
    // Over the 256 bytes a row keeps inline: a blob.
    Bytes::from(format!("{row}/{version}:").repeat(80))
}

fn put(family: &'static str, ts: u64, value: Bytes) -> Mutation {
    Mutation::Put { column: Column::new(family, Bytes::from_static(b"q")), ts: Ts(ts), value }
}

async fn newest(s: &SledStore, row: u32, family: &'static str) -> Option<Bytes> {
    let read = ColumnRead {
        column: Column::new(family, Bytes::from_static(b"q")),
        range: TsRange::ALL,
        versions: 1,
    };
    let got = s.read_row(format!("r{row:04}").as_bytes(), &[read]).await.unwrap();
    got[0].first().map(|c| c.value.clone())
}

async fn write(s: &SledStore, rows: std::ops::Range<u32>, version: u32) {
    for row in rows {
        let key = format!("r{row:04}");
        let cells = [put("f", u64::from(version), big(row, version))];
        assert!(s.check_and_mutate(key.as_bytes(), &[], &cells).await.unwrap());
        let own = RowMutation { row: Bytes::from(key), mutations: vec![put("n", 1, big(row, 0))] };
        s.mutate_rows(&[own]).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cell_is_kept_and_values_written_after_read_with_the_old() {
    for zstd_level in [0, 1] {
        let dir = tempfile::tempdir().unwrap();
        let options = SledOptions { zstd_level, ..SledOptions::default() };
        {
            let s = SledStore::open(dir.path(), schema(), &options).unwrap();
            for version in 1..=3 {
                write(&s, 0..400, version).await;
            }
            s.sync().await.unwrap();
        }
        let done = SledStore::compact(dir.path(), &options, &go).unwrap().unwrap();
        assert!(done.keys > 400, "{done:?}");
        // Large values live in the value log, not in sled's blobs tree.
        assert_eq!(done.blobs_dropped, 0, "{done:?}");

        let s = SledStore::open(dir.path(), schema(), &options).unwrap();
        for row in (0..400).step_by(7) {
            assert_eq!(newest(&s, row, "f").await, Some(big(row, 3)), "row {row}");
            assert_eq!(newest(&s, row, "n").await, Some(big(row, 0)), "row {row}");
        }
        // New values after the compaction: the old ones must be intact.
        write(&s, 400..800, 4).await;
        for row in 0..400 {
            assert_eq!(newest(&s, row, "f").await, Some(big(row, 3)), "old row {row}");
        }
        for row in (400..800).step_by(7) {
            assert_eq!(newest(&s, row, "f").await, Some(big(row, 4)), "new row {row}");
        }
        drop(s);
        // And a second compaction keeps them all as well.
        SledStore::compact(dir.path(), &options, &go).unwrap();
        let s = SledStore::open(dir.path(), schema(), &options).unwrap();
        write(&s, 800..900, 5).await;
        for row in 0..800 {
            let version = if row < 400 { 3 } else { 4 };
            assert_eq!(newest(&s, row, "f").await, Some(big(row, version)), "row {row}");
        }
    }
}

#[test]
fn an_open_or_missing_store_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let missing = SledStore::compact(dir.path(), &SledOptions::default(), &go).unwrap_err();
    assert!(missing.to_string().contains("no store at"), "{missing}");

    let open = SledStore::open(dir.path(), schema(), &SledOptions::default()).unwrap();
    let busy = SledStore::compact(dir.path(), &SledOptions::default(), &go).unwrap_err();
    assert!(busy.to_string().contains("holds it"), "{busy}");
    drop(open);
    assert!(!dir.path().join("compact.new").exists(), "a refused compaction leaves nothing");
}
