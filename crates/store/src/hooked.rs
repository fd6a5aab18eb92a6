//! A store wrapper that awaits a hook before each call, then makes the call on the store it
//! wraps: for tests and benchmarks that slow, hold or freeze some calls (a slow batched write,
//! a worker that stops dead, a delete held until the test lets it go).

use async_trait::async_trait;

use crate::{
    Cell, ColumnRead, Condition, Mutation, Result, RowMutation, RowRead, Scan, ScanCell, Schema,
    Store,
};

/// The call about to be made, with what the hook may want to look at.
pub enum Call<'a> {
    ReadRow(&'a [u8]),
    ReadRows(&'a [RowRead]),
    CheckAndMutate(&'a [u8]),
    MutateRows(&'a [RowMutation]),
    Scan(&'a Scan),
    ScanMany(&'a [Scan]),
    Sync,
}

/// What runs before each call; the call is made when it returns.
#[async_trait]
pub trait Hook: Send + Sync + 'static {
    async fn before(&self, call: Call<'_>);
}

pub struct Hooked<S, H> {
    inner: S,
    hook: H,
}

impl<S, H> Hooked<S, H> {
    pub fn new(inner: S, hook: H) -> Self {
        Hooked { inner, hook }
    }

    pub fn hook(&self) -> &H {
        &self.hook
    }
}

#[async_trait]
impl<S: Store, H: Hook> Store for Hooked<S, H> {
    fn schema(&self) -> &Schema {
        self.inner.schema()
    }
    async fn read_row(&self, row: &[u8], reads: &[ColumnRead]) -> Result<Vec<Vec<Cell>>> {
        self.hook.before(Call::ReadRow(row)).await;
        self.inner.read_row(row, reads).await
    }
    async fn read_rows(&self, rows: &[RowRead]) -> Result<Vec<Vec<Vec<Cell>>>> {
        self.hook.before(Call::ReadRows(rows)).await;
        self.inner.read_rows(rows).await
    }
    async fn check_and_mutate(
        &self,
        row: &[u8],
        conditions: &[Condition],
        mutations: &[Mutation],
    ) -> Result<bool> {
        self.hook.before(Call::CheckAndMutate(row)).await;
        self.inner.check_and_mutate(row, conditions, mutations).await
    }
    async fn mutate_rows(&self, rows: &[RowMutation]) -> Result<()> {
        self.hook.before(Call::MutateRows(rows)).await;
        self.inner.mutate_rows(rows).await
    }
    async fn scan(&self, scan: &Scan) -> Result<Vec<ScanCell>> {
        self.hook.before(Call::Scan(scan)).await;
        self.inner.scan(scan).await
    }
    async fn scan_many(&self, scans: &[Scan]) -> Result<Vec<Vec<ScanCell>>> {
        self.hook.before(Call::ScanMany(scans)).await;
        self.inner.scan_many(scans).await
    }
    async fn sync(&self) -> Result<()> {
        self.hook.before(Call::Sync).await;
        self.inner.sync().await
    }

    async fn maintain(&self) -> Result<()> {
        self.inner.maintain().await
    }
}
