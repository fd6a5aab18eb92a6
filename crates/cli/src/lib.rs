//! The pieces of the `perc` binary that tests reuse: configuration, the assembled process,
//! and the static site server.

pub mod app;
pub mod config;
pub mod site;
