//! Wake-ups for workers waiting on an empty queue.

use super::*;

/// Wake-ups for workers waiting on an empty queue: on PostgreSQL a `LISTEN` on the channel that
/// every enqueue notifies (delivered when the enqueueing transaction commits); elsewhere a plain
/// timer, so the wait simply lasts the polling interval.
#[derive(Debug)]
pub struct Wakeups {
    pub(super) listener: Option<Listener>,
    pub(super) queues: Vec<String>,
}

/// The PostgreSQL channel enqueues notify, with the queue name as payload.
pub(crate) const CHANNEL: &str = "rowclaim_jobs";

impl Wakeups {
    /// Waits until a job of the queues is enqueued, or at most `max`. Returns whether a job came.
    pub async fn wait(&mut self, max: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + max;
        if self.listener.is_none() {
            tokio::time::sleep(max).await;
            return false;
        }
        match tokio::time::timeout_at(deadline, self.next()).await {
            Err(_) => false,
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                // The listener reconnects on the next call; until then, poll.
                tracing::debug!("listening for new jobs: {e}");
                tokio::time::sleep_until(deadline).await;
                false
            }
        }
    }

    /// Whether wake-ups come from the database (PostgreSQL LISTEN), not from a timer.
    pub fn listening(&self) -> bool {
        self.listener.is_some()
    }

    /// Waits, without a time limit, for a job of the queues to be enqueued. An error means the
    /// listening connection broke; the next call connects again. Never returns without a
    /// listener.
    pub(crate) async fn next(&mut self) -> Result<()> {
        let Some(listener) = self.listener.as_mut() else {
            return std::future::pending().await;
        };
        loop {
            let queue = listener.recv().await?;
            if self.queues.is_empty() || self.queues.contains(&queue) {
                return Ok(());
            }
        }
    }
}
