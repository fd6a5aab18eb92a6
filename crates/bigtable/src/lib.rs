//! The Cloud Bigtable backend of [`perc_store::Store`]: the store the paper itself ran on, for
//! when perc outgrows one machine. Data goes through `bigtable_rs`; the table and its column
//! families are made by perc ([`admin`]); tests run it against the emulator ([`emulator`]).
//!
//! How the model maps:
//!
//! ```text
//!   perc                          Cloud Bigtable
//!   family (Schema)               column family, created by perc
//!   Ts(t)                         timestamp_micros = t * 1000 (Bigtable wants millisecond
//!                                 granularity; Ts::MAX keeps it inside an i64)
//!   TsRange min..=max             [min*1000, (max+1)*1000)
//!   read_row (several reads)      one ReadRows; a filter chain per read, interleaved,
//!                                 each labelled with its read's index
//!   read_rows                     one ReadRows when every row asks the same reads,
//!                                 else one per row, concurrently
//!   check_and_mutate              one CheckAndMutateRow; conditions become a predicate
//!   mutate_rows                   one MutateRows per 100k mutations; status per row
//!   scan                          a streaming ReadRows of one family, cut at `limit`
//!   scan_many                     one streaming ReadRows over the union of the ranges and
//!                                 families, each cell handed to the scans it belongs to
//!                                 (scans with a limit: one ReadRows each)
//!   sync                          nothing: Bigtable acknowledges durable writes
//!   a family of Locality::Own     a key range of its own ([`layout`]): a row's cells of it
//!                                 are stored in another Bigtable row, so a scan of it reads
//!                                 nothing else; a call that touches both kinds of family
//!                                 names both rows in its one RPC
//! ```
//!
//! Conditions: "no cell in N1..Nk" and "a cell at P1..Pj" both hold iff the predicate
//! `if any(N) then block else (P1 and .. and Pj)` yields a cell; with no P, the mutations go in
//! the false branch of `any(N)` instead. Bigtable's limits (row key 4 KiB, cell 100 MiB) are
//! checked before any call, as every backend does, since the emulator enforces none.
//!
//! `CheckAndMutateRow` is not idempotent, so it is never retried blindly: after an RPC
//! failure its outcome is learned by reading the row back (did every put land?); if that
//! cannot tell, the call fails. `MutateRows` is idempotent (puts at explicit timestamps,
//! deletes): rows that fail are retried a few times, then the call fails naming the row.

pub mod admin;
mod convert;
pub mod emulator;
pub mod layout;

use std::collections::hash_map::{self, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use bigtable_rs::bigtable::{BigTable, BigTableConnection, RowCell};
use bigtable_rs::google::bigtable::v2::{
    row_filter, CheckAndMutateRowRequest, MutateRowsRequest, Mutation as BtMutation,
    ReadRowsRequest, RowFilter, RowSet,
};
use bytes::Bytes;
use futures::StreamExt;
use perc_store::{
    validate_check_and_mutate, validate_reads, validate_row_mutation, Cell, ColumnRead, Condition,
    Locality, Mutation, RowMutation, RowRead, Scan, ScanCell, Schema, Store, StoreError, TsRange,
};

use convert::{
    block_all, chain, column_filter, demux, disjoint_ranges, filter, interleave, mutation,
    reads_filter, rpc, ts_of,
};
use layout::KeyRange;

pub use emulator::Emulator;

/// Where the table is. `emulator`: `host:port` of a Bigtable emulator (no credentials);
/// otherwise Cloud Bigtable with Application Default Credentials.
#[derive(Clone, Debug)]
pub struct BigtableConfig {
    pub project: String,
    pub instance: String,
    pub table: String,
    pub emulator: Option<String>,
    /// gRPC connections to spread calls over.
    pub channels: usize,
    /// Deadline of one call.
    pub timeout_ms: u64,
}

impl BigtableConfig {
    /// A table on the emulator at `addr`.
    pub fn emulator(addr: &str, table: &str) -> BigtableConfig {
        BigtableConfig {
            project: "perc".into(),
            instance: "perc".into(),
            table: table.into(),
            emulator: Some(addr.into()),
            channels: 4,
            timeout_ms: 30_000,
        }
    }
}

/// Opening the backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bigtable configuration: {0}")]
    Config(String),
    #[error("bigtable: {0}")]
    Rpc(String),
    /// Nothing answers at the address (yet): an emulator or a network still starting. The
    /// one error worth waiting out when opening.
    #[error("bigtable: {0}")]
    Unreachable(String),
}

/// Cells up to this size travel in one gRPC message; Bigtable allows 100 MiB per cell, and a
/// row read carries several (tonic's default of 4 MiB would cut them).
const MESSAGE_BYTES_MAX: usize = 512 * 1024 * 1024;
/// Bigtable's limit of mutations in one MutateRows request.
const MUTATIONS_PER_CALL_MAX: usize = 100_000;
/// Attempts for rows of a MutateRows call that fail.
const MUTATE_ATTEMPTS: usize = 4;

/// The layout's version, the value of its mark ([`layout::mark_key`]).
const LAYOUT_VERSION: &[u8] = b"2";

/// One stored row's mutations in a MutateRows call.
struct Entry {
    key: Vec<u8>,
    mutations: Vec<BtMutation>,
}

pub struct BigtableStore {
    client: BigTable,
    table: String,
    schema: Schema,
}

impl BigtableStore {
    /// Connects, creating the table and any missing column families first.
    /// A table written by an older perc has its Own families' cells moved into their ranges
    /// first ([`layout`]), once.
    pub async fn open(config: &BigtableConfig, schema: Schema) -> Result<BigtableStore, Error> {
        let prefix_max = perc_store::ROW_KEY_RESERVE - 3;
        if let Some(f) = schema
            .families()
            .iter()
            .find(|f| f.locality == Locality::Own && f.name.len() > prefix_max)
        {
            return Err(Error::Config(format!(
                "column family {:?} has its own locality group, whose name may have at most \
                 {prefix_max} bytes on Bigtable (it prefixes the family's row keys)",
                f.name
            )));
        }
        let created = admin::ensure_table(config, &schema).await?;
        let timeout = Some(Duration::from_millis(config.timeout_ms));
        let channels = config.channels.max(1);
        let mut connection = match &config.emulator {
            Some(addr) => BigTableConnection::new_with_emulator(
                addr,
                &config.project,
                &config.instance,
                false,
                channels,
                timeout,
            ),
            None => {
                BigTableConnection::new(&config.project, &config.instance, false, channels, timeout)
                    .await
            }
        }
        .map_err(|e| Error::Rpc(format!("connecting: {e}")))?;
        connection.configure_inner_client(|c| {
            c.max_decoding_message_size(MESSAGE_BYTES_MAX)
                .max_encoding_message_size(MESSAGE_BYTES_MAX)
        });
        let client = connection.client();
        let table = client.get_full_table_name(&config.table);
        let store = BigtableStore { client, table, schema };
        store.settle_layout(created).await?;
        Ok(store)
    }

    /// `family` if it is an Own family (stored in a range of its own), else `None`.
    fn own<'f>(&self, family: &'f str) -> Option<&'f str> {
        (self.schema.locality(family).ok() == Some(Locality::Own)).then_some(family)
    }

    /// The stored rows that `reads` of `row` touch, in key order.
    fn read_keys(&self, row: &[u8], reads: &[ColumnRead]) -> Vec<Vec<u8>> {
        let mut keys: Vec<Vec<u8>> =
            reads.iter().map(|r| layout::key(self.own(r.column.family), row)).collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Where a scan of `family` over perc rows `start..end` reads.
    fn scan_ranges(
        &self,
        family: &str,
        start: &[u8],
        end: &[u8],
    ) -> perc_store::Result<Vec<KeyRange>> {
        Ok(match self.schema.locality(family)? {
            Locality::Own => vec![layout::own_range(family, start, end)],
            Locality::Row => layout::row_ranges(start, end),
        })
    }

    fn client(&self) -> BigTable {
        self.client.clone()
    }

    async fn read(
        &self,
        rows: RowSet,
        f: RowFilter,
    ) -> Result<Vec<(Vec<u8>, Vec<RowCell>)>, StoreError> {
        let req = ReadRowsRequest {
            table_name: self.table.clone(),
            rows: Some(rows),
            filter: Some(f),
            ..ReadRowsRequest::default()
        };
        self.client().read_rows(req).await.map_err(|e| rpc("ReadRows", e))
    }

    /// After an RPC failure of a conditional mutation: whether it landed, read back from the
    /// row (every put present with its value, every deleted range empty), if that can tell.
    async fn landed(&self, row: &[u8], mutations: &[Mutation]) -> Result<Option<bool>, StoreError> {
        let puts: Vec<&Mutation> =
            mutations.iter().filter(|m| matches!(m, Mutation::Put { .. })).collect();
        if puts.is_empty() {
            return Ok(None);
        }
        let reads: Vec<ColumnRead> = puts
            .iter()
            .map(|m| match m {
                Mutation::Put { column, ts, .. } => {
                    ColumnRead::newest(column.clone(), TsRange::at(*ts))
                }
                Mutation::Delete { .. } => unreachable!("puts only"),
            })
            .collect();
        let got = self.read_row(row, &reads).await?;
        let present = puts.iter().zip(&got).all(|(m, cells)| match m {
            Mutation::Put { value, .. } => cells.first().is_some_and(|c| c.value == *value),
            Mutation::Delete { .. } => false,
        });
        Ok(Some(present))
    }
}

#[async_trait]
impl Store for BigtableStore {
    fn schema(&self) -> &Schema {
        &self.schema
    }

    async fn read_row(
        &self,
        row: &[u8],
        reads: &[ColumnRead],
    ) -> perc_store::Result<Vec<Vec<Cell>>> {
        validate_reads(&self.schema, row, reads)?;
        if reads.is_empty() {
            return Ok(Vec::new());
        }
        let rows = RowSet { row_keys: self.read_keys(row, reads), row_ranges: vec![] };
        let got = self.read(rows, reads_filter(reads)).await?;
        demux(got.into_iter().flat_map(|(_, cells)| cells).collect(), reads.len())
    }

    async fn read_rows(&self, rows: &[RowRead]) -> perc_store::Result<Vec<Vec<Vec<Cell>>>> {
        for r in rows {
            validate_reads(&self.schema, &r.row, &r.reads)?;
        }
        if rows.len() > 1
            && rows.iter().all(|r| r.reads == rows[0].reads)
            && !rows[0].reads.is_empty()
        {
            let mut keys: Vec<Vec<u8>> =
                rows.iter().flat_map(|r| self.read_keys(&r.row, &r.reads)).collect();
            keys.sort();
            keys.dedup();
            let set = RowSet { row_keys: keys, row_ranges: vec![] };
            let n = rows[0].reads.len();
            let got = self.read(set, reads_filter(&rows[0].reads)).await?;
            // A row's cells of Row and of Own families come back under different keys; a
            // read's cells all come under one of them, so their answers add up.
            let mut by_row: HashMap<Bytes, Vec<Vec<Cell>>> = HashMap::with_capacity(got.len());
            for (key, cells) in got {
                let row = layout::perc_row(key).ok_or_else(|| rpc("ReadRows", "stray row"))?;
                let answers = demux(cells, n)?;
                match by_row.entry(row) {
                    hash_map::Entry::Vacant(e) => {
                        e.insert(answers);
                    }
                    hash_map::Entry::Occupied(mut e) => {
                        for (mine, more) in e.get_mut().iter_mut().zip(answers) {
                            mine.extend(more);
                        }
                    }
                }
            }
            let out = rows
                .iter()
                .map(|r| by_row.get(r.row.as_ref()).cloned().unwrap_or_else(|| vec![Vec::new(); n]))
                .collect();
            return Ok(out);
        }
        futures::future::try_join_all(rows.iter().map(|r| self.read_row(&r.row, &r.reads))).await
    }

    async fn check_and_mutate(
        &self,
        row: &[u8],
        conditions: &[Condition],
        mutations: &[Mutation],
    ) -> perc_store::Result<bool> {
        validate_check_and_mutate(&self.schema, row, conditions, mutations)?;
        let mut absent = Vec::new();
        let mut present = Vec::new();
        for c in conditions {
            match c {
                Condition::NoCellIn { column, range: r } => {
                    absent.push(chain(column_filter(column.family, &column.qualifier, *r)))
                }
                Condition::CellAt { column, ts } => present.push(chain(column_filter(
                    column.family,
                    &column.qualifier,
                    TsRange::at(*ts),
                ))),
            }
        }
        let ours: Vec<BtMutation> = mutations.iter().map(mutation).collect();
        // `all_present` yields a cell iff every P has one: if P1 then (if P2 then .. ) else block.
        let all_present = present.into_iter().rev().fold(None, |inner: Option<RowFilter>, p| {
            Some(match inner {
                None => p,
                Some(rest) => {
                    filter(row_filter::Filter::Condition(Box::new(row_filter::Condition {
                        predicate_filter: Some(Box::new(p)),
                        true_filter: Some(Box::new(rest)),
                        false_filter: Some(Box::new(block_all())),
                    })))
                }
            })
        });
        // The predicate, and whether the mutations apply when it matches (true branch) or
        // when it does not (false branch).
        let (predicate, apply_if_matched) = match (absent.is_empty(), all_present) {
            // No condition: a predicate that never matches; mutations in the false branch.
            (true, None) => (block_all(), false),
            (true, Some(p)) => (p, true),
            (false, None) => (interleave(absent), false),
            (false, Some(p)) => (
                filter(row_filter::Filter::Condition(Box::new(row_filter::Condition {
                    predicate_filter: Some(Box::new(interleave(absent))),
                    true_filter: Some(Box::new(block_all())),
                    false_filter: Some(Box::new(p)),
                }))),
                true,
            ),
        };
        let (true_mutations, false_mutations) =
            if apply_if_matched { (ours, vec![]) } else { (vec![], ours) };
        let req = CheckAndMutateRowRequest {
            table_name: self.table.clone(),
            row_key: layout::row_key(row),
            predicate_filter: Some(predicate),
            true_mutations,
            false_mutations,
            ..CheckAndMutateRowRequest::default()
        };
        match self.client().check_and_mutate_row(req).await {
            Ok(resp) => Ok(resp.predicate_matched == apply_if_matched),
            Err(e) => {
                // Not idempotent: learn the outcome from the row rather than try again.
                tracing::warn!(error = %e, "CheckAndMutateRow failed; reading the row back");
                match self.landed(row, mutations).await {
                    Ok(Some(true)) => Ok(true),
                    _ => Err(rpc("CheckAndMutateRow (outcome unknown; nothing was retried)", e)),
                }
            }
        }
    }

    async fn mutate_rows(&self, rows: &[RowMutation]) -> perc_store::Result<()> {
        for rm in rows {
            validate_row_mutation(&self.schema, rm)?;
        }
        // A row's mutations of Own families go to their rows: one entry for its Row
        // families and one for each Own family it writes, in the order they come.
        let mut entries: Vec<Entry> = Vec::new();
        for rm in rows {
            let mut groups: Vec<(Option<&str>, Vec<BtMutation>)> = Vec::new();
            for m in &rm.mutations {
                let own = self.own(m.column().family);
                match groups.iter_mut().find(|(o, _)| *o == own) {
                    Some((_, ms)) => ms.push(mutation(m)),
                    None => groups.push((own, vec![mutation(m)])),
                }
            }
            entries.extend(
                groups
                    .into_iter()
                    .map(|(own, mutations)| Entry { key: layout::key(own, &rm.row), mutations }),
            );
        }
        self.mutate_entries(entries).await
    }

    async fn scan(&self, scan: &Scan) -> perc_store::Result<Vec<ScanCell>> {
        let ranges = self.scan_ranges(scan.family, &scan.start, &scan.end)?;
        if scan.limit == 0 {
            return Ok(Vec::new());
        }
        let req = ReadRowsRequest {
            table_name: self.table.clone(),
            rows: Some(RowSet { row_keys: vec![], row_ranges: disjoint_ranges(ranges) }),
            filter: Some(filter(row_filter::Filter::FamilyNameRegexFilter(format!(
                "^{}$",
                scan.family
            )))),
            // Every row read yields a cell at least: `limit` rows hold `limit` cells.
            rows_limit: i64::try_from(scan.limit).unwrap_or(0),
            ..ReadRowsRequest::default()
        };
        let mut stream = self.client().stream_rows(req).await.map_err(|e| rpc("ReadRows", e))?;
        let mut out = Vec::new();
        while let Some(next) = stream.next().await {
            let (key, cells) = next.map_err(|e| rpc("ReadRows", e))?;
            let row = layout::perc_row(key).ok_or_else(|| rpc("ReadRows", "stray row"))?;
            for c in cells {
                out.push(ScanCell {
                    row: row.clone(),
                    qualifier: Bytes::from(c.qualifier),
                    ts: ts_of(c.timestamp_micros),
                    value: Bytes::from(c.value),
                });
                if out.len() >= scan.limit {
                    return Ok(out);
                }
            }
        }
        Ok(out)
    }

    async fn scan_many(&self, scans: &[Scan]) -> perc_store::Result<Vec<Vec<ScanCell>>> {
        if scans.len() < 2 || scans.iter().any(|s| s.limit != usize::MAX) {
            let mut out = Vec::with_capacity(scans.len());
            for scan in scans {
                out.push(self.scan(scan).await?);
            }
            return Ok(out);
        }
        let mut families: Vec<&str> = Vec::new();
        let mut ranges = Vec::new();
        for scan in scans {
            ranges.extend(self.scan_ranges(scan.family, &scan.start, &scan.end)?);
            if !families.contains(&scan.family) {
                families.push(scan.family);
            }
        }
        let req = ReadRowsRequest {
            table_name: self.table.clone(),
            rows: Some(RowSet { row_keys: vec![], row_ranges: disjoint_ranges(ranges) }),
            filter: Some(filter(row_filter::Filter::FamilyNameRegexFilter(format!(
                "^({})$",
                families.join("|")
            )))),
            ..ReadRowsRequest::default()
        };
        let mut stream = self.client().stream_rows(req).await.map_err(|e| rpc("ReadRows", e))?;
        let mut out: Vec<Vec<ScanCell>> = vec![Vec::new(); scans.len()];
        while let Some(next) = stream.next().await {
            let (key, cells) = next.map_err(|e| rpc("ReadRows", e))?;
            let row = layout::perc_row(key).ok_or_else(|| rpc("ReadRows", "stray row"))?;
            let within = |s: &Scan| row >= s.start && (s.end.is_empty() || row < s.end);
            let mine: Vec<usize> = (0..scans.len()).filter(|&i| within(&scans[i])).collect();
            for c in cells {
                let cell = ScanCell {
                    row: row.clone(),
                    qualifier: Bytes::from(c.qualifier),
                    ts: ts_of(c.timestamp_micros),
                    value: Bytes::from(c.value),
                };
                for &i in mine.iter().filter(|&&i| scans[i].family == c.family_name) {
                    out[i].push(cell.clone());
                }
            }
        }
        Ok(out)
    }

    async fn sync(&self) -> perc_store::Result<()> {
        Ok(())
    }
}

impl BigtableStore {
    /// Entries in as few MutateRows calls as Bigtable's limit of mutations a call allows.
    async fn mutate_entries(&self, entries: Vec<Entry>) -> perc_store::Result<()> {
        let mut batch: Vec<Entry> = Vec::new();
        let mut count = 0;
        for e in entries.into_iter().filter(|e| !e.mutations.is_empty()) {
            if count + e.mutations.len() > MUTATIONS_PER_CALL_MAX && !batch.is_empty() {
                self.mutate_batch(&std::mem::take(&mut batch)).await?;
                count = 0;
            }
            count += e.mutations.len();
            batch.push(e);
        }
        if !batch.is_empty() {
            self.mutate_batch(&batch).await?;
        }
        Ok(())
    }

    /// One MutateRows call; rows that fail are sent again (puts at explicit timestamps and
    /// deletes are idempotent), a few times, then the call fails naming the first such row.
    async fn mutate_batch(&self, rows: &[Entry]) -> perc_store::Result<()> {
        let mut pending: Vec<&Entry> = rows.iter().collect();
        let mut last_error = String::new();
        for _ in 0..MUTATE_ATTEMPTS {
            let req = MutateRowsRequest {
                table_name: self.table.clone(),
                entries: pending
                    .iter()
                    .map(|e| bigtable_rs::google::bigtable::v2::mutate_rows_request::Entry {
                        row_key: e.key.clone(),
                        mutations: e.mutations.clone(),
                        ..Default::default()
                    })
                    .collect(),
                ..MutateRowsRequest::default()
            };
            let mut failed = vec![true; pending.len()];
            match self.client().mutate_rows(req).await {
                Ok(mut stream) => {
                    while let Some(resp) = stream.next().await {
                        match resp {
                            Ok(resp) => {
                                for e in resp.entries {
                                    let ok = e.status.as_ref().is_none_or(|s| s.code == 0);
                                    if let Some(f) = failed.get_mut(e.index as usize) {
                                        *f = !ok;
                                    }
                                    if let Some(s) = e.status.filter(|s| s.code != 0) {
                                        let key = &pending[e.index as usize].key;
                                        let row = layout::perc_row(key.clone()).unwrap_or_default();
                                        last_error =
                                            format!("row {row:?}: code {} {}", s.code, s.message);
                                    }
                                }
                            }
                            Err(e) => {
                                last_error = e.to_string();
                                break;
                            }
                        }
                    }
                }
                Err(e) => last_error = e.to_string(),
            }
            pending = pending.into_iter().zip(failed).filter(|(_, f)| *f).map(|(r, _)| r).collect();
            if pending.is_empty() {
                return Ok(());
            }
        }
        Err(rpc("MutateRows", format!("{} row(s) not written: {last_error}", pending.len())))
    }
}
