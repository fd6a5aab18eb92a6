//! A transaction stopped at each commit step (as a crash there would leave it), its owner
//! dead or its locks stale; readers then roll it back or forward, all of it or none, and
//! concurrent resolvers always agree.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use perc_store::{Scan, Store};
use perc_txn::{actions, Clock, CommitStep, Crashed, LockRecord, ManualClock, TxnConfig};

const ROWS: usize = 6;
const STEPS: [CommitStep; 5] = CommitStep::ALL;

fn row(i: usize) -> Bytes {
    Bytes::from(format!("row{i}"))
}

async fn locks(store: &Arc<dyn Store>) -> Vec<(Bytes, Bytes)> {
    let scan = Scan::whole("lock", usize::MAX);
    store.scan(&scan).await.unwrap().into_iter().map(|c| (c.row, c.qualifier)).collect()
}

/// How the crashed owner becomes cleanable.
#[derive(Copy, Clone, Debug)]
enum Death {
    Deregistered,
    LockTtlPassed,
}

/// `unchecked`: every row but the first is written with `set_unchecked`, so that its
/// prewrite is the batched one.
async fn crash_then_read(
    store: Arc<dyn Store>,
    step: CommitStep,
    death: Death,
    concurrent: bool,
    unchecked: bool,
) {
    let manual = Arc::new(ManualClock::new(1_000_000));
    let clock: Arc<dyn Clock> = manual.clone();
    let oracle = common::oracle(&store).await;
    let config = TxnConfig { lock_wait_max_ms: 60_000, ..TxnConfig::default() };
    let setup = common::client(&store, &oracle, &clock, config.clone()).await;
    let mut t = setup.begin().await.unwrap();
    for i in 0..ROWS {
        t.set(row(i), "c", "old");
    }
    t.commit().await.unwrap();

    let owner = common::client(&store, &oracle, &clock, config.clone()).await;
    let mut t = owner.begin().await.unwrap();
    for i in 0..ROWS {
        if unchecked && i > 0 {
            t.set_unchecked(row(i), "c", "new");
        } else {
            t.set(row(i), "c", "new");
        }
    }
    let crashed = t.commit_crashing_at(step).await.unwrap();
    let expect = match (step, crashed) {
        (
            CommitStep::AfterPrewritePrimary
            | CommitStep::AfterPrewriteAll
            | CommitStep::BeforeCommitPrimary,
            Crashed::BeforeCommitPoint,
        ) => "old",
        (_, Crashed::AfterCommitPoint(_)) => "new",
        other => panic!("unexpected crash outcome {other:?}"),
    };
    assert!(!locks(&store).await.is_empty(), "{step:?} leaves locks behind");
    match death {
        Death::Deregistered => owner.deregister().await.unwrap(),
        Death::LockTtlPassed => manual.advance_ms(config.lock_ttl_ms + 1),
    }

    let readers = if concurrent { 2 } else { 1 };
    let mut tasks = Vec::new();
    for r in 0..readers {
        let reader = common::client(&store, &oracle, &clock, config.clone()).await;
        tasks.push(tokio::spawn(async move {
            let t = reader.begin().await.unwrap();
            // The two readers walk the rows in opposite orders, so they resolve different
            // secondaries first.
            let mut order: Vec<usize> = (0..ROWS).collect();
            if r == 1 {
                order.reverse();
            }
            let mut seen = Vec::new();
            for i in order {
                let v = t.get(&row(i), b"c").await.unwrap().unwrap();
                seen.push(String::from_utf8(v.to_vec()).unwrap());
            }
            seen
        }));
    }
    for task in tasks {
        let seen = task.await.unwrap();
        assert!(
            seen.iter().all(|v| v == expect),
            "{step:?}/{death:?}: saw {seen:?}, want all {expect}"
        );
    }
    assert!(locks(&store).await.is_empty(), "{step:?}/{death:?}: every lock resolved");
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn readers_resolve_each_crash_point_mem() {
    for step in STEPS {
        for death in [Death::Deregistered, Death::LockTtlPassed] {
            for concurrent in [false, true] {
                for unchecked in [false, true] {
                    let store = common::mem_store();
                    rt().block_on(crash_then_read(store, step, death, concurrent, unchecked));
                }
            }
        }
    }
}

#[test]
fn readers_resolve_each_crash_point_sled() {
    for step in STEPS {
        for death in [Death::Deregistered, Death::LockTtlPassed] {
            for unchecked in [false, true] {
                let dir = tempfile::tempdir().unwrap();
                let store = common::sled_store(dir.path());
                rt().block_on(crash_then_read(store, step, death, true, unchecked));
            }
        }
    }
}

/// Two resolvers race on the locks of a crashed transaction, many times over: they always
/// reach the same decision, and the cells end all old or all new.
#[test]
fn concurrent_resolvers_agree() {
    let rt = rt();
    for round in 0..40u64 {
        let step = STEPS[(round % 5) as usize];
        rt.block_on(async move {
            let store = common::mem_store();
            let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(1_000_000));
            let oracle = common::oracle(&store).await;
            let owner = common::client(&store, &oracle, &clock, TxnConfig::default()).await;
            let mut t = owner.begin().await.unwrap();
            for i in 0..ROWS {
                t.set(row(i), "c", "new");
            }
            let crashed = t.commit_crashing_at(step).await.unwrap();
            owner.deregister().await.unwrap();
            let pending = locks(&store).await;
            let liveness = owner.liveness().clone();
            let mut tasks = Vec::new();
            for r in 0..2usize {
                let (store, pending, liveness) = (store.clone(), pending.clone(), liveness.clone());
                tasks.push(tokio::spawn(async move {
                    let mut decisions = Vec::new();
                    let n = pending.len();
                    for k in 0..n {
                        let (row, col) = &pending[(k + r * (round as usize + 1)) % n];
                        let got = store
                            .read_row(
                                row,
                                &[perc_store::ColumnRead::all(
                                    actions::lock_col(col),
                                    perc_store::TsRange::ALL,
                                )],
                            )
                            .await
                            .unwrap();
                        for cell in &got[0] {
                            let lock = LockRecord::decode(&cell.value).unwrap();
                            let res = actions::resolve(
                                store.as_ref(),
                                &liveness,
                                2_000_000,
                                row,
                                col,
                                cell.ts,
                                &lock,
                            )
                            .await
                            .unwrap();
                            decisions.push(res);
                        }
                        tokio::task::yield_now().await;
                    }
                    decisions
                }));
            }
            let mut all = Vec::new();
            for task in tasks {
                all.extend(task.await.unwrap());
            }
            let committed = matches!(crashed, Crashed::AfterCommitPoint(_));
            for d in &all {
                match (committed, d) {
                    (true, actions::Resolution::RolledForward(_))
                    | (false, actions::Resolution::RolledBack) => {}
                    other => panic!("round {round} {step:?}: resolver decided {other:?}"),
                }
            }
            assert!(locks(&store).await.is_empty());
            let reader = common::client(&store, &oracle, &clock, TxnConfig::default()).await;
            let t = reader.begin().await.unwrap();
            for i in 0..ROWS {
                let v = t.get(&row(i), b"c").await.unwrap();
                assert_eq!(v.is_some(), committed, "round {round} {step:?} row {i}");
            }
        });
    }
}
