//! The pipeline's data: [`schema`] (row keys, column names, who writes what), [`records`]
//! (what the cells hold) and [`cells`] (reading and writing them through a transaction).

pub mod cells;
pub mod records;
pub mod schema;

pub use cells::*;
pub use records::*;
pub use schema::*;
