//! `perc-bench`: measures perc's real paths on this machine and prints tables.
//!
//! Every figure is a rate measured over a fixed amount of work on a fresh sled store in a
//! temporary directory; ratios are taken between figures of the same run, because the
//! machine is shared and absolute numbers drift. `make bench` runs every suite.

mod check;
mod core;
mod datapath;
mod distributed;
mod goals;
mod layout;
mod notify;
mod pipeline;
mod scaling;
mod serve;
mod soak;
mod table;

/// The binaries' allocator, as `perc` has it (jemalloc, one arena: `.cargo/config.toml`).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "perc benchmarks")]
struct Args {
    #[command(subcommand)]
    suite: Option<Suite>,
    /// Scale the amount of work (1.0 = the default sizes).
    #[arg(long, default_value_t = 1.0, global = true)]
    scale: f64,
}

#[derive(Subcommand)]
enum Suite {
    /// Store operations, transactions and the oracle.
    Core,
    /// Notifications: processing rate and scan cost.
    Notify,
    /// The indexing pipeline: replay and crawl throughput, store operations per page.
    Pipeline,
    /// Distributed mode: the oracle server, replay on the Bigtable emulator with 1-3 workers.
    Distributed,
    /// The paper's claim on synthetic webs of 1k, 10k and 100k pages: replay, update
    /// latency, rebuild against update, peak RSS.
    Scaling {
        /// One size only, in pages, unscaled (the million-page run: `--pages 1000000`); its
        /// export is then checked against the reference on a sample of 10,000 pages.
        #[arg(long)]
        pages: Option<u64>,
        /// Leave out `perc compact`'s rewrite and the updates on the compacted store.
        #[arg(long)]
        no_compact: bool,
        /// Updates in the first series, if not 100 (with `--pages`: the sample is checked
        /// after them all).
        #[arg(long)]
        updates: Option<usize>,
    },
    /// One size of `scaling`, in a process of its own (run by `scaling`).
    #[command(hide = true)]
    ScalingOne {
        #[arg(long)]
        pages: usize,
        #[arg(long)]
        no_compact: bool,
        /// Write the export's lines of the sampled pages here at the end.
        #[arg(long)]
        sample: Option<std::path::PathBuf>,
        #[arg(long)]
        updates: Option<usize>,
    },
    /// The check of a sample `scaling-one` wrote, in a process of its own (run by `scaling`).
    #[command(hide = true)]
    ScalingCheck { sample: std::path::PathBuf },
    /// The data path: replay of WARCs against the bare work on their records;
    /// calls, transactions and store bytes per page, peak RSS.
    Datapath {
        /// WARCs to measure (default: two generated perc-synth webs).
        #[arg(long = "warc")]
        warcs: Vec<std::path::PathBuf>,
    },
    /// The sled layout candidates of the data path (docs/architecture.md): one row
    /// mutation's cost and sled's bytes on disk, row records against a key per cell.
    SledLayout,
    /// One size of values of `sled-layout`'s memory comparison, in a process of its own.
    #[command(hide = true)]
    SledMemoryOne {
        #[arg(long)]
        bytes: u64,
        #[arg(long)]
        value_bytes: usize,
    },
    /// One WARC of `datapath`, in a process of its own (run by `datapath`).
    #[command(hide = true)]
    DatapathOne { warc: std::path::PathBuf },
    /// Records the Rust std docs as a WARC (the real web `datapath` measures), to measure it
    /// again with `datapath --warc OUT`.
    StdDocsWarc { out: std::path::PathBuf },
    /// perc serve: API latency with 64 clients during a crawl, the crawl's rate
    /// with and without them, freshness with a 1 s minimum revisit interval.
    Serve,
    /// perc serve over hours: RSS and disk in the steady state, the oldest pending
    /// notification under a recrawl the machine cannot keep up with, the export at the end
    /// against a fresh crawl.
    Soak {
        /// How long (the record is of 120 minutes).
        #[arg(long, default_value_t = 120.0)]
        minutes: f64,
        /// The site's pages (the record is of 3,000; more, with `--set
        /// recrawl.max_interval_s=2`, makes a demand many times what the machine indexes).
        #[arg(long, default_value_t = 3_000)]
        pages: usize,
        /// A configuration key for the server, over the suite's own (repeatable):
        /// `--set workers.gc_interval_ms=10000`.
        #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
        sets: Vec<String>,
    },
    /// The storage targets: `datapath` and `scaling`, then their figures side by side with
    /// the targets (disk, memory and speed as the store grows).
    Goals,
    /// Every suite, then the storage targets' table.
    All,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.suite.unwrap_or(Suite::All) {
        Suite::Core => core::run(args.scale),
        Suite::Notify => notify::run(args.scale),
        Suite::Pipeline => pipeline::run(args.scale),
        Suite::Distributed => distributed::run(args.scale),
        Suite::Scaling { pages, no_compact, updates } => {
            scaling::run(args.scale, pages, !no_compact, updates).map(drop)
        }
        Suite::ScalingOne { pages, no_compact, sample, updates } => {
            scaling::one(pages, scaling::Options { compact: !no_compact, sample, updates })
        }
        Suite::ScalingCheck { sample } => check::one(&sample),
        Suite::Datapath { warcs } => datapath::run(args.scale, &warcs).map(drop),
        Suite::DatapathOne { warc } => datapath::one(&warc),
        Suite::SledLayout => layout::run(args.scale),
        Suite::SledMemoryOne { bytes, value_bytes } => layout::memory_one(bytes, value_bytes),
        Suite::StdDocsWarc { out } => datapath::std_docs_warc(&out),
        Suite::Serve => serve::run(args.scale),
        Suite::Goals => goals::run(args.scale),
        Suite::Soak { minutes, pages, sets } => soak::run(minutes, pages, &sets),
        Suite::All => {
            core::run(args.scale)?;
            notify::run(args.scale)?;
            pipeline::run(args.scale)?;
            distributed::run(args.scale)?;
            let webs = datapath::run(args.scale, &[])?;
            layout::run(args.scale)?;
            serve::run(args.scale)?;
            let sizes = scaling::run(args.scale, None, true, None)?;
            goals::print(&webs, &sizes)?;
            soak::run(120.0 * args.scale, 3_000, &[])
        }
    }
}
