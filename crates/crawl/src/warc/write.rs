//! Writing WARC files: a request and a response record for each fetch (`perc crawl
//! --warc-out`), or a revisit record when the payload is the same as at the URL's last
//! capture in the file.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use url::Url;
use warc::{Record, RecordBuilder, RecordType, WarcHeader, WarcWriter};

use crate::fetch::Response;

use super::read::{Member, Members};
use super::HEAD_BYTES_MAX;

/// Writes request and response records, one gzip member each. Each member is built in
/// memory and written with one call, so that the file ends on a record boundary whenever
/// the process stops short of being killed mid-write.
///
/// Each run begins with a `warcinfo` record (software, format, robots policy) that every
/// later record names (`WARC-Warcinfo-ID`); every record carries `WARC-Block-Digest`, a
/// response also `WARC-Payload-Digest` (SHA-1 in base32, as other WARC tools write and
/// check them), and `WARC-Concurrent-To` links a response to its request.
///
/// A refetch whose payload is the same as the URL's last capture in this file (this run's,
/// or an earlier run's when appending) is a `revisit` record of the identical-payload-digest
/// profile, as Heritrix writes them: the HTTP head only, `WARC-Refers-To` the capture. A 304
/// (the answer to a conditional refetch) with a capture to refer to is a revisit of the
/// server-not-modified profile, which reads back as that capture.
pub struct Recorder {
    out: File,
    path: PathBuf,
    warcinfo: String,
    /// Each URL's last capture with a payload in the file.
    last: HashMap<String, Capture>,
}

/// The record that holds a payload, for the revisits that refer to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Capture {
    id: String,
    date: Option<String>,
    digest: String,
}

/// The profile of a revisit record whose payload is the one its original holds (WARC 1.0,
/// the version the records are written in).
pub(super) const IDENTICAL_PAYLOAD: &str =
    "http://netpreserve.org/warc/1.0/revisit/identical-payload-digest";

/// The profile of a revisit record of a 304: the server said the capture it refers to is
/// still current.
pub(super) const NOT_MODIFIED: &str = "http://netpreserve.org/warc/1.0/revisit/server-not-modified";

/// `sha1:` and the base32 SHA-1 of `bytes`.
pub(super) fn digest(bytes: &[u8]) -> String {
    use sha1::Digest;
    format!("sha1:{}", data_encoding::BASE32.encode(&sha1::Sha1::digest(bytes)))
}

impl Recorder {
    /// A new WARC at `path`. An existing file is refused, unless `append` (then new records
    /// go after the ones it has); nothing already recorded is ever truncated.
    pub fn create(path: &Path, append: bool) -> io::Result<Recorder> {
        let mut options = File::options();
        if append {
            options.append(true).create(true);
        } else {
            options.write(true).create_new(true);
        }
        let file = options.open(path).map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::AlreadyExists {
                " (it would be overwritten: give another file, or --append to add to it)"
            } else {
                ""
            };
            io::Error::new(e.kind(), format!("{}: {e}{hint}", path.display()))
        })?;
        let last = match append {
            true => captures(path)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?,
            false => HashMap::new(),
        };
        let mut recorder =
            Recorder { out: file, path: path.to_path_buf(), warcinfo: String::new(), last };
        recorder.warcinfo = recorder.write_warcinfo()?.0;
        Ok(recorder)
    }

    /// The run's `warcinfo` record; its record id and date.
    fn write_warcinfo(&mut self) -> io::Result<(String, Option<String>)> {
        let fields = format!(
            "software: perc/{}\r\nformat: WARC File Format 1.0\r\nrobots: obey\r\n",
            env!("CARGO_PKG_VERSION")
        );
        let filename = self.path.file_name().map(|f| f.to_string_lossy().into_owned());
        let id = Record::<warc::BufferedBody>::generate_record_id();
        let mut record = RecordBuilder::default()
            .warc_type(RecordType::WarcInfo)
            .warc_id(id.clone())
            .header(WarcHeader::ContentType, "application/warc-fields")
            .header(WarcHeader::BlockDigest, digest(fields.as_bytes()));
        if let Some(name) = filename {
            record = record.header(WarcHeader::Filename, name);
        }
        self.write(record.body(fields.into_bytes()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records one exchange: the status line and header fields as received, the payload as
    /// perc received it after transfer decoding, so replaying it gives the same bytes. The
    /// fields that described the encoding (`Content-Length`, `Content-Encoding`,
    /// `Transfer-Encoding`) are kept prefixed `X-Crawler-` (Common Crawl's convention) and a
    /// `Content-Length` of the stored payload ends the head. A payload the URL's last capture
    /// holds already is recorded as a revisit of it (the head only).
    pub fn record(&mut self, url: &Url, user_agent: &str, response: &Response) -> io::Result<()> {
        let request = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: {user_agent}\r\n\r\n",
            &url[url::Position::BeforePath..],
            url.authority()
        );
        let request_id = Record::<warc::BufferedBody>::generate_record_id();
        self.member(
            url,
            RecordBuilder::default()
                .warc_type(RecordType::Request)
                .warc_id(request_id.clone())
                .header(WarcHeader::ContentType, "application/http; msgtype=request"),
            request.into_bytes(),
            None,
        )?;
        let mut http = Vec::new();
        match &response.received {
            Some(head) => {
                let line =
                    format!("{} {} {}\r\n", head.version, response.status, reason(response.status));
                http.extend_from_slice(line.as_bytes());
                for (name, value) in &head.headers {
                    // The payload is stored decoded (de-chunked, decompressed): the fields
                    // that described its encoding are kept under another name, as Common
                    // Crawl does, and a Content-Length of the stored payload follows.
                    if matches!(
                        name.to_ascii_lowercase().as_str(),
                        "content-length" | "content-encoding" | "transfer-encoding"
                    ) {
                        http.extend_from_slice(b"X-Crawler-");
                    }
                    http.extend_from_slice(name.as_bytes());
                    http.extend_from_slice(b": ");
                    http.extend_from_slice(value);
                    http.extend_from_slice(b"\r\n");
                }
            }
            None => {
                // A response perc did not receive over HTTP: the head it implies.
                let mut head =
                    format!("HTTP/1.1 {} {}\r\n", response.status, reason(response.status));
                if let Some(ct) = &response.content_type {
                    match &response.charset {
                        Some(cs) => head.push_str(&format!("Content-Type: {ct}; charset={cs}\r\n")),
                        None => head.push_str(&format!("Content-Type: {ct}\r\n")),
                    }
                }
                if let Some(l) = &response.location {
                    head.push_str(&format!("Location: {l}\r\n"));
                }
                if let Some(r) = response.retry_after_s {
                    head.push_str(&format!("Retry-After: {r}\r\n"));
                }
                http.extend_from_slice(head.as_bytes());
            }
        }
        http.extend_from_slice(
            format!("Content-Length: {}\r\n\r\n", response.body.len()).as_bytes(),
        );
        let payload = digest(&response.body);
        let response_record = RecordBuilder::default()
            .header(WarcHeader::ContentType, "application/http; msgtype=response")
            .header(WarcHeader::ConcurrentTo, request_id);
        let previous = self.last.get(url.as_str()).cloned();
        // A 304 answers a conditional refetch: the last capture stands (server-not-modified).
        let not_modified = response.status == 304;
        if let Some(capture) =
            previous.filter(|c| not_modified || (c.digest == payload && !response.body.is_empty()))
        {
            let profile = if not_modified { NOT_MODIFIED } else { IDENTICAL_PAYLOAD };
            let mut revisit = response_record
                .warc_type(RecordType::Revisit)
                .header(WarcHeader::Profile, profile)
                .header(WarcHeader::RefersTo, capture.id.clone())
                .header(WarcHeader::Unknown("WARC-Refers-To-Target-URI".into()), url.as_str());
            if let Some(date) = &capture.date {
                revisit =
                    revisit.header(WarcHeader::Unknown("WARC-Refers-To-Date".into()), date.clone());
            }
            let digest = if not_modified { None } else { Some(payload) };
            self.member(url, revisit, http, digest)?;
            return Ok(());
        }
        let mut block = http;
        block.extend_from_slice(&response.body);
        let (id, date) = self.member(
            url,
            response_record.warc_type(RecordType::Response),
            block,
            Some(payload.clone()),
        )?;
        if !response.body.is_empty() {
            self.last.insert(url.to_string(), Capture { id, date, digest: payload });
        }
        Ok(())
    }

    /// One record about `url` whose block is `block`; `payload_digest`, the digest of the
    /// HTTP body it holds or stands for. Its record id and date.
    fn member(
        &mut self,
        url: &Url,
        record: RecordBuilder,
        block: Vec<u8>,
        payload_digest: Option<String>,
    ) -> io::Result<(String, Option<String>)> {
        let mut record = record
            .header(WarcHeader::TargetURI, url.as_str())
            .header(WarcHeader::WarcInfoID, self.warcinfo.clone())
            .header(WarcHeader::BlockDigest, digest(&block));
        if let Some(payload) = payload_digest {
            record = record.header(WarcHeader::PayloadDigest, payload);
        }
        self.write(record.body(block))
    }

    /// Writes `record` as one gzip member, with one call; its record id and date.
    fn write(&mut self, record: RecordBuilder) -> io::Result<(String, Option<String>)> {
        let record = record.build().map_err(|e| io::Error::other(e.to_string()))?;
        let mut plain = WarcWriter::new(io::BufWriter::new(Vec::new()));
        plain.write(&record)?;
        let plain = plain.into_inner().map_err(|e| io::Error::other(e.to_string()))?;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&plain)?;
        self.out.write_all(&gz.finish()?)?;
        let date = record.header(WarcHeader::Date).map(|d| d.into_owned());
        Ok((record.warc_id().to_string(), date))
    }

    /// Makes every record written so far durable.
    pub fn finish(self) -> io::Result<()> {
        self.out.sync_all()
    }
}

/// The last capture with a payload of each URL in the WARC at `path` (an empty map for an
/// empty file): a response record, or the capture a revisit refers to. Reads each record's
/// WARC head only; a member that does not inflate is passed over (the reader reports it).
pub(super) fn captures(path: &Path) -> io::Result<HashMap<String, Capture>> {
    let mut last = HashMap::new();
    let mut members = Members::open(path)?;
    let mut offset = 0;
    loop {
        match members.at(offset, HEAD_BYTES_MAX + 4, false)? {
            Member::End => break,
            Member::Record { bytes, next } => {
                offset = next;
                if let Some((url, capture)) = capture(&bytes) {
                    last.insert(url, capture);
                }
            }
            Member::Oversize { next } => offset = next,
            Member::Corrupt { next: Some(next), .. } => offset = next,
            Member::Corrupt { next: None, .. } => break,
        }
    }
    Ok(last)
}

/// The URL and capture a record's WARC head names, if it is a response or revisit with a
/// payload digest.
pub(super) fn capture(head: &[u8]) -> Option<(String, Capture)> {
    let (_, (_, fields, _)) = warc::parser::headers(head).ok()?;
    let get = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
            .map(|v| v.trim().to_string())
    };
    let uri = get("WARC-Target-URI")?;
    let url = crate::urls::normalize(uri.trim_matches(|c| c == '<' || c == '>')).ok()?;
    let digest = get("WARC-Payload-Digest")?;
    let capture = match get("WARC-Type")?.as_str() {
        "response" => Capture { id: get("WARC-Record-ID")?, date: get("WARC-Date"), digest },
        "revisit" => {
            Capture { id: get("WARC-Refers-To")?, date: get("WARC-Refers-To-Date"), digest }
        }
        _ => return None,
    };
    Some((url.to_string(), capture))
}

/// The status line's reason phrase (empty for a code HTTP does not name).
pub(super) fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("")
}
