//! The sled layout candidates (docs/architecture.md, "Why the data path is shaped this
//! way"), on sled itself: what one row mutation costs, and how many bytes sled keeps on disk
//! for the bytes it holds, when a row is one sled value (perc's layout: get, change,
//! compare-and-swap) against one sled key per cell (a row mutation is then several keys,
//! atomic only through a `sled::Batch`).
//!
//! The mutation is the shape of a prewrite or a commit on a page row: three cells change
//! (two written, one removed) in a row of ~1.5 KB. Two threads, random rows out of 20,000,
//! as perc's two workers do.
//!
//! And what sled keeps in memory beyond its cache: the same bytes stored as many small
//! values or as few large ones, each in a process of its own (`sled-memory-one`), sled
//! configured as a perc store configures it (`perc_store::sled_config`); its peak RSS after writing them and after reading
//! every key once (as a collection pass does). sled 0.34 splits a leaf past 16 keys and keeps
//! a record of every node, resident or not, so this is the memory a layout's key count costs.

use std::time::Instant;

use anyhow::Result;

use crate::table::{scaled, Table};

const ROWS: u64 = 20_000;
const RECORD_BYTES: usize = 1500;
const CELL_BYTES: usize = 30;
const THREADS: u64 = 2;

#[derive(Clone, Copy)]
enum Layout {
    /// One sled value per row, rewritten whole by compare-and-swap.
    RowRecord,
    /// One sled key per cell; the row's keys change in one atomic batch.
    CellBatch,
    /// One sled key per cell, written one by one: not atomic across a crash, so not a
    /// candidate; the floor of what per-cell keys cost.
    CellSingle,
}

impl Layout {
    fn name(self) -> &'static str {
        match self {
            Layout::RowRecord => "row record, compare-and-swap (perc's layout)",
            Layout::CellBatch => "key per cell, atomic sled::Batch",
            Layout::CellSingle => "key per cell, single writes (not crash-atomic)",
        }
    }
}

struct Figures {
    us_per_mutation: f64,
    disk_bytes: u64,
    live_bytes: u64,
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn cell_key(row: u64, cell: u8, version: u64) -> Vec<u8> {
    let mut k = row.to_be_bytes().to_vec();
    k.push(cell);
    k.extend_from_slice(&(!version).to_be_bytes());
    k
}

/// Runs `work(t)` for t in 0..[`THREADS`], each on a thread of its own; the first error.
fn on_threads(work: impl Fn(u64) -> Result<()> + Sync) -> Result<()> {
    std::thread::scope(|s| {
        let work = &work;
        let threads: Vec<_> = (0..THREADS).map(|t| s.spawn(move || work(t))).collect();
        threads.into_iter().try_for_each(|h| h.join().expect("a bench thread panicked"))
    })
}

fn measure(layout: Layout, mutations: u64) -> Result<Figures> {
    let dir = tempfile::tempdir()?;
    let db = sled::Config::new()
        .path(dir.path())
        .segment_size(8 << 20)
        .mode(sled::Mode::HighThroughput)
        .open()?;
    let tree = db.open_tree("t")?;
    let started = Instant::now();
    on_threads(|t| -> Result<()> {
        let mut x = 0x9E37_79B9_7F4A_7C15 ^ (t + 1);
        for i in 0..mutations / THREADS {
            let row = next(&mut x) % ROWS;
            match layout {
                Layout::RowRecord => loop {
                    let key = row.to_be_bytes();
                    let current = tree.get(key)?;
                    let mut record =
                        current.as_deref().map_or_else(|| vec![0; RECORD_BYTES], <[u8]>::to_vec);
                    record[(i % RECORD_BYTES as u64) as usize] ^= 1;
                    if tree.compare_and_swap(key, current, Some(record))?.is_ok() {
                        break;
                    }
                },
                Layout::CellBatch | Layout::CellSingle => {
                    // The condition: is there a cell in the row's lock column?
                    let _ = tree.scan_prefix(cell_key(row, 0, u64::MAX)).next();
                    let (a, b) = (cell_key(row, 1, i), cell_key(row, 2, i));
                    let gone = cell_key(row, 0, i.wrapping_sub(1));
                    if let Layout::CellBatch = layout {
                        let mut batch = sled::Batch::default();
                        batch.insert(a, vec![1; CELL_BYTES]);
                        batch.insert(b, vec![1; CELL_BYTES]);
                        batch.remove(gone);
                        tree.apply_batch(batch)?;
                    } else {
                        tree.insert(a, vec![1; CELL_BYTES])?;
                        tree.insert(b, vec![1; CELL_BYTES])?;
                        tree.remove(gone)?;
                    }
                }
            }
        }
        Ok(())
    })?;
    let elapsed = started.elapsed();
    db.flush()?;
    let mut live_bytes = 0;
    for kv in tree.iter() {
        let (k, v) = kv?;
        live_bytes += (k.len() + v.len()) as u64;
    }
    Ok(Figures {
        us_per_mutation: elapsed.as_secs_f64() * 1e6 / mutations as f64,
        disk_bytes: db.size_on_disk()?,
        live_bytes,
    })
}

/// The bytes the memory comparison stores, and the value sizes it stores them as.
const MEMORY_BYTES: u64 = 1 << 30;
const VALUE_SIZES: [usize; 3] = [100, 1_000, 10_000];

/// What one size of values left in memory.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Memory {
    /// sled's cache as a perc store configures it (a share of `store.cache_bytes`).
    cache_bytes: u64,
    keys: u64,
    value_bytes: usize,
    written_rss_kb: u64,
    read_rss_kb: u64,
    disk_bytes: u64,
}

/// The child: `bytes` stored as values of `value_bytes`, keyed like perc's edge rows.
pub fn memory_one(bytes: u64, value_bytes: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = perc_store::sled_config(dir.path(), "", &perc_store::SledOptions::default());
    let db = config.open()?;
    let keys = bytes / value_bytes as u64;
    // Values of random letters (zstd takes them to about 0.6 of their size, as it does a
    // page's cells): so that sled's cache, which counts compressed bytes, holds about as much
    // as it does in perc, and not a whole store of repeated text.
    let value_of = |i: u64| -> Vec<u8> {
        let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..value_bytes).map(|_| b'a' + (next(&mut x) % 26) as u8).collect()
    };
    let key = |i: u64| {
        let target = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 1_000_000;
        format!("e:http://synth.test/p/{target}\0http://synth.test/p/{i}").into_bytes()
    };
    on_threads(|t| {
        for i in (t..keys).step_by(THREADS as usize) {
            db.insert(key(i), value_of(i))?;
        }
        Ok(())
    })?;
    db.flush()?;
    let written_rss_kb = crate::scaling::peak_rss_kb();
    let mut n = 0;
    for kv in db.iter() {
        kv?;
        n += 1;
    }
    anyhow::ensure!(n == keys, "read {n} keys of {keys}");
    let m = Memory {
        cache_bytes: config.cache_capacity,
        keys,
        value_bytes,
        written_rss_kb,
        read_rss_kb: crate::scaling::peak_rss_kb(),
        disk_bytes: db.size_on_disk()?,
    };
    println!("{}", serde_json::to_string(&m)?);
    Ok(())
}

pub fn run(scale: f64) -> Result<()> {
    let n = scaled(200_000, scale);
    println!(
        "# perc-bench sled-layout (scale {scale}; {n} row mutations of 3 cells, {THREADS} \
         threads, {ROWS} rows of ~{RECORD_BYTES} bytes)"
    );
    let mut t = Table::new();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    for layout in [Layout::RowRecord, Layout::CellBatch, Layout::CellSingle] {
        let f = measure(layout, n)?;
        t.add(
            layout.name(),
            format!("{:.1} µs a mutation", f.us_per_mutation),
            format!(
                "{:.0} MiB on disk for {:.1} MiB held ({:.1}x)",
                mib(f.disk_bytes),
                mib(f.live_bytes),
                f.disk_bytes as f64 / f.live_bytes.max(1) as f64
            ),
        );
    }
    t.print("one row mutation on sled, by layout (wall time, 2 threads)");

    let bytes = (MEMORY_BYTES as f64 * scale) as u64;
    let mut t = Table::new();
    let mut cache_bytes = 0;
    for v in VALUE_SIZES {
        let m: Memory = crate::table::in_a_child(
            &["sled-memory-one", "--bytes", &bytes.to_string(), "--value-bytes", &v.to_string()],
            &[],
        )?;
        t.add(
            format!("{} keys of {} bytes", m.keys, m.value_bytes),
            format!("{} MiB", m.read_rss_kb / 1024),
            format!(
                "peak RSS after reading every key once ({} MiB after writing them); {:.0} \
                 bytes of it a key beyond the cache's {} MiB; {} MiB on disk",
                m.written_rss_kb / 1024,
                (m.read_rss_kb * 1024).saturating_sub(m.cache_bytes) as f64 / m.keys as f64,
                m.cache_bytes >> 20,
                m.disk_bytes >> 20
            ),
        );
        cache_bytes = m.cache_bytes;
    }
    t.print(&format!(
        "sled's memory beyond its cache: {} MiB as small or as large values (compressed, cache {} MiB)",
        bytes >> 20,
        cache_bytes >> 20
    ));
    Ok(())
}
