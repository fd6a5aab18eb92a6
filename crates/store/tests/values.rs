//! The sled backend's value log through the store's API: a content is stored once, the
//! cleaner keeps every value a row refers to and gives back the rest, a put that meets a
//! pass survives it, and a process killed between a value's write and its row's, or in the
//! middle of a pass, loses nothing and leaks nothing after the next pass.
//!
//! The crash tests run this test binary again as a child (`PERC_STORE_CRASH_AT` names the
//! point the child aborts at, the `failpoints` feature); run without it, the child's test is
//! an ordinary test of the same steps.

use std::path::Path;

use bytes::Bytes;
use perc_store::{
    Column, ColumnRead, FamilySpec, Locality, Mutation, Schema, SledOptions, SledStore, Store, Ts,
    TsRange,
};
use rand::{RngCore, SeedableRng};

fn schema() -> Schema {
    Schema::new([FamilySpec { name: "f", locality: Locality::Row }])
}

/// Small segments, so that a test's few hundred values fill many.
fn options() -> SledOptions {
    SledOptions { value_segment_bytes: 64 << 10, ..SledOptions::default() }
}

fn open(dir: &Path) -> SledStore {
    SledStore::open(dir, schema(), &options()).unwrap()
}

/// Value `n`: 10,000 bytes that do not compress, the same for the same `n`.
fn value(n: u64) -> Bytes {
    let mut b = vec![0; 10_000];
    rand::rngs::SmallRng::seed_from_u64(n).fill_bytes(&mut b);
    Bytes::from(b)
}

fn col() -> Column {
    Column::new("f", "body")
}

async fn put(s: &SledStore, row: u64, v: Bytes) {
    let m = Mutation::Put { column: col(), ts: Ts(1), value: v };
    assert!(s.check_and_mutate(format!("r{row:04}").as_bytes(), &[], &[m]).await.unwrap());
}

async fn delete(s: &SledStore, row: u64) {
    let m = Mutation::Delete { column: col(), range: TsRange::ALL };
    assert!(s.check_and_mutate(format!("r{row:04}").as_bytes(), &[], &[m]).await.unwrap());
}

async fn get(s: &SledStore, row: u64) -> Option<Bytes> {
    let read = ColumnRead::newest(col(), TsRange::ALL);
    let got = s.read_row(format!("r{row:04}").as_bytes(), &[read]).await.unwrap();
    got[0].first().map(|c| c.value.clone())
}

/// Index entries of the value log.
fn entries(s: &SledStore) -> u64 {
    s.usage().unwrap().trees.iter().find(|t| t.name == "value log").unwrap().keys
}

fn segment_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("values")).unwrap().count()
}

#[tokio::test]
async fn a_content_is_stored_once_however_many_rows_refer_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    for row in 0..50 {
        put(&s, row, value(7)).await;
    }
    put(&s, 50, value(8)).await;
    assert_eq!(entries(&s), 2);
    for row in 0..50 {
        assert_eq!(get(&s, row).await, Some(value(7)));
    }
    // Compressible text is stored compressed.
    put(&s, 51, Bytes::from("<p>perc indexes the web</p>".repeat(2_000))).await;
    assert!(s.size_on_disk().unwrap() < 2 * 10_045 + 54_000 / 10 + 4 * 1024 * 1024);
}

#[tokio::test]
async fn the_cleaner_keeps_what_rows_refer_to_and_gives_back_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open(dir.path());
        for row in 0..200 {
            put(&s, row, value(row)).await;
        }
        for row in (0..200).filter(|r| r % 4 != 0) {
            delete(&s, row).await;
        }
        let before = segment_files(dir.path());
        let c = s.clean_values().unwrap();
        assert_eq!((c.referenced, c.dropped), (50, 150), "{c:?}");
        assert!(c.bytes_after * 2 < c.bytes_before, "{c:?}");
        assert!(segment_files(dir.path()) * 2 < before);
        // Nothing more to do.
        let again = s.clean_values().unwrap();
        assert_eq!((again.dropped, again.moved, again.segments_removed), (0, 0, 0), "{again:?}");
        for row in 0..200 {
            let want = if row % 4 == 0 { Some(value(row)) } else { None };
            assert_eq!(get(&s, row).await, want, "row {row}");
        }
        s.sync().await.unwrap();
    }
    let s = open(dir.path());
    for row in (0..200).step_by(4) {
        assert_eq!(get(&s, row).await, Some(value(row)), "row {row} after reopening");
    }
    assert_eq!(entries(&s), 50);
}

/// A put of a content no row refers to any more, racing a pass that would drop it: whichever
/// comes first, the row reads its value after both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_put_while_a_pass_runs_survives_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = std::sync::Arc::new(open(dir.path()));
    for round in 0..100u64 {
        put(&s, 0, value(round)).await;
        delete(&s, 0).await;
        let cleaner = {
            let s = s.clone();
            tokio::task::spawn_blocking(move || s.clean_values().unwrap())
        };
        put(&s, 1, value(round)).await;
        cleaner.await.unwrap();
        assert_eq!(get(&s, 1).await, Some(value(round)), "round {round}");
    }
    let c = s.clean_values().unwrap();
    assert_eq!(c.referenced, 1);
    assert_eq!(entries(&s), 1);
}

/// The steps a crash test's child takes: 60 values in rows, a third of them deleted, then
/// one more value put (its row last) and a cleaning pass. Where `PERC_STORE_CRASH_AT` says,
/// the process aborts; without it, the steps finish and are checked.
async fn steps(dir: &Path) {
    let s = open(dir);
    for row in 0..60 {
        put(&s, row, value(row)).await;
    }
    for row in (0..60).filter(|r| r % 3 != 0) {
        delete(&s, row).await;
    }
    s.sync().await.unwrap();
    put(&s, 100, value(100)).await;
    s.sync().await.unwrap();
    s.clean_values().unwrap();
    check(&s, dir, true).await;
}

/// What every crash leaves, once the store is open again and a pass has run: the rows that
/// hold values read them, and the log holds those values and no other (`whole`: the last
/// row was written).
async fn check(s: &SledStore, dir: &Path, whole: bool) {
    for row in 0..60 {
        let want = if row % 3 == 0 { Some(value(row)) } else { None };
        assert_eq!(get(s, row).await, want, "row {row}");
    }
    let last = get(s, 100).await;
    if whole {
        assert_eq!(last, Some(value(100)));
    }
    let live = 20 + u64::from(last.is_some());
    s.clean_values().unwrap();
    assert_eq!(entries(s), live, "an entry for each live value and none other");
    // Every segment left is at least half live, but for the one written to last.
    let frame = 10_045;
    let bound = 2 * live * frame + options().value_segment_bytes + frame;
    let disk: u64 = std::fs::read_dir(dir.join("values"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(disk <= bound, "{disk} bytes of segments for {live} live values (at most {bound})");
}

#[tokio::test]
async fn crash_child() {
    let own = tempfile::tempdir().unwrap();
    let dir = std::env::var_os("PERC_STORE_CRASH_DIR").map(std::path::PathBuf::from);
    steps(dir.as_deref().unwrap_or(own.path())).await;
}

fn crash_at(point: &str) {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env("PERC_STORE_CRASH_AT", point)
        .env("PERC_STORE_CRASH_DIR", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "the child was to stop at {point}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let s = open(dir.path());
        check(&s, dir.path(), !point.starts_with("values.after-append")).await;
    });
}

#[test]
fn a_crash_between_a_values_write_and_its_rows_loses_nothing_and_leaks_nothing() {
    // The 61st frame appended: the last row's value.
    crash_at("values.after-append@61");
}

#[test]
fn a_crash_after_a_pass_copied_frames_loses_nothing_and_leaks_nothing() {
    crash_at("values.clean.after-copy");
}

#[test]
fn a_crash_after_a_pass_flushed_loses_nothing_and_leaks_nothing() {
    crash_at("values.clean.after-flush");
}

#[test]
fn a_crash_while_a_pass_removes_segments_loses_nothing_and_leaks_nothing() {
    crash_at("values.clean.mid-remove");
}
