//! What the framework's tests share: an environment of a store, an oracle, a clock and a
//! registry; observers that copy a cell down a chain or count their effects.
#![allow(dead_code, unused_imports)]

pub use std::sync::atomic::{AtomicU64, Ordering};
pub use std::sync::Arc;

pub use async_trait::async_trait;
pub use bytes::Bytes;
pub use perc_notify::{
    client_for, Engine, NotifyConfig, NotifyKind, Observer, ObserverError, Pending, Registry,
    RunOutcome, Workers,
};
pub use perc_oracle::{LocalOracle, Oracle};
pub use perc_store::{Call, Hook, Hooked, MemStore, Scan, SledOptions, SledStore, Store, Ts};
pub use perc_txn::gc;
pub use perc_txn::{Client, Clock, CommitStep, ManualClock, SystemClock, Transaction, TxnConfig};

pub struct Env {
    pub store: Arc<dyn Store>,
    pub oracle: Arc<dyn Oracle>,
    pub clock: Arc<dyn Clock>,
    pub manual: Option<Arc<ManualClock>>,
    pub registry: Arc<Registry>,
    /// The test's own worker, for setup writes and checking reads.
    pub me: Option<Client>,
}

impl Env {
    pub async fn new(store: Arc<dyn Store>, registry: Registry, manual: bool) -> Env {
        let oracle: Arc<dyn Oracle> = Arc::new(LocalOracle::open(store.clone(), 64).await.unwrap());
        let (clock, manual): (Arc<dyn Clock>, _) = if manual {
            let m = Arc::new(ManualClock::new(1_000_000));
            (m.clone(), Some(m))
        } else {
            (Arc::new(SystemClock), None)
        };
        let mut env = Env { store, oracle, clock, manual, registry: Arc::new(registry), me: None };
        env.me = Some(env.client().await);
        env
    }

    pub async fn mem(registry: Registry) -> Env {
        Env::new(Arc::new(MemStore::new(perc_notify::schema())), registry, true).await
    }

    pub async fn client(&self) -> Client {
        client_for(
            self.store.clone(),
            self.oracle.clone(),
            self.clock.clone(),
            TxnConfig::default(),
            self.registry.clone(),
        )
        .await
        .unwrap()
    }

    pub async fn engine(&self, config: NotifyConfig) -> Engine {
        Engine::new(self.client().await, self.registry.clone(), config)
    }

    /// An engine with its workers started on this runtime.
    pub async fn workers(&self, config: NotifyConfig) -> (Arc<Engine>, Workers) {
        let engine = Arc::new(self.engine(config).await);
        let workers = Workers::start(engine.clone(), &tokio::runtime::Handle::current());
        (engine, workers)
    }

    pub fn me(&self) -> &Client {
        self.me.as_ref().expect("set up in new")
    }

    pub async fn write(&self, row: &str, column: &str, value: &str) -> Ts {
        let mut t = self.me().begin().await.unwrap();
        t.set(row.to_string(), column.to_string(), value.to_string());
        t.commit().await.unwrap().unwrap()
    }

    pub async fn read(&self, row: &str, column: &str) -> Option<String> {
        let t = self.me().begin().await.unwrap();
        t.get(row.as_bytes(), column.as_bytes())
            .await
            .unwrap()
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
    }

    pub async fn notify_cells(&self) -> usize {
        let scan = Scan::whole("notify", usize::MAX);
        self.store.scan(&scan).await.unwrap().len()
    }
}

pub fn text(v: Option<Bytes>) -> String {
    v.map(|v| String::from_utf8(v.to_vec()).unwrap()).unwrap_or_default()
}

/// Appends its tag to the watched column's value and writes it to the next column.
pub struct Stage {
    pub tag: &'static str,
    pub to: &'static str,
    pub runs: AtomicU64,
}

#[async_trait]
impl Observer for Stage {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        column: &Bytes,
    ) -> Result<(), ObserverError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let v = text(txn.get(row, column).await?);
        txn.set(row.clone(), self.to, format!("{v}|{}", self.tag));
        Ok(())
    }
}

pub fn stage(tag: &'static str, to: &'static str) -> Arc<Stage> {
    Arc::new(Stage { tag, to, runs: AtomicU64::new(0) })
}

/// Counts its runs, records the value it saw, and increments an "effect" counter column in
/// its own transaction, so a double commit would show.
pub struct Effect {
    pub runs: AtomicU64,
}

#[async_trait]
impl Observer for Effect {
    async fn observe(
        &self,
        txn: &mut Transaction,
        row: &Bytes,
        column: &Bytes,
    ) -> Result<(), ObserverError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let seen = text(txn.get(row, column).await?);
        let n: u64 = text(txn.get(row, b"effect").await?).parse().unwrap_or(0);
        txn.set(row.clone(), "seen", seen);
        txn.set(row.clone(), "effect", (n + 1).to_string());
        Ok(())
    }
}

pub fn effect() -> Arc<Effect> {
    Arc::new(Effect { runs: AtomicU64::new(0) })
}

/// One [`Effect`] observer, "E", on column "v" (strong): the observer and its registry.
pub fn one_effect() -> (Arc<Effect>, Registry) {
    let obs = effect();
    let mut reg = Registry::new();
    reg.register("E", "v", NotifyKind::Strong, obs.clone()).unwrap();
    (obs, reg)
}

/// The chain a → A → b → B → c → C → d of [`Stage`]s (strong notifications).
pub fn chain() -> Registry {
    let mut reg = Registry::new();
    reg.register("A", "a", NotifyKind::Strong, stage("A", "b")).unwrap();
    reg.register("B", "b", NotifyKind::Strong, stage("B", "c")).unwrap();
    reg.register("C", "c", NotifyKind::Strong, stage("C", "d")).unwrap();
    reg
}

/// A sled store in `dir`, with the framework's schema.
pub fn sled(dir: &std::path::Path) -> Arc<dyn Store> {
    Arc::new(SledStore::open(dir, perc_notify::schema(), &SledOptions::default()).unwrap())
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}
