//! The command line: `perc`'s global options and its commands, as clap parses them.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "perc",
    version,
    about = "Incremental web indexing on Percolator-style transactions and observers"
)]
pub(crate) struct Cli {
    /// The store directory (overrides store.data); `:memory:` keeps the store in memory for
    /// this command only (a throwaway crawl or replay).
    #[arg(long, global = true)]
    pub(crate) data: Option<PathBuf>,
    /// A TOML file layered over the embedded defaults.
    #[arg(long, global = true)]
    pub(crate) config: Option<PathBuf>,
    /// Overrides one configuration key: --set crawl.max_depth=3 (repeatable).
    #[arg(long = "set", global = true, value_name = "SECTION.KEY=VALUE")]
    pub(crate) sets: Vec<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Clone, Subcommand)]
pub(crate) enum Command {
    /// Crawl and index from a seed list until the frontier is empty and nothing is pending.
    Crawl {
        /// One URL a line; `#` starts a comment; `-` reads standard input.
        #[arg(long)]
        seeds: PathBuf,
        /// Narrows the scope to URLs starting with this (repeatable).
        #[arg(long = "prefix")]
        prefixes: Vec<String>,
        /// Records every request and response into this WARC (.warc.gz); an existing file is
        /// refused unless --append.
        #[arg(long)]
        warc_out: Option<PathBuf>,
        /// Adds the records to the --warc-out file if it exists (a page whose body is the
        /// same as at its last capture there is a revisit record: the head only).
        #[arg(long, requires = "warc_out")]
        append: bool,
    },
    /// Load recorded responses from WARC files (or directories of them) and index them.
    Replay {
        files: Vec<PathBuf>,
        /// Compare the index with this export (a golden file): print what differs, exit 1 if
        /// anything does. The store is kept in memory unless --data is given.
        #[arg(long, value_name = "GOLDEN.jsonl")]
        expect: Option<PathBuf>,
        /// With --expect: write the index into the golden file instead of comparing.
        #[arg(long, requires = "expect")]
        update: bool,
        /// With --expect: also write the comparison as a JUnit XML report.
        #[arg(long, requires = "expect", value_name = "FILE")]
        junit: Option<PathBuf>,
        /// With --expect: also write the comparison as a self-contained HTML page (`-`:
        /// standard output, in place of the text).
        #[arg(long, requires = "expect", value_name = "FILE")]
        html: Option<PathBuf>,
        /// With --expect: how many of each kind of difference to print.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Compare two exports: pages added and removed, fields and inlinks changed (exit 0 when
    /// equal, 1 when different, 2 on bad input).
    Diff {
        /// The export before (`-`: standard input).
        old: PathBuf,
        /// The export after.
        new: PathBuf,
        /// Print the differences as one JSON object.
        #[arg(long)]
        json: bool,
        /// Also write the differences as a self-contained HTML page (`-`: standard output, in
        /// place of the text).
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// How many of each kind of difference to print.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Print the canonical URL of a page (exit 1 if the page is unknown).
    Canonical { url: String },
    /// Print a page's indexed record as JSON.
    Page { url: String },
    /// Search the index: the best pages for the words of QUERY, best first, one JSON object
    /// a line (url, title, score, in_degree, pagerank, lang, snippet); exit 1 if none matches. Brings
    /// the search index (DATA/search) up to date with the store first.
    Search {
        #[arg(required = true)]
        query: Vec<String>,
        /// How many pages at most (up to search.limit_max).
        #[arg(long, default_value_t = 10)]
        limit: u64,
        /// Only pages whose main text is in this language (ISO 639-3: eng, deu, fra, ...).
        #[arg(long)]
        lang: Option<String>,
    },
    /// Write the export snapshot as JSON Lines, sorted by URL (`--out -`: standard output).
    Export {
        #[arg(long)]
        out: PathBuf,
        /// The link graph instead: one line an edge (from, to, the page it counts for,
        /// anchor), sorted by (to, from).
        #[arg(long)]
        links: bool,
    },
    /// Fetch known pages again and update the index incrementally.
    Refetch {
        urls: Vec<String>,
        #[arg(long)]
        all: bool,
    },
    /// Pages, clusters, pending notifications, per-observer counters.
    Status,
    /// Process pending notifications until none is left.
    Wait,
    /// Collect old versions, then rewrite the sled store's files from what is live (sled
    /// gives space back slowly: a store is often 2-6 times its data after a large load). The
    /// store must not be in use: stop perc serve and perc worker first.
    Compact,
    /// Write a deterministic synthetic web: a site directory and/or a WARC (see perc-synth).
    Generate {
        /// Pages in the web.
        #[arg(long)]
        pages: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Write it as a site directory (p/<i>.html and _redirects), servable by any server.
        #[arg(long)]
        site: Option<PathBuf>,
        /// Write it as a WARC (.warc.gz) for `perc replay`.
        #[arg(long)]
        warc: Option<PathBuf>,
        /// The URL the WARC's pages live under.
        #[arg(long, default_value = "http://synth.test/")]
        base: String,
        /// Instead: change this many pages of the site already in --site (version --version),
        /// and print their paths, for `perc refetch`.
        #[arg(long)]
        change: Option<usize>,
        #[arg(long, default_value_t = 1)]
        version: u32,
    },
    /// Distributed mode: serve timestamps to every perc process sharing the store.
    Oracle {
        /// Where to listen, host:port (e.g. 127.0.0.1:7070; port 0 picks a free one).
        #[arg(long)]
        listen: String,
    },
    /// Distributed mode: run observers on the shared store until stopped (SIGTERM, Ctrl-C).
    Worker,
    /// Keep the index current and answer an HTTP API (docs/serve.md) until stopped
    /// (SIGTERM, Ctrl-C): the observers run as in `perc worker`.
    Serve {
        /// Seeds to crawl (one URL a line; - reads stdin), added when it starts.
        #[arg(long)]
        seeds: Option<PathBuf>,
        /// Narrows the scope of the seeds to URLs starting with this (repeatable).
        #[arg(long = "prefix", requires = "seeds")]
        prefixes: Vec<String>,
        /// Where to listen, host:port (default: serve.listen; port 0 picks a free one).
        #[arg(long)]
        listen: Option<String>,
    },
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell):
    /// `perc completions bash > ~/.local/share/bash-completion/completions/perc`.
    Completions { shell: clap_complete::Shell },
    /// Print perc's manual page (roff): `perc man > perc.1 && man ./perc.1`.
    Man,
    /// Serve the bundled demo site on 127.0.0.1, crawl it, and show what perc knows.
    Demo {
        /// The site directory.
        #[arg(long, default_value = "fixtures/sites/demo")]
        site: PathBuf,
        /// Where to serve the site: a fixed port, so that a store kept from an earlier run
        /// has its URLs at the same address.
        #[arg(long, default_value = "127.0.0.1:8419")]
        listen: std::net::SocketAddr,
    },
}
