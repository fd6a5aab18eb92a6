//! How perc's model becomes Bigtable's: timestamps and their ranges, key ranges, the filter
//! chains a read is made of, the cells a read returns sorted back to its reads, and mutations.

use bigtable_rs::bigtable::RowCell;
use bigtable_rs::google::bigtable::v2::{
    column_range, mutation, row_filter, row_range, ColumnRange, Mutation as BtMutation, RowFilter,
    RowRange, TimestampRange,
};
use bytes::Bytes;
use perc_store::{Cell, ColumnRead, Mutation, StoreError, Ts, TsRange};

use crate::layout::KeyRange;

pub(crate) fn rpc(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io { backend: "bigtable", detail: format!("{what}: {e}") }
}

pub(crate) fn micros(ts: Ts) -> i64 {
    ts.0 as i64 * 1000
}

pub(crate) fn ts_of(micros: i64) -> Ts {
    Ts((micros / 1000) as u64)
}

pub(crate) fn range(r: TsRange) -> TimestampRange {
    TimestampRange {
        start_timestamp_micros: micros(r.min),
        end_timestamp_micros: micros(r.max.next()),
    }
}

/// Stored key ranges as disjoint ranges in key order (what one ReadRows reads once).
pub(crate) fn disjoint_ranges(mut spans: Vec<KeyRange>) -> Vec<RowRange> {
    spans.sort_by(|a, b| (&a.start, &a.end).cmp(&(&b.start, &b.end)));
    // An empty end is the end of the table: after every key.
    let after = |a: &[u8], b: &[u8]| b.is_empty() || (!a.is_empty() && a <= b);
    let mut merged: Vec<KeyRange> = Vec::new();
    for span in spans {
        match merged.last_mut() {
            Some(last) if last.end.is_empty() || span.start <= last.end => {
                if !after(&span.end, &last.end) {
                    last.end = span.end;
                }
            }
            _ => merged.push(span),
        }
    }
    merged.into_iter().map(row_range).collect()
}

pub(crate) fn row_range(r: KeyRange) -> RowRange {
    RowRange {
        start_key: Some(row_range::StartKey::StartKeyClosed(r.start)),
        end_key: (!r.end.is_empty()).then_some(row_range::EndKey::EndKeyOpen(r.end)),
    }
}

pub(crate) fn filter(f: row_filter::Filter) -> RowFilter {
    RowFilter { filter: Some(f) }
}

pub(crate) fn chain(filters: Vec<RowFilter>) -> RowFilter {
    if filters.len() == 1 {
        return filters.into_iter().next().expect("one");
    }
    filter(row_filter::Filter::Chain(row_filter::Chain { filters }))
}

pub(crate) fn interleave(filters: Vec<RowFilter>) -> RowFilter {
    if filters.len() == 1 {
        return filters.into_iter().next().expect("one");
    }
    filter(row_filter::Filter::Interleave(row_filter::Interleave { filters }))
}

pub(crate) fn block_all() -> RowFilter {
    filter(row_filter::Filter::BlockAllFilter(true))
}

/// Exactly one column, in a timestamp range.
pub(crate) fn column_filter(family: &str, qualifier: &[u8], r: TsRange) -> Vec<RowFilter> {
    vec![
        filter(row_filter::Filter::ColumnRangeFilter(ColumnRange {
            family_name: family.to_string(),
            start_qualifier: Some(column_range::StartQualifier::StartQualifierClosed(
                qualifier.to_vec(),
            )),
            end_qualifier: Some(column_range::EndQualifier::EndQualifierClosed(qualifier.to_vec())),
        })),
        filter(row_filter::Filter::TimestampRangeFilter(range(r))),
    ]
}

/// The filter of one read, labelled with its index.
pub(crate) fn read_filter(i: usize, read: &ColumnRead) -> RowFilter {
    let mut f = column_filter(read.column.family, &read.column.qualifier, read.range);
    if read.versions < i32::MAX as u32 {
        f.push(filter(row_filter::Filter::CellsPerColumnLimitFilter(read.versions as i32)));
    }
    f.push(filter(row_filter::Filter::ApplyLabelTransformer(i.to_string())));
    chain(f)
}

pub(crate) fn reads_filter(reads: &[ColumnRead]) -> RowFilter {
    interleave(reads.iter().enumerate().map(|(i, r)| read_filter(i, r)).collect())
}

/// Sorts one row's labelled cells into the answer of each read, newest first.
pub(crate) fn demux(cells: Vec<RowCell>, n: usize) -> Result<Vec<Vec<Cell>>, StoreError> {
    let mut out: Vec<Vec<Cell>> = vec![Vec::new(); n];
    for c in cells {
        for label in &c.labels {
            let i: usize = label
                .parse()
                .ok()
                .filter(|i| *i < n)
                .ok_or_else(|| rpc("read", format!("unexpected label {label:?}")))?;
            out[i]
                .push(Cell { ts: ts_of(c.timestamp_micros), value: Bytes::from(c.value.clone()) });
        }
    }
    for cells in &mut out {
        cells.sort_by_key(|c| std::cmp::Reverse(c.ts));
    }
    Ok(out)
}

/// A put of `value` at `micros` into `family:qualifier`.
pub(crate) fn set_cell(
    family: &str,
    qualifier: Vec<u8>,
    micros: i64,
    value: Vec<u8>,
) -> BtMutation {
    BtMutation {
        mutation: Some(mutation::Mutation::SetCell(mutation::SetCell {
            family_name: family.to_string(),
            column_qualifier: qualifier,
            timestamp_micros: micros,
            value,
        })),
    }
}

pub(crate) fn mutation(m: &Mutation) -> BtMutation {
    match m {
        Mutation::Put { column, ts, value } => {
            set_cell(column.family, column.qualifier.to_vec(), micros(*ts), value.to_vec())
        }
        Mutation::Delete { column, range: r } => BtMutation {
            mutation: Some(mutation::Mutation::DeleteFromColumn(mutation::DeleteFromColumn {
                family_name: column.family.to_string(),
                column_qualifier: column.qualifier.to_vec(),
                time_range: Some(range(*r)),
            })),
        },
    }
}
