//! A test double: frames a test queues come out of rx; frames sent to it are captured.
//! Lets tests without privileges feed the switch malformed frames and bad virtio-net headers.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use qswitch_wire::virtio_net_hdr::VirtioNetHdr;

use super::{Port, TxDone};
use crate::packet::Pkt;
use crate::stats::{DropReason, DropTally};

/// An in-memory port with one queue.
#[derive(Debug, Default)]
pub struct InjectPort {
    rx: Mutex<VecDeque<(VirtioNetHdr, Vec<u8>)>>,
    captured: Mutex<Vec<Vec<u8>>>,
    /// Makes the next rx poll panic (to test how the switch reports a dead thread).
    panic_on_rx: AtomicBool,
}

impl InjectPort {
    pub fn new() -> InjectPort {
        InjectPort::default()
    }

    /// Queues a frame (with no offloads) for the switch to receive.
    pub fn inject(&self, frame: &[u8]) {
        self.inject_with_hdr(VirtioNetHdr::default(), frame);
    }

    /// Queues a frame with a given virtio-net header.
    pub fn inject_with_hdr(&self, hdr: VirtioNetHdr, frame: &[u8]) {
        self.rx.lock().push_back((hdr, frame.to_vec()));
    }

    /// Frames the switch has sent to this port so far (and forgets them).
    pub fn take_captured(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.captured.lock())
    }

    /// Makes the next poll of the port panic, in whichever thread polls it.
    pub fn panic_on_next_rx(&self) {
        self.panic_on_rx.store(true, Ordering::Relaxed);
    }

    /// Frames still waiting to be received.
    pub fn pending(&self) -> usize {
        self.rx.lock().len()
    }
}

impl Port for InjectPort {
    fn rx_burst(&self, _queue: u16, pkts: &mut [Pkt], _now: u64, drops: &mut DropTally) -> usize {
        if self.panic_on_rx.swap(false, Ordering::Relaxed) {
            panic!("inject port: rx panic requested by the test");
        }
        let mut rx = self.rx.lock();
        let mut n = 0;
        while n < pkts.len() {
            let Some((hdr, frame)) = rx.pop_front() else {
                break;
            };
            if hdr.validate(frame.len()).is_err() {
                drops.count(DropReason::BadVnetHdr);
                continue;
            }
            pkts[n].fill(&frame);
            pkts[n].hdr = hdr;
            n += 1;
        }
        n
    }

    fn tx_burst(
        &self,
        _worker: usize,
        pkts: &mut [Pkt],
        sel: &[u8],
        _drops: &mut DropTally,
    ) -> TxDone {
        let mut cap = self.captured.lock();
        let mut done = TxDone::default();
        for &i in sel {
            let f = pkts[usize::from(i)].frame();
            done.packets += 1;
            done.bytes += f.len() as u64;
            cap.push(f.to_vec());
        }
        done
    }

    fn rx_fd(&self, _queue: u16) -> Option<std::os::fd::RawFd> {
        None
    }

    fn rx_due_in(&self, _queue: u16, _now: u64) -> Option<u64> {
        (!self.rx.lock().is_empty()).then_some(0)
    }
}
