//! The pages: every GET only reads. Every value reaches the page through maud, which escapes it;
//! the database is named only by its endpoint (no password).
//!
//! - `overview.rs`: `/`, every managed queue, schedule and recorded source, problem ones first;
//! - `queues.rs`: `/queues/{queue}`, one queue (counts, charts, holders, its jobs), and the
//!   schedules' table;
//! - `jobs.rs`: `/jobs/{id}`, one job and its timeline;
//! - `job_list.rs`: `/jobs`, jobs of every queue searched, and the list a queue's page shows
//!   (pages both ways, the actions on all matching or ticked jobs);
//! - `sources.rs`: `/sources/{table}`, a recorded table, and `/sources/{table}/rows/{id}`, a row;
//! - `actions.rs`: `/actions`, what was done through the dashboard;
//! - `workers.rs`: `/workers`, the registered workers, and the queue page's holders by process.

pub mod actions;
pub mod job_list;
pub mod jobs;
pub mod overview;
pub mod queues;
pub mod sources;
pub mod workers;
