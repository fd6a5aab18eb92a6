//! The pipeline's data: [`schema`] (row keys, column names, who writes what), [`records`]
//! (what the cells hold), [`cells`] (reading and writing them through a transaction) and
//! [`signals`] (the writes by which a stage tells another that its input changed).

pub mod cells;
pub mod records;
pub mod schema;
pub mod signals;

pub use cells::*;
pub use records::*;
pub use schema::*;
