//! How the sled backend configures and opens its database: the settings a store was made
//! with (which sled refuses to change) and those it may, the page cache, the wait for a lock
//! a closing store still holds, and sled's errors as the store's.

use std::path::Path;

use crate::{Result, StoreError};

/// The size of sled's log segments in a new store. Larger segments leave less of the log to
/// garbage: after a replay and a collection, 8 MiB segments took the store on disk from 3.1 to
/// 2.3 times the bodies loaded against sled's default of 512 KiB, at the same speed
/// (docs/benchmarks.md). sled caps it at 16 MiB.
pub(crate) const SEGMENT_BYTES: usize = 8 << 20;

/// sled's `conf` file of the store at `path` (`key: value` lines and a binary checksum):
/// what the store was made with; empty for a new store.
pub(crate) fn stored_conf(path: &Path) -> String {
    std::fs::read(path.join("conf"))
        .map(|conf| String::from_utf8_lossy(&conf).into_owned())
        .unwrap_or_default()
}

/// The value of `key` in `conf` ([`stored_conf`]), if it is there and parses.
fn stored_setting<T: std::str::FromStr>(conf: &str, key: &str) -> Option<T> {
    conf.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
}

/// The segment size to open a store with: the one it was made with (`conf`; sled refuses
/// another), or [`SEGMENT_BYTES`] for a new store.
pub(crate) fn segment_bytes(conf: &str) -> usize {
    stored_setting(conf, "segment_size").unwrap_or(SEGMENT_BYTES)
}

/// Whether a store compresses its log: as it was made (`conf`; sled refuses a change), or
/// as `level` asks for a new store.
pub(crate) fn compressed(conf: &str, level: i32) -> bool {
    stored_setting(conf, "use_compression").unwrap_or(level > 0)
}

/// sled counts its page cache in the bytes a page takes in its log, which compression makes
/// about three times smaller: a compressed store's cache is given this share of
/// `cache_bytes`, so that the setting holds about the same memory either way (measured at
/// 100k pages: peak RSS 2.7 GB with the whole 256 MiB, 1.7 GB with a third; 1.7 GB
/// uncompressed).
const COMPRESSED_CACHE_DIVISOR: u64 = 3;

/// How long opening waits for a lock held by a store of this process that is closing.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether sled refused to open because another handle holds the database's lock file.
fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

/// sled's configuration for the store at `path`: what the store was made with where sled
/// refuses a change (`made`, [`stored_conf`]; empty for a new store), `options` for the rest.
pub fn sled_config(path: &Path, made: &str, options: &SledOptions) -> sled::Config {
    let compress = compressed(made, options.zstd_level);
    let cache_bytes =
        if compress { options.cache_bytes / COMPRESSED_CACHE_DIVISOR } else { options.cache_bytes };
    sled::Config::new()
        .path(path)
        .cache_capacity(cache_bytes)
        .flush_every_ms(Some(options.flush_every_ms))
        .mode(sled::Mode::HighThroughput)
        .segment_size(segment_bytes(made))
        .use_compression(compress)
        .compression_factor(options.zstd_level.clamp(1, 22))
}

/// Forgets the start of a store whose making a kill cut short. sled writes its `conf` first
/// and its log (`db`) after: with no log, nothing was ever stored, and sled would refuse to
/// open the directory ("corrupted data") until someone removed the `conf` by hand.
pub(crate) fn forget_unfinished_creation(path: &Path) -> Result<()> {
    let conf = path.join("conf");
    if !conf.exists() || path.join("db").exists() {
        return Ok(());
    }
    std::fs::remove_file(&conf).map_err(|e| StoreError::Io {
        backend: "sled",
        detail: format!("cannot remove {} to make the store again: {e}", conf.display()),
    })
}

/// Opens sled's database at `path`, waiting briefly for a lock that a store just dropped in
/// this process is letting go of.
pub(crate) fn open_db(path: &Path, config: &sled::Config) -> Result<sled::Db> {
    // A store just dropped in this process lets go of its lock file only when sled's
    // flusher thread has finished: wait for that, briefly, before calling it taken.
    let waited = std::time::Instant::now();
    loop {
        match config.open() {
            Ok(db) => return Ok(db),
            Err(e) if is_lock_error(&e) && waited.elapsed() < LOCK_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            // sled writes as it opens (its log's next segment): on a full disk even a
            // command that only reads cannot open the store, and says why.
            Err(sled::Error::Io(e)) if is_out_of_space(&e) => {
                return Err(StoreError::OutOfSpace {
                    backend: "sled",
                    detail: format!("cannot open the store at {}: {e}", path.display()),
                });
            }
            Err(e) if is_lock_error(&e) => {
                return Err(StoreError::InUse {
                    backend: "sled",
                    detail: format!(
                        "cannot open the store at {}: another process (or a store not closed \
                         in this one) holds it ({e})",
                        path.display()
                    ),
                });
            }
            Err(e) => {
                return Err(StoreError::Io {
                    backend: "sled",
                    detail: format!("cannot open the store at {}: {e}", path.display()),
                });
            }
        }
    }
}

/// Tuning for the sled backend.
#[derive(Clone, Debug)]
pub struct SledOptions {
    /// sled's page cache (of a compressed store, sled is given a third: it counts a page by
    /// its compressed size in the log; see `COMPRESSED_CACHE_DIVISOR`).
    pub cache_bytes: u64,
    /// sled's background flush interval; durability of acknowledged commits comes from
    /// [`Store::sync`], not from this.
    pub flush_every_ms: u64,
    /// The zstd level sled compresses what it writes to its log with; 0: no compression.
    /// Whether a store compresses is fixed when it is created (sled refuses a change); the
    /// level of an existing compressed store may change.
    pub zstd_level: i32,
    /// The size at which the value log seals a segment and starts the next.
    pub value_segment_bytes: u64,
}

impl Default for SledOptions {
    fn default() -> Self {
        SledOptions {
            cache_bytes: 128 * 1024 * 1024,
            flush_every_ms: 500,
            zstd_level: 1,
            value_segment_bytes: 64 << 20,
        }
    }
}

pub(crate) fn io(e: sled::Error) -> StoreError {
    match e {
        sled::Error::Corruption { .. } => {
            StoreError::Corrupt { backend: "sled", detail: e.to_string() }
        }
        sled::Error::Io(ref inner) if is_out_of_space(inner) => {
            StoreError::OutOfSpace { backend: "sled", detail: e.to_string() }
        }
        other => StoreError::Io { backend: "sled", detail: other.to_string() },
    }
}

/// An error of a file operation of the sled backend (`what` names it): out of space when the
/// disk is full, else I/O.
pub(crate) fn fs_error(what: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |e| {
        let detail = format!("{what}: {e}");
        if is_out_of_space(&e) {
            StoreError::OutOfSpace { backend: "sled", detail }
        } else {
            StoreError::Io { backend: "sled", detail }
        }
    }
}

/// ENOSPC (and EDQUOT, a quota that is full), however sled wrapped it.
fn is_out_of_space(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded)
        || matches!(e.raw_os_error(), Some(28) | Some(122))
        || e.to_string().contains("No space left on device")
}
