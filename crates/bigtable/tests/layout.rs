//! Where the Bigtable backend stores cells, read back with a raw Bigtable client against the
//! emulator: an Own family's cells are in its own key range, not in their row; and a table
//! written in the older layout (every family in the row) has its Own families moved there
//! when this version first opens it, with nothing lost.

use bigtable_rs::bigtable::{BigTable, BigTableConnection, RowCell};
use bigtable_rs::google::bigtable::v2::{
    mutate_rows_request, mutation, MutateRowsRequest, Mutation as BtMutation, ReadRowsRequest,
    RowSet,
};
use futures::StreamExt;
use perc_bigtable::{layout, BigtableConfig, BigtableStore, Emulator};
use perc_store::{
    Bytes, Column, ColumnRead, FamilySpec, Locality, Mutation, RowMutation, Scan, Schema, Store,
    Ts, TsRange,
};

fn schema() -> Schema {
    Schema::new([
        FamilySpec { name: "f", locality: Locality::Row },
        FamilySpec { name: "n", locality: Locality::Own },
    ])
}

async fn raw(emulator: &Emulator) -> (BigTable, String) {
    let connection =
        BigTableConnection::new_with_emulator(emulator.addr(), "perc", "perc", false, 1, None)
            .expect("connect");
    let client = connection.client();
    let table = client.get_full_table_name("t");
    (client, table)
}

/// Every cell of stored row `key`, as (family, qualifier, micros, value).
async fn stored(
    client: &BigTable,
    table: &str,
    key: &[u8],
) -> Vec<(String, Vec<u8>, i64, Vec<u8>)> {
    let req = ReadRowsRequest {
        table_name: table.to_string(),
        rows: Some(RowSet { row_keys: vec![key.to_vec()], row_ranges: vec![] }),
        ..ReadRowsRequest::default()
    };
    let rows = client.clone().read_rows(req).await.expect("read");
    rows.into_iter()
        .flat_map(|(_, cells)| cells)
        .map(|c: RowCell| (c.family_name, c.qualifier, c.timestamp_micros, c.value))
        .collect()
}

fn set(family: &str, qualifier: &str, ms: u64, value: &str) -> BtMutation {
    BtMutation {
        mutation: Some(mutation::Mutation::SetCell(mutation::SetCell {
            family_name: family.into(),
            column_qualifier: qualifier.as_bytes().to_vec(),
            timestamp_micros: ms as i64 * 1000,
            value: value.as_bytes().to_vec(),
        })),
    }
}

async fn write_raw(client: &BigTable, table: &str, rows: Vec<(Vec<u8>, Vec<BtMutation>)>) {
    let req = MutateRowsRequest {
        table_name: table.to_string(),
        entries: rows
            .into_iter()
            .map(|(row_key, mutations)| mutate_rows_request::Entry {
                row_key,
                mutations,
                ..Default::default()
            })
            .collect(),
        ..MutateRowsRequest::default()
    };
    let mut stream = client.clone().mutate_rows(req).await.expect("mutate");
    while let Some(resp) = stream.next().await {
        for e in resp.expect("mutate").entries {
            assert!(e.status.is_none_or(|s| s.code == 0));
        }
    }
}

fn scan_all(family: &'static str) -> Scan {
    Scan::whole(family, usize::MAX)
}

#[tokio::test]
async fn an_own_family_is_stored_in_a_range_of_its_own() {
    let emulator = Emulator::start().unwrap_or_else(|e| panic!("{e}"));
    let config = BigtableConfig::emulator(emulator.addr(), "t");
    let store = BigtableStore::open(&config, schema()).await.expect("open");
    let (f, n) = (Column::new("f", "q"), Column::new("n", "q"));
    let puts = |v: &str| {
        vec![
            Mutation::Put { column: f.clone(), ts: Ts(3), value: Bytes::from(format!("f{v}")) },
            Mutation::Put { column: n.clone(), ts: Ts(3), value: Bytes::from(format!("n{v}")) },
        ]
    };
    let rows = [b"p:a".to_vec(), vec![0xFF, 0x00], vec![0xFF]];
    let batch: Vec<RowMutation> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| RowMutation { row: Bytes::from(r.clone()), mutations: puts(&i.to_string()) })
        .collect();
    store.mutate_rows(&batch).await.expect("write");

    let (client, table) = raw(&emulator).await;
    for (i, r) in rows.iter().enumerate() {
        let in_row = stored(&client, &table, &layout::row_key(r)).await;
        assert_eq!(in_row, vec![("f".into(), b"q".to_vec(), 3000, format!("f{i}").into_bytes())]);
        let in_range = stored(&client, &table, &layout::own_key("n", r)).await;
        assert_eq!(in_range, vec![("n".into(), b"q".to_vec(), 3000, format!("n{i}").into_bytes())]);
        // One read of both families finds both, as it would in one row.
        let reads = [
            ColumnRead::newest(f.clone(), TsRange::ALL),
            ColumnRead::newest(n.clone(), TsRange::ALL),
        ];
        let got = store.read_row(r, &reads).await.expect("read");
        assert_eq!(got[0][0].value, format!("f{i}"));
        assert_eq!(got[1][0].value, format!("n{i}"));
    }
    // A scan of either family over the whole table finds exactly its own cells, in row order.
    let mut sorted = rows.to_vec();
    sorted.sort();
    for family in ["f", "n"] {
        let got = store.scan(&scan_all(family)).await.expect("scan");
        let got_rows: Vec<Vec<u8>> = got.iter().map(|c| c.row.to_vec()).collect();
        assert_eq!(got_rows, sorted, "{family}");
        assert!(got.iter().all(|c| c.value.starts_with(family.as_bytes())), "{family}");
    }
}

#[tokio::test]
async fn a_table_of_the_older_layout_is_moved_once_and_nothing_is_lost() {
    let emulator = Emulator::start().unwrap_or_else(|e| panic!("{e}"));
    let config = BigtableConfig::emulator(emulator.addr(), "t");
    // The table as an older perc left it: every family in the row, and no mark.
    perc_bigtable::admin::ensure_table(&config, &schema()).await.expect("create");
    let (client, table) = raw(&emulator).await;
    let old: Vec<String> = (0..2500).map(|i| format!("p:{i:05}")).collect();
    let mut rows: Vec<(Vec<u8>, Vec<BtMutation>)> = old
        .iter()
        .map(|r| {
            let mutations = vec![set("n", "obs", 5, "due"), set("n", "obs", 7, "again")];
            (r.as_bytes().to_vec(), mutations)
        })
        .collect();
    rows[10].1.push(set("f", "q", 4, "data"));
    // A move that stopped after its first batch's copies were written, before their deletes.
    let copied: Vec<(Vec<u8>, Vec<BtMutation>)> = old[..1000]
        .iter()
        .map(|r| (layout::own_key("n", r.as_bytes()), vec![set("n", "obs", 5, "due")]))
        .collect();
    write_raw(&client, &table, rows).await;
    write_raw(&client, &table, copied).await;

    let store = BigtableStore::open(&config, schema()).await.expect("open and move");
    let got = store.scan(&scan_all("n")).await.expect("scan");
    assert_eq!(got.len(), 2 * old.len(), "every version of every cell moved");
    for (pair, row) in got.chunks(2).zip(&old) {
        assert_eq!(pair[0].row, row.as_bytes());
        assert_eq!((pair[0].ts, &pair[0].value[..]), (Ts(7), &b"again"[..]));
        assert_eq!((pair[1].ts, &pair[1].value[..]), (Ts(5), &b"due"[..]));
    }
    for row in &old {
        let left = stored(&client, &table, row.as_bytes()).await;
        assert!(left.iter().all(|(family, ..)| family == "f"), "{row}: {left:?}");
    }
    let f = Column::new("f", "q");
    let data = store.read_row(old[10].as_bytes(), &[ColumnRead::newest(f, TsRange::ALL)]).await;
    assert_eq!(data.expect("read")[0][0].value, "data");
    assert_eq!(stored(&client, &table, &layout::mark_key()).await.len(), 1);

    // Marked: a second open moves nothing more (a cell written in the older layout now, by an
    // older process still running, stays where it was put).
    write_raw(&client, &table, vec![(b"p:late".to_vec(), vec![set("n", "obs", 9, "late")])]).await;
    let again = BigtableStore::open(&config, schema()).await.expect("open again");
    assert_eq!(again.scan(&scan_all("n")).await.expect("scan").len(), 2 * old.len());
    assert_eq!(stored(&client, &table, b"p:late").await.len(), 1);
}
