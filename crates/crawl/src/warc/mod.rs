//! Recorded crawls: reading WARC response records for `perc replay`, and writing request and
//! response records for `perc crawl --warc-out`.
//!
//! A `.warc.gz` file is read one gzip member at a time (perc writes one member per record, as
//! wget and Heritrix do), so that a corrupt or truncated member is reported with the file and
//! the byte offset where it starts, and reading resumes at the next member: the good records
//! around a bad one still load. A plain `.warc` is read record by record the same way. Each
//! record is parsed by the `warc` crate; a response record's payload (an HTTP response) by
//! `httparse`, then de-chunked and decompressed as recorded, under the same body cap as a
//! live fetch.
//!
//! A `revisit` record (an unchanged refetch, written without its payload) reads as the
//! response it stands for, the payload taken from the record it refers to; `Recorder`
//! writes one when a URL's payload is the same as at its last capture in the file.
//!
//! Bounds: a record is inflated or read only up to the body cap plus [`HEAD_BYTES_MAX`]
//! twice (its WARC headers and its HTTP head); a larger one is skipped with an issue naming
//! file and offset, its gzip member inflated into nothing to find where the next one starts,
//! so memory stays at one capped record whatever the file holds.
//!
//! The module `read` reads (`read`, `read_each`: records and issues); `write` records
//! (`Recorder`); `tests` checks each against the other.

mod read;
#[cfg(test)]
mod tests;
mod write;

pub use read::{expand, parse_http, read, read_each, Recorded, WarcIssue};
pub use write::Recorder;

/// The most bytes a record's WARC header block may have (and, separately, its HTTP head).
pub const HEAD_BYTES_MAX: u64 = 64 * 1024;

/// The largest record read: the body cap and two header allowances.
pub(crate) fn record_bytes_max(body_bytes_max: u64) -> u64 {
    body_bytes_max.saturating_add(2 * HEAD_BYTES_MAX)
}
