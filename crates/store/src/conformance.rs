//! The conformance suite: the semantics of [`Store`] as executable cases, run against every
//! backend (mem and sled here; Bigtable joins with its own factory).
//!
//! A backend's test file calls [`conformance_tests!`](crate::conformance_tests) with a factory
//! that makes a fresh, empty store over [`schema`].

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use rand::{Rng, SeedableRng};

use crate::{
    Cell, Column, ColumnRead, Condition, FamilySpec, Locality, Mutation, RowMutation, RowRead,
    Scan, ScanCell, Schema, Store, StoreError, Ts, TsRange,
};

/// `f` and `g` live in the row's atomic unit; `n` in a locality group of its own.
pub fn schema() -> Schema {
    Schema::new([
        FamilySpec { name: "f", locality: Locality::Row },
        FamilySpec { name: "g", locality: Locality::Row },
        FamilySpec { name: "n", locality: Locality::Own },
    ])
}

/// A fresh store and whatever must live as long as it (a temporary directory, a server).
pub type Fresh = (Arc<dyn Store>, Box<dyn Any + Send>);
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Runs one case on a fresh store, on a multi-threaded runtime.
pub fn run<M, F>(case: fn(Arc<dyn Store>) -> BoxFuture<()>, make: M)
where
    M: FnOnce() -> F,
    F: Future<Output = Fresh>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let (store, _guard) = make().await;
        case(store).await;
    });
}

/// Defines one `#[test]` per conformance case, each on a fresh store from `$make`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!($make;
            read_versions_in_range, put_replaces_same_timestamp, conditions_all_or_nothing,
            delete_range_only, own_family_outside_row_unit, scan_one_family, batched_rows,
            limits_refused_nothing_stored, concurrent_prewrite_one_winner,
            concurrent_increments_none_lost, large_values, binary_keys_sorted,
            mixed_conditions);
    };
    ($make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::run(|s| Box::pin($crate::conformance::$case(s)), $make);
            }
        )*
    };
}

fn col(family: &'static str, q: &str) -> Column {
    Column::new(family, Bytes::copy_from_slice(q.as_bytes()))
}

fn put(c: &Column, ts: u64, v: &str) -> Mutation {
    Mutation::Put { column: c.clone(), ts: Ts(ts), value: Bytes::copy_from_slice(v.as_bytes()) }
}

async fn read(
    s: &Arc<dyn Store>,
    row: &str,
    c: &Column,
    range: TsRange,
    n: u32,
) -> Vec<(u64, String)> {
    let read = ColumnRead { column: c.clone(), range, versions: n };
    let got = s.read_row(row.as_bytes(), &[read]).await.unwrap();
    cells(&got[0])
}

fn cells(cs: &[Cell]) -> Vec<(u64, String)> {
    cs.iter().map(|c| (c.ts.0, String::from_utf8_lossy(&c.value).into_owned())).collect()
}

fn v(pairs: &[(u64, &str)]) -> Vec<(u64, String)> {
    pairs.iter().map(|(t, s)| (*t, s.to_string())).collect()
}

pub async fn read_versions_in_range(s: Arc<dyn Store>) {
    let c = col("f", "q");
    assert!(s
        .check_and_mutate(b"r", &[], &[put(&c, 1, "a"), put(&c, 3, "b"), put(&c, 5, "c")])
        .await
        .unwrap());
    assert_eq!(read(&s, "r", &c, TsRange::up_to(Ts(4)), 1).await, v(&[(3, "b")]));
    assert_eq!(read(&s, "r", &c, TsRange::up_to(Ts(5)), 1).await, v(&[(5, "c")]));
    assert_eq!(read(&s, "r", &c, TsRange::ALL, u32::MAX).await, v(&[(5, "c"), (3, "b"), (1, "a")]));
    assert_eq!(read(&s, "r", &c, TsRange::new(Ts(2), Ts(4)), 9).await, v(&[(3, "b")]));
    assert_eq!(read(&s, "r", &c, TsRange::ALL, 2).await, v(&[(5, "c"), (3, "b")]));
    assert_eq!(read(&s, "r", &c, TsRange::at(Ts(2)), 1).await, v(&[]));
    assert_eq!(read(&s, "r", &col("f", "other"), TsRange::ALL, 1).await, v(&[]));
    assert_eq!(read(&s, "r", &col("g", "q"), TsRange::ALL, 1).await, v(&[]));
    assert_eq!(read(&s, "nope", &c, TsRange::ALL, 1).await, v(&[]));
    // Several columns in one call, answers in request order.
    let got = s
        .read_row(
            b"r",
            &[
                ColumnRead::newest(col("g", "q"), TsRange::ALL),
                ColumnRead::newest(c.clone(), TsRange::ALL),
            ],
        )
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    assert!(got[0].is_empty());
    assert_eq!(cells(&got[1]), v(&[(5, "c")]));
    // The same column twice, in overlapping ranges: each read gets its own answer.
    let got = s
        .read_row(
            b"r",
            &[
                ColumnRead::all(c.clone(), TsRange::ALL),
                ColumnRead::newest(c.clone(), TsRange::up_to(Ts(4))),
            ],
        )
        .await
        .unwrap();
    assert_eq!(cells(&got[0]), v(&[(5, "c"), (3, "b"), (1, "a")]));
    assert_eq!(cells(&got[1]), v(&[(3, "b")]));
}

pub async fn put_replaces_same_timestamp(s: Arc<dyn Store>) {
    let c = col("f", "q");
    assert!(s.check_and_mutate(b"r", &[], &[put(&c, 7, "old")]).await.unwrap());
    assert!(s.check_and_mutate(b"r", &[], &[put(&c, 7, "new")]).await.unwrap());
    assert_eq!(read(&s, "r", &c, TsRange::ALL, 9).await, v(&[(7, "new")]));
}

/// Several positive and negative conditions at once: all must hold, on an empty row too.
pub async fn mixed_conditions(s: Arc<dyn Store>) {
    let (a, b, c, out) = (col("f", "a"), col("f", "b"), col("g", "c"), col("f", "out"));
    let conditions = [
        Condition::CellAt { column: a.clone(), ts: Ts(1) },
        Condition::CellAt { column: b.clone(), ts: Ts(2) },
        Condition::NoCellIn { column: c.clone(), range: TsRange::ALL },
    ];
    let attempt = |ts: u64| {
        let s = s.clone();
        let conditions = conditions.clone();
        let out = out.clone();
        async move { s.check_and_mutate(b"r", &conditions, &[put(&out, ts, "x")]).await.unwrap() }
    };
    // Empty row: the cells that must exist do not.
    assert!(!attempt(10).await);
    assert!(s.check_and_mutate(b"r", &[], &[put(&a, 1, "a")]).await.unwrap());
    assert!(!attempt(11).await, "b is missing");
    assert!(s.check_and_mutate(b"r", &[], &[put(&b, 3, "b")]).await.unwrap());
    assert!(!attempt(12).await, "b is at 3, not 2");
    assert!(s.check_and_mutate(b"r", &[], &[put(&b, 2, "b")]).await.unwrap());
    assert!(attempt(13).await, "every condition holds");
    assert!(s.check_and_mutate(b"r", &[], &[put(&c, 7, "c")]).await.unwrap());
    assert!(!attempt(14).await, "c has a cell");
    assert_eq!(read(&s, "r", &out, TsRange::ALL, 9).await, v(&[(13, "x")]));
    // Only negative conditions, on a row that does not exist.
    let none = [Condition::NoCellIn { column: a.clone(), range: TsRange::ALL }];
    assert!(s.check_and_mutate(b"fresh", &none, &[put(&a, 1, "a")]).await.unwrap());
    assert!(!s.check_and_mutate(b"fresh", &none, &[put(&a, 2, "a")]).await.unwrap());
}

pub async fn conditions_all_or_nothing(s: Arc<dyn Store>) {
    let lock = col("f", "lock");
    let write = col("f", "write");
    let data = col("g", "data");
    assert!(s.check_and_mutate(b"r", &[], &[put(&write, 10, "w10")]).await.unwrap());
    let no_write_after =
        |ts| Condition::NoCellIn { column: write.clone(), range: TsRange::from(Ts(ts)) };
    let no_lock = Condition::NoCellIn { column: lock.clone(), range: TsRange::ALL };
    // A write at 10 >= 5: the condition fails, and neither mutation is applied.
    let ok = s
        .check_and_mutate(
            b"r",
            &[no_lock.clone(), no_write_after(5)],
            &[put(&lock, 5, "L"), put(&data, 5, "D")],
        )
        .await
        .unwrap();
    assert!(!ok);
    assert_eq!(read(&s, "r", &lock, TsRange::ALL, 9).await, v(&[]));
    assert_eq!(read(&s, "r", &data, TsRange::ALL, 9).await, v(&[]));
    // After 10 the conditions hold, and both cells appear.
    let ok = s
        .check_and_mutate(
            b"r",
            &[no_lock.clone(), no_write_after(11)],
            &[put(&lock, 11, "L"), put(&data, 11, "D")],
        )
        .await
        .unwrap();
    assert!(ok);
    assert_eq!(read(&s, "r", &data, TsRange::ALL, 9).await, v(&[(11, "D")]));
    // A second prewrite sees the lock.
    assert!(!s
        .check_and_mutate(b"r", std::slice::from_ref(&no_lock), &[put(&lock, 12, "L")])
        .await
        .unwrap());
    // CellAt: exactly that timestamp.
    let at = |ts| Condition::CellAt { column: lock.clone(), ts: Ts(ts) };
    assert!(!s.check_and_mutate(b"r", &[at(12)], &[put(&write, 13, "x")]).await.unwrap());
    let commit = [
        put(&write, 13, "w13"),
        Mutation::Delete { column: lock.clone(), range: TsRange::at(Ts(11)) },
    ];
    assert!(s.check_and_mutate(b"r", &[at(11)], &commit).await.unwrap());
    assert_eq!(read(&s, "r", &lock, TsRange::ALL, 9).await, v(&[]));
    assert_eq!(read(&s, "r", &write, TsRange::ALL, 9).await, v(&[(13, "w13"), (10, "w10")]));
    // The same commit again: its lock is gone, nothing changes.
    assert!(!s.check_and_mutate(b"r", &[at(11)], &commit).await.unwrap());
    // Conditions on a row that does not exist.
    assert!(s
        .check_and_mutate(b"fresh", std::slice::from_ref(&no_lock), &[put(&lock, 1, "L")])
        .await
        .unwrap());
    assert!(!s.check_and_mutate(b"fresh2", &[at(1)], &[put(&lock, 1, "L")]).await.unwrap());
    assert_eq!(read(&s, "fresh2", &lock, TsRange::ALL, 9).await, v(&[]));
}

pub async fn delete_range_only(s: Arc<dyn Store>) {
    let c = col("f", "q");
    let other = col("f", "q2");
    let puts: Vec<Mutation> =
        (1..=5).map(|t| put(&c, t, &t.to_string())).chain([put(&other, 3, "o")]).collect();
    s.mutate_rows(&[RowMutation { row: Bytes::from_static(b"r"), mutations: puts }]).await.unwrap();
    let del = Mutation::Delete { column: c.clone(), range: TsRange::new(Ts(2), Ts(4)) };
    assert!(s.check_and_mutate(b"r", &[], &[del]).await.unwrap());
    assert_eq!(read(&s, "r", &c, TsRange::ALL, 9).await, v(&[(5, "5"), (1, "1")]));
    assert_eq!(read(&s, "r", &other, TsRange::ALL, 9).await, v(&[(3, "o")]));
    // Deleting everything removes the row; deleting nothing is fine.
    let all = |c: &Column| Mutation::Delete { column: c.clone(), range: TsRange::ALL };
    assert!(s.check_and_mutate(b"r", &[], &[all(&c), all(&other)]).await.unwrap());
    assert!(s.check_and_mutate(b"r", &[], &[all(&c)]).await.unwrap());
    let scan = Scan::whole("f", 100);
    assert!(s.scan(&scan).await.unwrap().is_empty());
}

pub async fn own_family_outside_row_unit(s: Arc<dyn Store>) {
    let n = col("n", "c");
    let f = col("f", "c");
    let err = s.check_and_mutate(b"r", &[], &[put(&n, 1, "x")]).await.unwrap_err();
    assert!(matches!(err, StoreError::NotInRowUnit { ref family } if family == "n"), "{err}");
    let cond = Condition::NoCellIn { column: n.clone(), range: TsRange::ALL };
    let err = s.check_and_mutate(b"r", &[cond], &[put(&f, 1, "x")]).await.unwrap_err();
    assert!(matches!(err, StoreError::NotInRowUnit { .. }), "{err}");
    assert_eq!(read(&s, "r", &f, TsRange::ALL, 9).await, v(&[]));
    // mutate_rows writes it, read_row reads it with the same range semantics.
    let rm = RowMutation {
        row: Bytes::from_static(b"r"),
        mutations: vec![put(&n, 1, "a"), put(&n, 4, "b"), put(&f, 2, "f")],
    };
    s.mutate_rows(&[rm]).await.unwrap();
    assert_eq!(read(&s, "r", &n, TsRange::ALL, 9).await, v(&[(4, "b"), (1, "a")]));
    assert_eq!(read(&s, "r", &n, TsRange::up_to(Ts(3)), 1).await, v(&[(1, "a")]));
    let del = RowMutation {
        row: Bytes::from_static(b"r"),
        mutations: vec![Mutation::Delete { column: n.clone(), range: TsRange::up_to(Ts(2)) }],
    };
    s.mutate_rows(&[del]).await.unwrap();
    assert_eq!(read(&s, "r", &n, TsRange::ALL, 9).await, v(&[(4, "b")]));
    assert_eq!(read(&s, "r", &f, TsRange::ALL, 9).await, v(&[(2, "f")]));
}

pub async fn scan_one_family(s: Arc<dyn Store>) {
    let mut batch = Vec::new();
    for row in ["a", "b", "c"] {
        batch.push(RowMutation {
            row: Bytes::copy_from_slice(row.as_bytes()),
            mutations: vec![
                put(&col("f", "x"), 1, row),
                put(&col("f", "x"), 2, row),
                put(&col("g", "y"), 1, row),
                put(&col("n", "z"), 3, row),
            ],
        });
    }
    s.mutate_rows(&batch).await.unwrap();
    let scan = |family, start: &'static str, end: &'static str, limit| Scan {
        family,
        start: Bytes::from_static(start.as_bytes()),
        end: Bytes::from_static(end.as_bytes()),
        limit,
    };
    let rows = |cs: Vec<ScanCell>| -> Vec<(String, String, u64)> {
        cs.into_iter()
            .map(|c| {
                (
                    String::from_utf8_lossy(&c.row).into(),
                    String::from_utf8_lossy(&c.qualifier).into(),
                    c.ts.0,
                )
            })
            .collect()
    };
    let r = |row: &str, q: &str, ts| (row.to_string(), q.to_string(), ts);
    assert_eq!(
        rows(s.scan(&scan("f", "b", "", 100)).await.unwrap()),
        vec![r("b", "x", 2), r("b", "x", 1), r("c", "x", 2), r("c", "x", 1)]
    );
    assert_eq!(rows(s.scan(&scan("g", "", "b", 100)).await.unwrap()), vec![r("a", "y", 1)]);
    assert_eq!(
        rows(s.scan(&scan("n", "", "", 100)).await.unwrap()),
        vec![r("a", "z", 3), r("b", "z", 3), r("c", "z", 3)]
    );
    assert_eq!(rows(s.scan(&scan("n", "b", "c", 100)).await.unwrap()), vec![r("b", "z", 3)]);
    assert_eq!(rows(s.scan(&scan("f", "", "", 3)).await.unwrap()).len(), 3);
    assert_eq!(rows(s.scan(&scan("n", "", "", 2)).await.unwrap()).len(), 2);
    let value = s.scan(&scan("n", "c", "", 1)).await.unwrap().remove(0).value;
    assert_eq!(value, Bytes::from_static(b"c"));
    // Several scans in one call, of several families over ranges that overlap, each with
    // the cells a scan of its own returns (limits included).
    let many = [
        scan("f", "b", "", 100),
        scan("g", "", "b", 100),
        scan("n", "a", "c", 100),
        scan("f", "a", "b", 100),
        scan("n", "", "", 2),
        scan("f", "c", "", 0),
    ];
    let unlimited = [
        scan("f", "b", "", usize::MAX),
        scan("g", "", "b", usize::MAX),
        scan("n", "a", "c", usize::MAX),
        scan("f", "a", "b", usize::MAX),
        scan("n", "c", "", usize::MAX),
        scan("f", "", "", usize::MAX),
    ];
    // Scans of several families over one range (a transaction reads `lock` and `write`
    // so), with limits that end them at different rows, and the same family twice.
    let one_range = [
        scan("f", "", "", 3),
        scan("g", "", "", 1),
        scan("n", "", "", 1),
        scan("f", "", "", usize::MAX),
        scan("g", "", "", 0),
        scan("f", "b", "", 1),
        scan("g", "b", "", 100),
    ];
    for many in [&many[..], &unlimited[..]] {
        let got = s.scan_many(many).await.unwrap();
        assert_eq!(got.len(), many.len());
        for (one, cells) in many.iter().zip(got) {
            assert_eq!(rows(cells), rows(s.scan(one).await.unwrap()), "{one:?}");
        }
    }
    // Over one range, the walk may end with the row at which one scan has its limit: each
    // scan holds its own scan's cells up to that row at least, in order, and none it would
    // not hold.
    for group in [&one_range[..3], &one_range[3..5], &one_range[5..]] {
        let got = s.scan_many(group).await.unwrap();
        let stop = group
            .iter()
            .zip(&got)
            .filter(|(one, cells)| one.limit > 0 && cells.len() >= one.limit)
            .filter_map(|(_, cells)| cells.last().map(|c| c.row.clone()))
            .min();
        for (one, cells) in group.iter().zip(got) {
            let (got, alone) = (rows(cells), rows(s.scan(one).await.unwrap()));
            assert!(alone.starts_with(&got), "{one:?}: {got:?} is not a start of {alone:?}");
            let upto: Vec<_> = alone
                .iter()
                .filter(|c| stop.as_ref().is_none_or(|r| c.0.as_bytes() <= &r[..]))
                .cloned()
                .collect();
            assert!(got.len() >= upto.len().min(one.limit), "{one:?}: {got:?} short of {upto:?}");
        }
    }
    assert!(s.scan_many(&[]).await.unwrap().is_empty());
}

pub async fn batched_rows(s: Arc<dyn Store>) {
    let c = col("f", "q");
    let batch: Vec<RowMutation> = (0..50)
        .map(|i| RowMutation {
            row: Bytes::from(format!("row{i:03}")),
            mutations: vec![put(&c, 1, &format!("v{i}"))],
        })
        .collect();
    s.mutate_rows(&batch).await.unwrap();
    let reads: Vec<RowRead> = (0..51)
        .map(|i| RowRead {
            row: Bytes::from(format!("row{i:03}")),
            reads: vec![ColumnRead::newest(c.clone(), TsRange::ALL)],
        })
        .collect();
    let got = s.read_rows(&reads).await.unwrap();
    assert_eq!(got.len(), 51);
    for (i, r) in got.iter().enumerate().take(50) {
        assert_eq!(cells(&r[0]), v(&[(1, &format!("v{i}"))]));
    }
    assert!(got[50][0].is_empty());
}

pub async fn limits_refused_nothing_stored(s: Arc<dyn Store>) {
    let c = col("f", "q");
    let good = put(&c, 1, "kept");
    assert!(s.check_and_mutate(b"r", &[], &[good]).await.unwrap());
    let long_row = vec![b'x'; crate::ROW_KEY_BYTES_MAX + 1];
    let cases: Vec<(Vec<u8>, Mutation, &str)> = vec![
        (Vec::new(), put(&c, 2, "x"), "row key is empty"),
        (long_row, put(&c, 2, "x"), "exceeds the 4080-byte limit"),
        (
            b"r".to_vec(),
            put(&Column::new("nosuch", "q"), 2, "x"),
            "unknown column family \"nosuch\"",
        ),
        (
            b"r".to_vec(),
            Mutation::Put { column: c.clone(), ts: Ts(Ts::MAX.0 + 1), value: Bytes::new() },
            "exceeds the maximum",
        ),
    ];
    for (row, m, want) in cases {
        let err = s.check_and_mutate(&row, &[], std::slice::from_ref(&m)).await.unwrap_err();
        assert!(err.to_string().contains(want), "{err} should say {want}");
        let rm = RowMutation { row: row.into(), mutations: vec![put(&c, 3, "y"), m] };
        let err = s.mutate_rows(&[rm]).await.unwrap_err();
        assert!(err.to_string().contains(want), "{err} should say {want}");
    }
    assert_eq!(read(&s, "r", &c, TsRange::ALL, 9).await, v(&[(1, "kept")]));
}

/// N tasks race the same conditional prewrite on one row: exactly one wins.
pub async fn concurrent_prewrite_one_winner(s: Arc<dyn Store>) {
    const TASKS: u64 = 16;
    for round in 0..20u64 {
        let row = Bytes::from(format!("race{round}"));
        let lock = col("f", "lock");
        let mut handles = Vec::new();
        for i in 0..TASKS {
            let (s, row, lock) = (s.clone(), row.clone(), lock.clone());
            handles.push(tokio::spawn(async move {
                let cond = Condition::NoCellIn { column: lock.clone(), range: TsRange::ALL };
                s.check_and_mutate(&row, &[cond], &[put(&lock, i + 1, &format!("owner{i}"))])
                    .await
                    .unwrap()
            }));
        }
        let wins = futures::future::join_all(handles)
            .await
            .into_iter()
            .filter(|r| *r.as_ref().unwrap())
            .count();
        assert_eq!(wins, 1, "round {round}");
        let got = s.read_row(&row, &[ColumnRead::all(lock, TsRange::ALL)]).await.unwrap();
        assert_eq!(got[0].len(), 1, "round {round}: exactly the winner's lock");
    }
}

/// Compare-and-increment from many tasks: every acknowledged increment is in the result.
pub async fn concurrent_increments_none_lost(s: Arc<dyn Store>) {
    const TASKS: u64 = 8;
    const EACH: u64 = 50;
    let c = col("f", "counter");
    let mut handles = Vec::new();
    for i in 0..TASKS {
        let (s, c) = (s.clone(), c.clone());
        handles.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(i);
            let mut done = 0;
            while done < EACH {
                let cur = s
                    .read_row(b"ctr", &[ColumnRead::newest(c.clone(), TsRange::ALL)])
                    .await
                    .unwrap();
                let ts = cur[0].first().map(|c| c.ts.0).unwrap_or(0);
                let conds =
                    [Condition::NoCellIn { column: c.clone(), range: TsRange::from(Ts(ts + 1)) }];
                if s.check_and_mutate(b"ctr", &conds, &[put(&c, ts + 1, &format!("t{i}"))])
                    .await
                    .unwrap()
                {
                    done += 1;
                }
                if rng.random_bool(0.1) {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let all = s.read_row(b"ctr", &[ColumnRead::all(c, TsRange::ALL)]).await.unwrap();
    assert_eq!(all[0].len() as u64, TASKS * EACH);
    assert_eq!(all[0][0].ts.0, TASKS * EACH);
}

pub async fn large_values(s: Arc<dyn Store>) {
    let c = col("f", "body");
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let m = Mutation::Put { column: c.clone(), ts: Ts(1), value: Bytes::from(big.clone()) };
    assert!(s.check_and_mutate(b"r", &[], &[m]).await.unwrap());
    s.sync().await.unwrap();
    let got = s.read_row(b"r", &[ColumnRead::newest(c.clone(), TsRange::ALL)]).await.unwrap();
    assert_eq!(got[0][0].value.as_ref(), &big[..]);
    let scan = Scan::whole("f", 10);
    assert_eq!(s.scan(&scan).await.unwrap()[0].value.len(), big.len());
    // Replacing and deleting large values leaves the row readable.
    let m2 = Mutation::Put { column: c.clone(), ts: Ts(1), value: Bytes::from(vec![1u8; 5000]) };
    assert!(s.check_and_mutate(b"r", &[], &[m2]).await.unwrap());
    let got = s.read_row(b"r", &[ColumnRead::newest(c.clone(), TsRange::ALL)]).await.unwrap();
    assert_eq!(got[0][0].value.len(), 5000);
}

pub async fn binary_keys_sorted(s: Arc<dyn Store>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut rows: Vec<Vec<u8>> = (0..60)
        .map(|_| {
            let n = rng.random_range(1..6);
            (0..n).map(|_| *[0u8, 1, 0xFF, b'a'].get(rng.random_range(0..4)).unwrap()).collect()
        })
        .collect();
    rows.sort();
    rows.dedup();
    let f = col("f", "\0q");
    let n = Column::new("n", Bytes::from_static(b"\0\xff"));
    let batch: Vec<RowMutation> = rows
        .iter()
        .map(|r| RowMutation {
            row: Bytes::from(r.clone()),
            mutations: vec![put(&f, 1, "v"), put(&n, 1, "v")],
        })
        .collect();
    s.mutate_rows(&batch).await.unwrap();
    for family in ["f", "n"] {
        let got = s.scan(&Scan::whole(family, 1000)).await.unwrap();
        let got_rows: Vec<Vec<u8>> = got.iter().map(|c| c.row.to_vec()).collect();
        assert_eq!(got_rows, rows, "family {family}");
        assert!(got.iter().all(|c| c.qualifier
            == if family == "f" { f.qualifier.clone() } else { n.qualifier.clone() }));
    }
}
