//! The Bigtable model that everything in perc stands on.
//!
//! A table maps `(row, family:qualifier, timestamp) -> value`. Rows are sorted byte strings;
//! each column keeps many versions, newest first:
//!
//! ```text
//!              "lock:page:body"   "write:page:body"        "data:page:body"
//!   row "a"    ts 7 -> {primary}  ts 5 -> {start_ts 4}     ts 7 -> "<html>.."
//!                                 ts 3 -> {start_ts 2}     ts 4 -> "<html>.."
//!                                                          ts 2 -> "<html>.."
//! ```
//!
//! The only atomic primitive is the single-row one, as in Bigtable: [`Store::check_and_mutate`]
//! checks a set of [`Condition`]s on one row and applies a set of [`Mutation`]s to it, all or
//! nothing. Everything that spans rows (Percolator transactions) is built above this crate.
//! Batched calls over many rows ([`Store::read_rows`], [`Store::mutate_rows`]) exist for speed,
//! like the paper's RPC batching, and are atomic per row only.
//!
//! Column families are declared up front in a [`Schema`], as Bigtable requires. A family
//! either lives in the row's atomic unit ([`Locality::Row`]) or in a locality group of its own
//! ([`Locality::Own`]): such a family can be scanned without reading anything else (the
//! notification scanner reads only `notify`), but it is outside the row's atomic unit, so
//! `check_and_mutate` may neither condition on it nor mutate it.
//!
//! This trait never names a backend; the backends are [`mem::MemStore`] (tests) and
//! [`sled_backend::SledStore`] (the embedded, durable default). Every backend passes the same
//! [`conformance`] suite.

pub mod coalesce;
pub mod counted;
pub mod hooked;
pub mod keycode;
pub mod mem;
mod row;
pub mod sled_backend;
mod sled_compact;
mod sled_open;
mod values;

#[cfg(feature = "conformance")]
pub mod conformance;

use std::fmt;

use async_trait::async_trait;
pub use bytes::Bytes;

pub use coalesce::Coalesced;
pub use counted::{Counted, OpCounts};
pub use hooked::{Call, Hook, Hooked};
pub use mem::MemStore;
pub use sled_backend::{ColumnUsage, SledStore, TreeUsage, Usage};
pub use sled_compact::Compacted;
pub use sled_open::{sled_config, SledOptions};
pub use values::Cleaned;

/// A timestamp: a version of a cell. Handed out by the oracle, strictly increasing.
///
/// Bounded by [`Ts::MAX`] because Cloud Bigtable stores cell timestamps as microseconds that
/// must be multiples of 1000: perc's `ts` is stored there as `ts * 1000`, which has to fit an
/// `i64` with room to spare.
#[derive(Copy, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ts(pub u64);

impl Ts {
    pub const ZERO: Ts = Ts(0);
    /// The largest timestamp a cell may carry (below 9 * 10^15).
    pub const MAX: Ts = Ts(8_999_999_999_999_999);

    pub fn next(self) -> Ts {
        Ts(self.0 + 1)
    }
}

impl fmt::Debug for Ts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for Ts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An inclusive range of timestamps, `min..=max`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct TsRange {
    pub min: Ts,
    pub max: Ts,
}

impl TsRange {
    /// Every timestamp.
    pub const ALL: TsRange = TsRange { min: Ts::ZERO, max: Ts::MAX };

    pub fn new(min: Ts, max: Ts) -> TsRange {
        TsRange { min, max }
    }
    /// Exactly `ts`.
    pub fn at(ts: Ts) -> TsRange {
        TsRange { min: ts, max: ts }
    }
    /// `0..=ts`: what a reader at `ts` may see.
    pub fn up_to(ts: Ts) -> TsRange {
        TsRange { min: Ts::ZERO, max: ts }
    }
    /// `ts..=MAX`.
    pub fn from(ts: Ts) -> TsRange {
        TsRange { min: ts, max: Ts::MAX }
    }
    pub fn contains(&self, ts: Ts) -> bool {
        self.min <= ts && ts <= self.max
    }
}

/// Where a column family lives. See the crate docs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Locality {
    /// Inside the row's atomic unit: usable in `check_and_mutate`.
    Row,
    /// A locality group of its own: cheap to scan alone, written only by `mutate_rows`.
    Own,
}

/// A declared column family.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FamilySpec {
    pub name: &'static str,
    pub locality: Locality,
}

/// The column families of a table. A backend refuses any other family.
#[derive(Clone, Debug, Default)]
pub struct Schema {
    families: Vec<FamilySpec>,
}

impl Schema {
    pub fn new(families: impl IntoIterator<Item = FamilySpec>) -> Schema {
        let mut schema = Schema::default();
        for f in families {
            schema.add(f);
        }
        schema
    }

    /// Adds a family; declaring the same family twice with the same locality is harmless.
    pub fn add(&mut self, family: FamilySpec) {
        match self.families.iter().find(|f| f.name == family.name) {
            Some(existing) => assert_eq!(
                existing.locality, family.locality,
                "family {:?} declared with two localities",
                family.name
            ),
            None => self.families.push(family),
        }
    }

    pub fn families(&self) -> &[FamilySpec] {
        &self.families
    }

    /// The declared family of this name, as its `'static` name.
    pub fn family(&self, name: &[u8]) -> Option<FamilySpec> {
        self.families.iter().copied().find(|f| f.name.as_bytes() == name)
    }

    pub fn locality(&self, family: &str) -> Result<Locality> {
        self.family(family.as_bytes())
            .map(|f| f.locality)
            .ok_or_else(|| StoreError::UnknownFamily { family: family.to_string() })
    }
}

/// A column: `family:qualifier`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Column {
    pub family: &'static str,
    pub qualifier: Bytes,
}

impl Column {
    pub fn new(family: &'static str, qualifier: impl Into<Bytes>) -> Column {
        Column { family, qualifier: qualifier.into() }
    }
}

impl fmt::Debug for Column {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.family, String::from_utf8_lossy(&self.qualifier))
    }
}

/// One version of a cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    pub ts: Ts,
    pub value: Bytes,
}

/// Read up to `versions` cells of `column` with timestamps in `range`, newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnRead {
    pub column: Column,
    pub range: TsRange,
    pub versions: u32,
}

impl ColumnRead {
    /// The newest cell in `range`.
    pub fn newest(column: Column, range: TsRange) -> ColumnRead {
        ColumnRead { column, range, versions: 1 }
    }
    /// Every cell in `range`.
    pub fn all(column: Column, range: TsRange) -> ColumnRead {
        ColumnRead { column, range, versions: u32::MAX }
    }
}

/// Reads of one row, for [`Store::read_rows`].
#[derive(Clone, Debug)]
pub struct RowRead {
    pub row: Bytes,
    pub reads: Vec<ColumnRead>,
}

/// A predicate on one row, checked atomically with the mutations.
#[derive(Clone, Debug)]
pub enum Condition {
    /// No cell of `column` has a timestamp in `range`.
    NoCellIn { column: Column, range: TsRange },
    /// A cell of `column` exists at exactly `ts`.
    CellAt { column: Column, ts: Ts },
}

/// A change to one row.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// Write `value` at `(column, ts)`, replacing any cell already there.
    Put { column: Column, ts: Ts, value: Bytes },
    /// Delete every cell of `column` with a timestamp in `range`.
    Delete { column: Column, range: TsRange },
}

impl Mutation {
    pub fn column(&self) -> &Column {
        match self {
            Mutation::Put { column, .. } | Mutation::Delete { column, .. } => column,
        }
    }
}

/// Unconditional mutations of one row, for [`Store::mutate_rows`].
#[derive(Clone, Debug)]
pub struct RowMutation {
    pub row: Bytes,
    pub mutations: Vec<Mutation>,
}

/// A scan of one family over the row range `[start, end)` (`end` empty: to the end of the
/// table), returning at most `limit` cells (every version), in (row, qualifier, ts desc) order.
#[derive(Clone, Debug)]
pub struct Scan {
    pub family: &'static str,
    pub start: Bytes,
    pub end: Bytes,
    pub limit: usize,
}

impl Scan {
    /// A scan of the whole of `family`, at most `limit` cells.
    pub fn whole(family: &'static str, limit: usize) -> Scan {
        Scan { family, start: Bytes::new(), end: Bytes::new(), limit }
    }
}

/// A cell returned by a scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanCell {
    pub row: Bytes,
    pub qualifier: Bytes,
    pub ts: Ts,
    pub value: Bytes,
}

/// Limits that Cloud Bigtable enforces; every backend enforces them, so that moving to
/// Bigtable cannot surprise. A row key may have Bigtable's 4 KiB less [`ROW_KEY_RESERVE`].
pub const ROW_KEY_BYTES_MAX: usize = 4 * 1024 - ROW_KEY_RESERVE;
/// Bytes of Bigtable's row key kept for a backend's own prefix: the Bigtable backend stores a
/// row's cells of a [`Locality::Own`] family under `FF 00 <family> 00 <row>`.
pub const ROW_KEY_RESERVE: usize = 16;
pub const QUALIFIER_BYTES_MAX: usize = 16 * 1024;
pub const VALUE_BYTES_MAX: usize = 100 * 1024 * 1024;

/// What can go wrong in the store. Every variant is a failure of the operation: the store has
/// no "expected" outcomes other than a `false` from `check_and_mutate`.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unknown column family {family:?}: it is not declared in the schema")]
    UnknownFamily { family: String },
    #[error(
        "column family {family:?} lives in a locality group of its own and cannot be used in \
         check_and_mutate; write it with mutate_rows"
    )]
    NotInRowUnit { family: String },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("corrupt data in the {backend} store: {detail}")]
    Corrupt { backend: &'static str, detail: String },
    #[error("{backend} store I/O failed: {detail}")]
    Io { backend: &'static str, detail: String },
    /// Another process holds the store (sled admits one).
    #[error("{detail}")]
    InUse { backend: &'static str, detail: String },
    /// The device holding the store is full: nothing more can be written until space is
    /// freed. What was written before is intact.
    #[error("no space left on device writing the {backend} store ({detail})")]
    OutOfSpace { backend: &'static str, detail: String },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The Bigtable model. See the crate docs for the semantics every backend provides.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The declared families.
    fn schema(&self) -> &Schema;

    /// For each read, up to `versions` cells of the column in its range, newest first.
    async fn read_row(&self, row: &[u8], reads: &[ColumnRead]) -> Result<Vec<Vec<Cell>>>;

    /// Many rows' reads in one call (not a consistent snapshot across rows).
    async fn read_rows(&self, rows: &[RowRead]) -> Result<Vec<Vec<Vec<Cell>>>> {
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(self.read_row(&r.row, &r.reads).await?);
        }
        Ok(out)
    }

    /// Atomically: if every condition holds on `row`, apply every mutation and return `true`;
    /// otherwise change nothing and return `false`. Only [`Locality::Row`] families.
    async fn check_and_mutate(
        &self,
        row: &[u8],
        conditions: &[Condition],
        mutations: &[Mutation],
    ) -> Result<bool>;

    /// Unconditional mutations of many rows: atomic per row, not across rows.
    async fn mutate_rows(&self, rows: &[RowMutation]) -> Result<()>;

    /// The cells of one family in a row range; see [`Scan`].
    async fn scan(&self, scan: &Scan) -> Result<Vec<ScanCell>>;

    /// Several scans in one call (as Bigtable's ReadRows takes several row ranges): each
    /// scan's cells, as [`Self::scan`] returns them. Not a consistent snapshot across them.
    /// Scans of several families over one range may share one walk of its rows (the
    /// embedded store's do): once one of them (of a limit above 0) has its limit, the walk
    /// may end with that row, and the others then hold every cell of theirs up to that row
    /// and none after it (fewer than their limit). A transaction's scan reads `lock` and
    /// `write` so, and needs no lock past where its records stop; a walk on to the range's
    /// end for a family with no cells there would cost the whole range.
    async fn scan_many(&self, scans: &[Scan]) -> Result<Vec<Vec<ScanCell>>> {
        let mut out = Vec::with_capacity(scans.len());
        for scan in scans {
            out.push(self.scan(scan).await?);
        }
        Ok(out)
    }

    /// Returns once every write acknowledged before this call is durable. Concurrent calls
    /// share one flush (group commit).
    async fn sync(&self) -> Result<()>;

    /// The backend's own housekeeping, which the transaction layer's collection pass asks for
    /// after it has dropped old versions (the sled backend cleans its value log when enough
    /// of it is no longer referred to). Correctness never waits for it.
    async fn maintain(&self) -> Result<()> {
        Ok(())
    }
}

/// Forwarding through a shared pointer, so `Arc<dyn Store>` is itself a store.
#[async_trait]
impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn schema(&self) -> &Schema {
        (**self).schema()
    }
    async fn read_row(&self, row: &[u8], reads: &[ColumnRead]) -> Result<Vec<Vec<Cell>>> {
        (**self).read_row(row, reads).await
    }
    async fn read_rows(&self, rows: &[RowRead]) -> Result<Vec<Vec<Vec<Cell>>>> {
        (**self).read_rows(rows).await
    }
    async fn check_and_mutate(
        &self,
        row: &[u8],
        conditions: &[Condition],
        mutations: &[Mutation],
    ) -> Result<bool> {
        (**self).check_and_mutate(row, conditions, mutations).await
    }
    async fn mutate_rows(&self, rows: &[RowMutation]) -> Result<()> {
        (**self).mutate_rows(rows).await
    }
    async fn scan(&self, scan: &Scan) -> Result<Vec<ScanCell>> {
        (**self).scan(scan).await
    }
    async fn scan_many(&self, scans: &[Scan]) -> Result<Vec<Vec<ScanCell>>> {
        (**self).scan_many(scans).await
    }
    async fn sync(&self) -> Result<()> {
        (**self).sync().await
    }
    async fn maintain(&self) -> Result<()> {
        (**self).maintain().await
    }
}

/// Checks the limits and the schema for one row's worth of work.
pub(crate) fn validate(
    schema: &Schema,
    row: &[u8],
    columns: impl IntoIterator<Item = (&'static str, usize)>,
    values: impl IntoIterator<Item = usize>,
    need_row_unit: bool,
) -> Result<()> {
    if row.is_empty() {
        return Err(StoreError::InvalidArgument("row key is empty".into()));
    }
    if row.len() > ROW_KEY_BYTES_MAX {
        return Err(StoreError::InvalidArgument(format!(
            "row key of {} bytes exceeds the {ROW_KEY_BYTES_MAX}-byte limit",
            row.len()
        )));
    }
    for (family, qualifier_len) in columns {
        let locality = schema.locality(family)?;
        if need_row_unit && locality == Locality::Own {
            return Err(StoreError::NotInRowUnit { family: family.to_string() });
        }
        if qualifier_len > QUALIFIER_BYTES_MAX {
            return Err(StoreError::InvalidArgument(format!(
                "column qualifier of {qualifier_len} bytes exceeds the \
                 {QUALIFIER_BYTES_MAX}-byte limit"
            )));
        }
    }
    for len in values {
        if len > VALUE_BYTES_MAX {
            return Err(StoreError::InvalidArgument(format!(
                "cell value of {len} bytes exceeds the {VALUE_BYTES_MAX}-byte limit"
            )));
        }
    }
    Ok(())
}

pub(crate) fn validate_ts(ts: Ts) -> Result<()> {
    if ts > Ts::MAX {
        return Err(StoreError::InvalidArgument(format!(
            "timestamp {ts} exceeds the maximum {}",
            Ts::MAX
        )));
    }
    Ok(())
}

/// Validates one row's reads; see [`validate_check_and_mutate`].
pub fn validate_reads(schema: &Schema, row: &[u8], reads: &[ColumnRead]) -> Result<()> {
    validate(
        schema,
        row,
        reads.iter().map(|r| (r.column.family, r.column.qualifier.len())),
        [],
        false,
    )
}

/// Validates a conditional mutation's arguments: the checks every backend runs first, so
/// that every backend refuses the same calls (Bigtable's limits included).
pub fn validate_check_and_mutate(
    schema: &Schema,
    row: &[u8],
    conditions: &[Condition],
    mutations: &[Mutation],
) -> Result<()> {
    let cond_cols = conditions.iter().map(|c| match c {
        Condition::NoCellIn { column, .. } | Condition::CellAt { column, .. } => column,
    });
    let cols = cond_cols.chain(mutations.iter().map(Mutation::column));
    validate(
        schema,
        row,
        cols.map(|c| (c.family, c.qualifier.len())),
        mutations.iter().filter_map(|m| match m {
            Mutation::Put { value, .. } => Some(value.len()),
            Mutation::Delete { .. } => None,
        }),
        true,
    )?;
    validate_mutation_ts(mutations)
}

pub(crate) fn validate_mutation_ts(mutations: &[Mutation]) -> Result<()> {
    for m in mutations {
        if let Mutation::Put { ts, .. } = m {
            validate_ts(*ts)?;
        }
    }
    Ok(())
}

/// Validates one row of a `mutate_rows` call; see [`validate_check_and_mutate`].
pub fn validate_row_mutation(schema: &Schema, rm: &RowMutation) -> Result<()> {
    validate(
        schema,
        &rm.row,
        rm.mutations.iter().map(|m| (m.column().family, m.column().qualifier.len())),
        rm.mutations.iter().filter_map(|m| match m {
            Mutation::Put { value, .. } => Some(value.len()),
            Mutation::Delete { .. } => None,
        }),
        false,
    )?;
    validate_mutation_ts(&rm.mutations)
}
