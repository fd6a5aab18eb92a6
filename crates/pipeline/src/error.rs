//! What can go wrong in the front door, in kinds a caller acts on differently: a store that
//! is not there, a full disk, an interruption, a bad configuration or input, a failure below.

use perc_observers::IndexError;
use perc_oracle::OracleError;
use perc_store::StoreError;
use perc_txn::TxnError;

use crate::config::ConfigError;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// A command that needs an index found no store (a typo in `--data`, most likely).
    #[error("{}", no_store(dir))]
    NoStore { dir: String },
    /// The disk is full: what was committed before is intact.
    #[error("no space left on device ({0})")]
    OutOfSpace(StoreError),
    /// Stopped by SIGINT or SIGTERM: what it did is saved, and the same command resumes it.
    #[error("interrupted")]
    Interrupted,
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Input the caller gave that cannot be used (a scope prefix, a URL).
    #[error("{0}")]
    Input(String),
    /// The configured store, oracle or fetcher cannot be set up.
    #[error("{0}")]
    Setup(String),
    /// Another process holds the store (sled admits one).
    #[error("{0}")]
    InUse(String),
    /// The store or the oracle did not answer within the time allowed for it.
    #[error("{0}")]
    Unavailable(String),
    /// Reading or writing a file the caller named. (Not `source`: the message says it
    /// already, and a chain printed with `{:#}` would say it twice.)
    #[error("{what}: {cause}")]
    Io { what: String, cause: std::io::Error },
    /// The index holds something it cannot read.
    #[error(transparent)]
    Index(IndexError),
    #[error(transparent)]
    Txn(TxnError),
}

pub type Result<T, E = PipelineError> = std::result::Result<T, E>;

impl PipelineError {
    /// Whether the failure was below the command (the store or the oracle failed or did not
    /// answer, a lock did not clear in time) rather than in what it was given: what was
    /// committed is intact and the same command may succeed later.
    pub fn is_below(&self) -> bool {
        match self {
            PipelineError::Unavailable(_) => true,
            PipelineError::Txn(t) => !matches!(t, TxnError::Corrupt(_)),
            _ => false,
        }
    }
}

fn no_store(dir: &str) -> String {
    if dir == crate::MEMORY {
        return "no perc store at :memory:: a memory store is new and empty at every command, \
                so only crawl and replay can use one"
            .into();
    }
    format!("no perc store at {dir} (perc crawl and perc replay create one; --data picks another)")
}

impl From<TxnError> for PipelineError {
    fn from(e: TxnError) -> PipelineError {
        match e.out_of_space() {
            Some(s) => PipelineError::OutOfSpace(s.clone()),
            None => PipelineError::Txn(e),
        }
    }
}

impl From<StoreError> for PipelineError {
    fn from(e: StoreError) -> PipelineError {
        TxnError::Store(e).into()
    }
}

impl From<OracleError> for PipelineError {
    fn from(e: OracleError) -> PipelineError {
        TxnError::Oracle(e).into()
    }
}

impl From<IndexError> for PipelineError {
    fn from(e: IndexError) -> PipelineError {
        match e {
            IndexError::Txn(t) => t.into(),
            other => PipelineError::Index(other),
        }
    }
}

impl PipelineError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PipelineError {
        let what = what.into();
        move |cause| PipelineError::Io { what, cause }
    }
}
