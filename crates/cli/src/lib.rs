//! The pieces of the `perc` binary that tests reuse: the static site server (the demo's and
//! the tests'). The system itself is assembled by `perc-pipeline`.

pub mod site;
