//! Golden protocol scripts: each file under `tests/scripts` is a sequence of transaction
//! commands and their recorded output, read as a specification. Rewrite the recorded output
//! with `UPDATE_GOLDENFILES=1` (`make golden`) and review the diff.
//!
//! Commands (`tN:` names a transaction; each transaction runs on a worker of its own):
//!   tN: begin                     start a transaction
//!   tN: set ROW COL=VALUE         buffer a write       tN: delete ROW COL
//!   tN: get ROW COL               read in tN's snapshot
//!   tN: commit [crash=STEP]       commit, or stop at STEP as if the process died there
//!                                 (after_prewrite_primary, after_prewrite_all,
//!                                 before_commit_primary, after_commit_primary,
//!                                 mid_secondaries)
//!   tN: commit_primary            run the commit-primary step again (at tN's commit_ts if
//!                                 it has one, else at a fresh one)
//!   tN: rollback                  roll back tN's primary (as a resolver would)
//!   tN: status                    tN's status, read at its primary
//!   tN: kill                      remove tN's worker from the liveness registry
//!   tick MS                       advance the clock
//!   dump                          every data/lock/write cell, decoded and raw

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::fmt::Write as _;
use std::sync::Arc;

use bytes::Bytes;
use perc_oracle::LocalOracle;
use perc_store::{MemStore, Scan, Schema, Store, Ts};
use perc_txn::{
    actions, Client, CommitStep, Crashed, LockRecord, ManualClock, Transaction, TxnConfig,
    WriteKind, WriteRecord,
};

type Res = Result<String, Box<dyn Error>>;

struct TxnState {
    client: Client,
    txn: Option<Transaction>,
    start_ts: Ts,
    writes: BTreeMap<(Bytes, Bytes), WriteKind>,
    commit_ts: Option<Ts>,
}

struct Runner {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn Store>,
    oracle: Arc<LocalOracle>,
    clock: Arc<ManualClock>,
    txns: HashMap<String, TxnState>,
}

fn config() -> TxnConfig {
    TxnConfig {
        lock_ttl_ms: 10_000,
        // Scripts kill workers explicitly; heartbeats never go stale by themselves.
        liveness_ttl_ms: u64::MAX / 4,
        backoff_min_ms: 10,
        backoff_max_ms: 200,
        lock_wait_max_ms: 1_000,
        seed: 1,
        ..TxnConfig::default()
    }
}

impl Runner {
    fn new() -> Runner {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut schema = Schema::new(perc_txn::FAMILIES);
        schema.add(perc_oracle::FAMILY);
        let store: Arc<dyn Store> = Arc::new(MemStore::new(schema));
        // A block of 4 timestamps keeps the oracle's refill path busy.
        let oracle = Arc::new(rt.block_on(LocalOracle::open(store.clone(), 4)).unwrap());
        Runner {
            rt,
            store,
            oracle,
            clock: Arc::new(ManualClock::new(1_000_000)),
            txns: HashMap::new(),
        }
    }

    fn dump(&self) -> Res {
        let mut out = String::new();
        for family in ["lock", "write", "data"] {
            let scan = Scan::whole(family, usize::MAX);
            for c in self.rt.block_on(self.store.scan(&scan))? {
                let decoded = match family {
                    "lock" => {
                        let l = LockRecord::decode(&c.value)?;
                        let primary = match &l.primary {
                            None => "primary".to_string(),
                            Some((r, col)) => format!("secondary of {}/{}", text(r), text(col)),
                        };
                        format!("{primary} {:?} by {}", l.kind, l.owner)
                    }
                    "write" => {
                        let w = WriteRecord::decode(&c.value)?;
                        format!("{:?} start_ts={}", w.kind, w.start_ts)
                    }
                    _ => format!("{:?}", text(&c.value)),
                };
                let raw: String = c.value.iter().map(|b| format!("{b:02x}")).collect();
                let raw = if family == "data" { String::new() } else { format!(" [{raw}]") };
                writeln!(
                    out,
                    "{}/{} {family}@{} = {decoded}{raw}",
                    text(&c.row),
                    text(&c.qualifier),
                    c.ts
                )?;
            }
        }
        Ok(out)
    }
}

fn text(b: &Bytes) -> String {
    b.escape_ascii().to_string()
}

fn step(name: &str) -> Result<CommitStep, Box<dyn Error>> {
    Ok(match name {
        "after_prewrite_primary" => CommitStep::AfterPrewritePrimary,
        "after_prewrite_all" => CommitStep::AfterPrewriteAll,
        "before_commit_primary" => CommitStep::BeforeCommitPrimary,
        "after_commit_primary" => CommitStep::AfterCommitPrimary,
        "mid_secondaries" => CommitStep::MidSecondaries,
        other => return Err(format!("unknown commit step {other}").into()),
    })
}

impl goldenscript::Runner for Runner {
    fn run(&mut self, command: &goldenscript::Command) -> Res {
        let pos: Vec<&str> =
            command.args.iter().filter(|a| a.key.is_none()).map(|a| a.value.as_str()).collect();
        let kv: Vec<(&str, &str)> = command
            .args
            .iter()
            .filter_map(|a| a.key.as_deref().map(|k| (k, a.value.as_str())))
            .collect();
        let name = command.prefix.clone().unwrap_or_default();
        match command.name.as_str() {
            "tick" => {
                self.clock.advance_ms(pos[0].parse()?);
                Ok(String::new())
            }
            "dump" => self.dump(),
            "begin" => {
                let clock: Arc<dyn perc_txn::Clock> = self.clock.clone();
                let client = self.rt.block_on(Client::new(
                    self.store.clone(),
                    self.oracle.clone(),
                    clock,
                    config(),
                ))?;
                let txn = self.rt.block_on(client.begin())?;
                let start_ts = txn.start_ts();
                let worker = client.id();
                self.txns.insert(
                    name,
                    TxnState {
                        client,
                        txn: Some(txn),
                        start_ts,
                        writes: BTreeMap::new(),
                        commit_ts: None,
                    },
                );
                Ok(format!("start_ts={start_ts} on {worker}"))
            }
            "set" | "delete" => {
                let st = self.txns.get_mut(&name).ok_or("unknown transaction")?;
                let txn = st.txn.as_mut().ok_or("transaction already finished")?;
                let row = Bytes::from(pos[0].to_string());
                if command.name == "set" {
                    for (col, value) in &kv {
                        txn.set(row.clone(), col.to_string(), value.to_string());
                        st.writes
                            .insert((row.clone(), Bytes::from(col.to_string())), WriteKind::Put);
                    }
                } else {
                    txn.delete(row.clone(), pos[1].to_string());
                    st.writes.insert((row, Bytes::from(pos[1].to_string())), WriteKind::Delete);
                }
                Ok(String::new())
            }
            "get" => {
                let st = self.txns.get(&name).ok_or("unknown transaction")?;
                let txn = st.txn.as_ref().ok_or("transaction already finished")?;
                let got = self.rt.block_on(txn.get(pos[0].as_bytes(), pos[1].as_bytes()))?;
                Ok(match got {
                    Some(v) => format!("{}/{} = {:?}", pos[0], pos[1], text(&v)),
                    None => format!("{}/{} = none", pos[0], pos[1]),
                })
            }
            "commit" => {
                let crash =
                    kv.iter().find(|(k, _)| *k == "crash").map(|(_, v)| step(v)).transpose()?;
                let st = self.txns.get_mut(&name).ok_or("unknown transaction")?;
                let txn = st.txn.take().ok_or("transaction already finished")?;
                let rt = &self.rt;
                match crash {
                    None => {
                        let ts = rt.block_on(txn.commit())?;
                        st.commit_ts = ts;
                        Ok(match ts {
                            Some(ts) => format!("committed at {ts}"),
                            None => "read-only, nothing to commit".into(),
                        })
                    }
                    Some(step) => match rt.block_on(txn.commit_crashing_at(step))? {
                        Crashed::BeforeCommitPoint => Ok("crashed before the commit point".into()),
                        Crashed::AfterCommitPoint(ts) => {
                            st.commit_ts = Some(ts);
                            Ok(format!("crashed after the commit point (commit_ts={ts})"))
                        }
                    },
                }
            }
            "commit_primary" => {
                let oracle = self.oracle.clone();
                let store = self.store.clone();
                let st = self.txns.get_mut(&name).ok_or("unknown transaction")?;
                let commit_ts = match st.commit_ts {
                    Some(ts) => ts,
                    None => self.rt.block_on(perc_oracle::Oracle::next(oracle.as_ref()))?,
                };
                let ((prow, pcol), _) = st.writes.first_key_value().ok_or("no writes")?;
                let cells: Vec<(Bytes, WriteKind)> = st
                    .writes
                    .iter()
                    .filter(|((r, _), _)| r == prow)
                    .map(|((_, c), k)| (c.clone(), *k))
                    .collect();
                self.rt.block_on(actions::commit_primary(
                    store.as_ref(),
                    prow,
                    pcol,
                    &cells,
                    st.start_ts,
                    commit_ts,
                ))?;
                st.commit_ts = Some(commit_ts);
                Ok(format!("committed at {commit_ts}"))
            }
            "rollback" => {
                let store = self.store.clone();
                let st = self.txns.get_mut(&name).ok_or("unknown transaction")?;
                let ((prow, pcol), _) = st.writes.first_key_value().ok_or("no writes")?;
                let columns: Vec<Bytes> =
                    st.writes.keys().filter(|(r, _)| r == prow).map(|(_, c)| c.clone()).collect();
                match self.rt.block_on(actions::rollback_primary(
                    store.as_ref(),
                    prow,
                    pcol,
                    &columns,
                    st.start_ts,
                ))? {
                    actions::Decided::RolledBack => Ok("rolled back".into()),
                    actions::Decided::Committed(ts) => {
                        Err(format!("rollback refused: the transaction committed at {ts}").into())
                    }
                }
            }
            "status" => {
                let st = self.txns.get(&name).ok_or("unknown transaction")?;
                let ((prow, pcol), _) = st.writes.first_key_value().ok_or("no writes")?;
                let s = self.rt.block_on(actions::status(
                    self.store.as_ref(),
                    prow,
                    pcol,
                    st.start_ts,
                ))?;
                Ok(match s {
                    actions::TxnStatus::Locked(l) => format!("locked by {}", l.owner),
                    other => format!("{other:?}"),
                })
            }
            "kill" => {
                let st = self.txns.get_mut(&name).ok_or("unknown transaction")?;
                let client = st.client.clone();
                self.rt.block_on(client.deregister())?;
                Ok(format!("{} is dead", client.id()))
            }
            other => Err(format!("unknown command {other}").into()),
        }
    }
}

macro_rules! scripts {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts/", stringify!($name));
            goldenscript::run(&mut Runner::new(), path).expect("goldenscript failed");
        }
    )*};
}

scripts!(
    visibility,
    first_committer_wins,
    commit_idempotent,
    commit_after_rollback,
    rollback_after_commit,
    write_skew,
    lost_update,
    dirty_read,
    fractured_read,
    read_skew,
    resolve_dead_owner,
    resolve_stale_lock,
    delete_and_read_your_writes,
);
