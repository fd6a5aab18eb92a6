//! The value log: the sled backend's large values (page bodies, raw responses, long lists)
//! kept out of sled, in append-only segment files, compressed, each content stored once.
//!
//! ```text
//!   DIR/values/00000007.seg   frame frame frame ...      (frame.rs; sealed at a set size)
//!   sled tree "values"        blake3(value) -> (segment, offset, frame length, value length)
//!   a row record's cell       Stored::Value { hash, len }
//! ```
//!
//! Why: such values are a third to a half of what a store holds, written once and never
//! changed in place, while sled's log keeps every node it rewrote until its cleaner gets to
//! it, and a record of every node in memory (key-value separation, as in WiscKey, RocksDB's
//! BlobDB, Badger). A value is named by its content: a duplicate page, or a recrawl that found
//! the page unchanged, adds a reference, not a copy.
//!
//! Writing: `put` names the value, and if the index knows the name (and the frame there holds
//! it) returns the name; else it appends a frame to the active segment and indexes it, both
//! under one lock, so that a segment is sealed (fsynced, and sled flushed) only with every
//! frame in it indexed. A frame reaches the OS (`write(2)`) before the row that refers to it
//! is written: a killed process keeps every frame some surviving row refers to. `sync`
//! fsyncs the active segment before sled flushes, so a commit a flush made durable refers to
//! durable frames. After a crash, opening reads the last segment, keeps it up to its last
//! whole frame, and indexes its frames again (sled may have lost index entries a kill cut
//! off before a flush).
//!
//! Cleaning (`clean.rs`): a pass marks every name a row record refers to, drops the index
//! entries of the others, and rewrites the sealed segments mostly dead, then removes them.
//! A pass runs when the bytes whose references were dropped since the last pass pass a share
//! of what the log holds (`maintain`), online: writers go on.
//!
//! Liveness, exactly: a value is live while some row record refers to it, in any version of
//! any cell; the transaction layer's collection pass is what drops old versions. A put that
//! meets a pass in progress records its name (`touched`), and the pass keeps every name
//! recorded so: a value found in the index during a pass is kept by it. A put holds a `pin`
//! from its lookup until its row is written, and a pass starts by waiting for the pins held,
//! so no row write that began before the pass escapes both its walk and `touched`.

mod clean;
mod frame;

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use bytes::Bytes;

use crate::sled_open::{fs_error, io};
use crate::{Result, StoreError};

pub use clean::Cleaned;

/// A value's name: blake3 of its bytes.
pub(crate) type Hash = [u8; 32];

/// A writer's hold on the cleaner, from its first put until its row is written
/// ([`Values::pin`]).
pub(crate) type Pin<'a> = RwLockReadGuard<'a, ()>;

/// A walk over every row record that gives each value name a record holds to its argument
/// (the sled backend's, for the cleaner's mark).
pub(crate) type Referenced<'a> = &'a dyn Fn(&mut dyn FnMut(&Hash)) -> Result<()>;

/// The sled tree of the index.
pub(crate) const INDEX: &str = "values";
/// The key, in sled's default tree, of the dropped bytes counted so far (`Values::dropped`),
/// kept by each `maintain` so that a restart does not forget what is due.
const DROPPED_KEY: &[u8] = b"perc/values/dropped";
/// The directory of the segments, in the store's.
const DIR: &str = "values";
/// The zstd level of the frames. Raw responses come compressed already (and are kept as they
/// are when zstd cannot shrink them); page records, export lines and lists are JSON.
const LEVEL: i32 = 3;
/// How often a read looks again for a value the cleaner moved while it read.
const READ_RETRIES: usize = 8;

/// Where a value's frame is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Loc {
    pub segment: u32,
    pub offset: u64,
    pub frame_len: u32,
    pub raw: u32,
}

impl Loc {
    fn encode(&self) -> [u8; 20] {
        let mut out = [0; 20];
        out[..4].copy_from_slice(&self.segment.to_be_bytes());
        out[4..12].copy_from_slice(&self.offset.to_be_bytes());
        out[12..16].copy_from_slice(&self.frame_len.to_be_bytes());
        out[16..].copy_from_slice(&self.raw.to_be_bytes());
        out
    }

    fn decode(b: &[u8]) -> Result<Loc> {
        if b.len() != 20 {
            return Err(corrupt("an index entry is not 20 bytes"));
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Ok(Loc {
            segment: u32_at(0),
            offset: u64::from_be_bytes(b[4..12].try_into().expect("8 bytes")),
            frame_len: u32_at(12),
            raw: u32_at(16),
        })
    }
}

/// The segment appended to.
struct Active {
    id: u32,
    file: Arc<File>,
    len: u64,
    synced: u64,
}

pub(crate) struct Values {
    dir: PathBuf,
    segment_bytes: u64,
    db: sled::Db,
    index: sled::Tree,
    /// A read handle on every segment, the active one too.
    segments: RwLock<BTreeMap<u32, Arc<File>>>,
    /// `None` until the first append after opening (opening seals the last segment).
    active: Mutex<Option<Active>>,
    next_id: AtomicU64,
    /// Held by a put from its lookup to its row's write; taken for writing as a pass starts.
    pins: RwLock<()>,
    marking: AtomicBool,
    /// Names (their first 8 bytes) put while a pass marks.
    touched: Mutex<HashSet<u64>>,
    /// Value bytes whose references were dropped since the last pass (an estimate of the
    /// dead: a dropped reference may not have been the last).
    dropped: AtomicU64,
    /// Value bytes the log held after the last pass, plus those appended since (from opening
    /// to the first pass, the segments' bytes: compressed, so fewer, and a pass comes sooner).
    held: AtomicU64,
    /// One pass at a time.
    cleaning: Mutex<()>,
}

/// The first 8 bytes of a name, as the cleaner's sets keep it.
fn short(hash: &Hash) -> u64 {
    u64::from_be_bytes(hash[..8].try_into().expect("8 bytes"))
}

fn corrupt(detail: &str) -> StoreError {
    StoreError::Corrupt { backend: "sled", detail: format!("value log: {detail}") }
}

fn segment_name(id: u32) -> String {
    format!("{id:08}.seg")
}

impl Values {
    /// Opens the value log of the store in `store_dir`, whose sled database is `db`.
    /// A segment is sealed when the next frame would take it past `segment_bytes` (a larger
    /// frame gets a segment of its own).
    pub fn open(store_dir: &Path, db: &sled::Db, segment_bytes: u64) -> Result<Values> {
        let dir = store_dir.join(DIR);
        fs::create_dir_all(&dir).map_err(fs_error(format!("cannot create {}", dir.display())))?;
        let index = db.open_tree(INDEX).map_err(io)?;
        let mut segments = BTreeMap::new();
        for entry in
            fs::read_dir(&dir).map_err(fs_error(format!("cannot list {}", dir.display())))?
        {
            let entry = entry.map_err(fs_error(format!("cannot list {}", dir.display())))?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".seg")) else { continue };
            let Ok(id) = id.parse::<u32>() else { continue };
            let path = entry.path();
            let file =
                File::open(&path).map_err(fs_error(format!("cannot open {}", path.display())))?;
            segments.insert(id, Arc::new(file));
        }
        let last = segments.keys().next_back().copied();
        let values = Values {
            dir,
            segment_bytes,
            db: db.clone(),
            index,
            segments: RwLock::new(segments),
            active: Mutex::new(None),
            next_id: AtomicU64::new(u64::from(last.map_or(1, |l| l + 1))),
            pins: RwLock::new(()),
            marking: AtomicBool::new(false),
            touched: Mutex::new(HashSet::new()),
            dropped: AtomicU64::new(match db.get(DROPPED_KEY).map_err(io)? {
                Some(v) => u64::from_be_bytes(
                    v.as_ref().try_into().map_err(|_| corrupt("the dropped count is not a u64"))?,
                ),
                None => 0,
            }),
            held: AtomicU64::new(0),
            cleaning: Mutex::new(()),
        };
        if let Some(last) = last {
            values.recover(last)?;
        }
        values.held.store(values.disk_bytes()?, Ordering::Relaxed);
        Ok(values)
    }

    /// Keeps segment `id` (the last: the only one a crash may have cut short) up to its last
    /// whole frame, and indexes its frames.
    fn recover(&self, id: u32) -> Result<()> {
        let path = self.dir.join(segment_name(id));
        let bytes = fs::read(&path).map_err(fs_error(format!("cannot read {}", path.display())))?;
        let (mut at, mut frames) = (0usize, Vec::new());
        while at + frame::HEADER <= bytes.len() {
            let header = frame::Header::parse(bytes[at..at + frame::HEADER].try_into().unwrap());
            let end = at as u64 + header.frame_len();
            if end > bytes.len() as u64 || !frame::whole(&bytes[at..end as usize]) {
                break;
            }
            let loc = Loc {
                segment: id,
                offset: at as u64,
                frame_len: header.frame_len() as u32,
                raw: header.raw,
            };
            frames.push((header.hash, loc));
            at = end as usize;
        }
        if at < bytes.len() {
            let f = OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(fs_error(format!("cannot open {}", path.display())))?;
            f.set_len(at as u64)
                .map_err(fs_error(format!("cannot truncate {}", path.display())))?;
            f.sync_all().map_err(fs_error(format!("cannot sync {}", path.display())))?;
        }
        // With the torn tail gone, a frame before a segment's end is whole: `holds` may
        // judge an entry by its frame's header.
        for (hash, loc) in frames {
            if !self.holds(&hash)? {
                self.index.insert(hash, &loc.encode()).map_err(io)?;
            }
        }
        self.db.flush().map_err(io)?;
        Ok(())
    }

    /// Bytes of the segments on disk.
    pub fn disk_bytes(&self) -> Result<u64> {
        let segments = self.segments.read().expect("segments");
        let mut total = 0;
        for file in segments.values() {
            total += file.metadata().map_err(fs_error("cannot stat a segment".into()))?.len();
        }
        Ok(total)
    }

    /// What the value log holds, as a tree of [`Usage`](crate::Usage): its index entries,
    /// their names' bytes, and the bytes of the values they name.
    pub fn usage(&self) -> Result<crate::TreeUsage> {
        let mut t = crate::TreeUsage { name: "value log".into(), ..crate::TreeUsage::default() };
        for entry in self.index.iter() {
            let (k, v) = entry.map_err(io)?;
            t.keys += 1;
            t.key_bytes += k.len() as u64;
            t.value_bytes += u64::from(Loc::decode(&v)?.raw);
        }
        Ok(t)
    }

    /// Held by a writer from its first [`Values::put`] until its row is written.
    pub fn pin(&self) -> Pin<'_> {
        self.pins.read().expect("pins")
    }

    /// Stores `value` (if its content is not stored yet) and returns its name. The caller
    /// holds a [`Values::pin`] until the row that refers to the name is written.
    pub fn put(&self, _pin: &Pin<'_>, value: &[u8]) -> Result<Hash> {
        let hash = *blake3::hash(value).as_bytes();
        if self.marking.load(Ordering::SeqCst) {
            self.touched.lock().expect("touched").insert(short(&hash));
        }
        if self.holds(&hash)? {
            return Ok(hash);
        }
        let frame = frame::encode(&hash, value, LEVEL)
            .map_err(|e| StoreError::Io { backend: "sled", detail: format!("zstd: {e}") })?;
        self.append(&hash, &frame, value.len() as u32, None)?;
        clean::crash_point("values.after-append");
        self.held.fetch_add(value.len() as u64, Ordering::Relaxed);
        Ok(hash)
    }

    /// Appends a whole frame and indexes it there: in place of what the index said, or, for
    /// a frame the cleaner `moving` from another place, only if the index still says that.
    fn append(&self, hash: &Hash, frame: &[u8], raw: u32, moving: Option<&Loc>) -> Result<()> {
        let mut active = self.active.lock().expect("active");
        let full = active
            .as_ref()
            .is_some_and(|a| a.len > 0 && a.len + frame.len() as u64 > self.segment_bytes);
        if full || active.is_none() {
            if let Some(old) = active.take() {
                // Sealed: its frames durable, and their index entries (written under this
                // lock) flushed, so that opening need read no segment but the last.
                old.file.sync_all().map_err(fs_error("cannot sync a segment".into()))?;
                self.db.flush().map_err(io)?;
            }
            *active = Some(self.create_segment()?);
        }
        let a = active.as_mut().expect("an active segment");
        let loc = Loc { segment: a.id, offset: a.len, frame_len: frame.len() as u32, raw };
        (&*a.file)
            .write_all(frame)
            .map_err(fs_error(format!("cannot append to segment {}", a.id)))?;
        a.len += frame.len() as u64;
        match moving {
            None => {
                self.index.insert(hash, &loc.encode()).map_err(io)?;
            }
            Some(from) => {
                let (from, to) = (from.encode(), loc.encode());
                // Refused: the entry was dropped or replaced meanwhile; the copy is dead.
                let _ = self
                    .index
                    .compare_and_swap(hash, Some(&from[..]), Some(&to[..]))
                    .map_err(io)?;
            }
        }
        Ok(())
    }

    fn create_segment(&self) -> Result<Active> {
        let id = u32::try_from(self.next_id.fetch_add(1, Ordering::SeqCst))
            .map_err(|_| corrupt("segment ids exhausted"))?;
        let path = self.dir.join(segment_name(id));
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(fs_error(format!("cannot create {}", path.display())))?;
        let read =
            File::open(&path).map_err(fs_error(format!("cannot open {}", path.display())))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(fs_error(format!("cannot sync {}", self.dir.display())))?;
        self.segments.write().expect("segments").insert(id, Arc::new(read));
        Ok(Active { id, file: Arc::new(file), len: 0, synced: 0 })
    }

    /// The index's entry for `hash`.
    fn entry(&self, hash: &Hash) -> Result<Option<Loc>> {
        self.index.get(hash).map_err(io)?.map(|raw| Loc::decode(&raw)).transpose()
    }

    /// `len` bytes from `loc`'s offset in its segment; `None` if the segment is gone (the
    /// cleaner removed it) or ends before them (an entry a crash left past a torn tail).
    fn read_at(&self, loc: &Loc, len: usize) -> Result<Option<Vec<u8>>> {
        let file = self.segments.read().expect("segments").get(&loc.segment).cloned();
        let Some(file) = file else { return Ok(None) };
        let mut buf = vec![0; len];
        match file.read_exact_at(&mut buf, loc.offset) {
            Ok(()) => Ok(Some(buf)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(fs_error(format!("cannot read segment {}", loc.segment))(e)),
        }
    }

    /// The frame at `loc`, if it is there and whole.
    fn frame_at(&self, loc: &Loc) -> Result<Option<Vec<u8>>> {
        Ok(self.read_at(loc, loc.frame_len as usize)?.filter(|f| frame::whole(f)))
    }

    /// The frame the index says holds `hash`, if it is whole and holds it (an entry a crash
    /// left pointing past a segment's end, or at another frame, is no entry).
    fn locate(&self, hash: &Hash) -> Result<Option<Vec<u8>>> {
        let Some(loc) = self.entry(hash)? else { return Ok(None) };
        let frame = self.frame_at(&loc)?;
        Ok(frame.filter(|f| {
            frame::Header::parse(f[..frame::HEADER].try_into().expect("a header")).hash == *hash
        }))
    }

    /// Whether the index has `hash` and the frame it points at is named so. Only the header
    /// is read: a frame before a segment's end is whole (opening cut the torn tail a crash
    /// left, and appends after it go to a new segment), so a put may name it.
    fn holds(&self, hash: &Hash) -> Result<bool> {
        let Some(loc) = self.entry(hash)? else { return Ok(false) };
        let Some(buf) = self.read_at(&loc, frame::HEADER)? else { return Ok(false) };
        let header = frame::Header::parse(buf[..].try_into().expect("a header"));
        Ok(header.hash == *hash && header.frame_len() == u64::from(loc.frame_len))
    }

    /// The value named `hash`; `None` if the log does not hold it.
    pub fn get(&self, hash: &Hash) -> Result<Option<Bytes>> {
        for _ in 0..READ_RETRIES {
            match self.locate(hash)? {
                Some(buf) => {
                    let value = frame::decode(&buf).map_err(|e| corrupt(&e.to_string()))?;
                    return Ok(Some(Bytes::from(value)));
                }
                // The cleaner may have moved it between the index's answer and the read:
                // the index has its new place.
                None if self.index.contains_key(hash).map_err(io)? => continue,
                None => return Ok(None),
            }
        }
        Err(corrupt("an index entry points at no frame that holds its value"))
    }

    /// Notes that references to `bytes` of values were dropped (a row rewritten without
    /// them, or a write that did not happen): what decides when a pass is due.
    pub fn dropped(&self, bytes: u64) {
        self.dropped.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Whether frames were appended since the last [`Values::sync`].
    pub fn unsynced(&self) -> bool {
        self.active.lock().expect("active").as_ref().is_some_and(|a| a.len > a.synced)
    }

    /// Makes every frame appended so far durable.
    pub fn sync(&self) -> Result<()> {
        let (file, id, len) = {
            let active = self.active.lock().expect("active");
            match active.as_ref() {
                Some(a) if a.len > a.synced => (a.file.clone(), a.id, a.len),
                _ => return Ok(()),
            }
        };
        file.sync_data().map_err(fs_error(format!("cannot sync segment {id}")))?;
        if let Some(a) = self.active.lock().expect("active").as_mut() {
            if a.id == id {
                a.synced = a.synced.max(len);
            }
        }
        Ok(())
    }

    /// Runs a cleaning pass if one is due: the bytes whose references were dropped since the
    /// last are over a fifth of what the log holds.
    pub fn maintain(&self, referenced: Referenced<'_>) -> Result<Option<Cleaned>> {
        let dropped = self.dropped.load(Ordering::Relaxed);
        let held = self.held.load(Ordering::Relaxed);
        let cleaned =
            if dropped < (held / 5).max(1 << 20) { None } else { Some(self.clean(referenced)?) };
        let count = self.dropped.load(Ordering::Relaxed).to_be_bytes();
        self.db.insert(DROPPED_KEY, &count).map_err(io)?;
        Ok(cleaned)
    }
}
