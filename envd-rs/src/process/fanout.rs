//! Fan-out of a process's events to any number of readers
//! (envd/internal/process/fanout.go): every reader sees every value in one
//! order. An observer never holds up the producer: a full buffer cuts it
//! with an overflow. A blocking reader (the client that started the
//! process) applies backpressure: while it is attached and a full buffer
//! behind, publish waits for it, until the fanout is released.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

struct Entry<T> {
    id: u64,
    tx: mpsc::Sender<T>,
    blocking: bool,
    overflow: Arc<AtomicBool>,
}

struct Inner<T> {
    next: u64,
    subs: Vec<Entry<T>>,
    closed: bool,
}

pub struct Fanout<T> {
    size: usize,
    /// Serializes publish and finish, so all readers see one order.
    publishing: tokio::sync::Mutex<()>,
    inner: Mutex<Inner<T>>,
    released: watch::Sender<bool>,
}

/// Subscription is one reader: values until the channel ends; `overflowed`
/// says, once it has ended, whether the reader was cut for falling behind.
pub struct Subscription<T> {
    pub rx: mpsc::Receiver<T>,
    overflow: Arc<AtomicBool>,
}

impl<T> Subscription<T> {
    pub fn overflowed(&self) -> bool {
        self.overflow.load(Ordering::SeqCst)
    }
}

impl<T: Clone> Fanout<T> {
    pub fn new(size: usize) -> Fanout<T> {
        Fanout {
            size,
            publishing: tokio::sync::Mutex::new(()),
            inner: Mutex::new(Inner {
                next: 0,
                subs: Vec::new(),
                closed: false,
            }),
            released: watch::channel(false).0,
        }
    }

    /// subscribe adds an observer; None once the fanout has finished.
    pub fn subscribe(&self) -> Option<Subscription<T>> {
        self.add(false)
    }

    /// subscribe_blocking adds a reader publish waits for.
    pub fn subscribe_blocking(&self) -> Option<Subscription<T>> {
        self.add(true)
    }

    fn add(&self, blocking: bool) -> Option<Subscription<T>> {
        let mut g = self.inner.lock().unwrap();
        if g.closed {
            return None;
        }
        let (tx, rx) = mpsc::channel(self.size);
        let overflow = Arc::new(AtomicBool::new(false));
        g.next += 1;
        let id = g.next;
        g.subs.push(Entry {
            id,
            tx,
            blocking,
            overflow: overflow.clone(),
        });
        Some(Subscription { rx, overflow })
    }

    fn is_released(&self) -> bool {
        *self.released.borrow()
    }

    /// publish hands v to every reader (see the module's doc).
    pub async fn publish(&self, v: T) {
        let _p = self.publishing.lock().await;
        let released = self.is_released();
        let mut wait = Vec::new();
        {
            let mut g = self.inner.lock().unwrap();
            g.subs.retain(|s| match s.tx.try_send(v.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) if s.blocking && !released => {
                    wait.push((s.id, s.tx.clone()));
                    true
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    s.overflow.store(true, Ordering::SeqCst);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
        }
        for (id, tx) in wait {
            let mut rel = self.released.subscribe();
            let sent = tokio::select! {
                r = tx.send(v.clone()) => r.is_ok(),
                _ = rel.wait_for(|r| *r) => false,
            };
            drop(tx);
            if sent {
                continue;
            }
            // Released while waiting (or the reader left): from now on an
            // observer.
            let mut g = self.inner.lock().unwrap();
            g.subs.retain(|s| {
                if s.id != id {
                    return true;
                }
                match s.tx.try_send(v.clone()) {
                    Ok(()) => true,
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        s.overflow.store(true, Ordering::SeqCst);
                        false
                    }
                    Err(_) => false,
                }
            });
        }
    }

    /// release stops blocking readers from holding up publish, from now on.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// finish publishes last and ends every reader after it, never waiting.
    /// A blocking reader whose buffer is full ends without last (it lost
    /// nothing; its stream sends the end itself); an observer overflows.
    pub async fn finish(&self, last: T) {
        let _p = self.publishing.lock().await;
        let mut g = self.inner.lock().unwrap();
        g.closed = true;
        for s in g.subs.drain(..) {
            if s.tx.try_send(last.clone()).is_err() && !s.blocking {
                s.overflow.store(true, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn observer_overflows_blocking_waits() {
        rt().block_on(async {
            let f = Arc::new(Fanout::<u32>::new(2));
            let mut obs = f.subscribe().unwrap();
            let mut blk = f.subscribe_blocking().unwrap();
            f.publish(1).await;
            f.publish(2).await;
            // The third waits for the blocking reader; the observer is cut.
            let f2 = f.clone();
            let pubt = tokio::spawn(async move { f2.publish(3).await });
            tokio::task::yield_now().await;
            assert!(!pubt.is_finished());
            assert_eq!(blk.rx.recv().await, Some(1));
            pubt.await.unwrap();
            assert_eq!(blk.rx.recv().await, Some(2));
            assert_eq!(blk.rx.recv().await, Some(3));
            assert_eq!(obs.rx.recv().await, Some(1));
            assert_eq!(obs.rx.recv().await, Some(2));
            assert_eq!(obs.rx.recv().await, None);
            assert!(obs.overflowed());
            f.finish(9).await;
            assert_eq!(blk.rx.recv().await, Some(9));
            assert_eq!(blk.rx.recv().await, None);
            assert!(!blk.overflowed());
            assert!(f.subscribe().is_none());
        });
    }

    #[test]
    fn release_unblocks() {
        rt().block_on(async {
            let f = Arc::new(Fanout::<u32>::new(1));
            let mut blk = f.subscribe_blocking().unwrap();
            f.publish(1).await;
            let f2 = f.clone();
            let pubt = tokio::spawn(async move { f2.publish(2).await });
            tokio::task::yield_now().await;
            f.release();
            pubt.await.unwrap();
            assert_eq!(blk.rx.recv().await, Some(1));
            assert_eq!(blk.rx.recv().await, None);
            assert!(blk.overflowed());
        });
    }

    #[test]
    fn finish_with_full_blocking_reader() {
        rt().block_on(async {
            let f = Fanout::<u32>::new(1);
            let mut blk = f.subscribe_blocking().unwrap();
            f.publish(1).await;
            f.finish(2).await;
            assert_eq!(blk.rx.recv().await, Some(1));
            assert_eq!(blk.rx.recv().await, None);
            assert!(!blk.overflowed());
        });
    }
}
