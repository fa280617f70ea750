//! A port made of ports: the seam a bond needs. [`Members`] is a [`Port`] whose receive and
//! transmit go through several member [`Device`]s, each with its own link state.
//!
//! ```text
//!              Members (one port of the switch)
//!   rx queue 0 ── member a, its queue 0 ─┐   tx: the members whose link is up,
//!   rx queue 1 ── member b, its queue 0 ─┘       chosen by the TxPolicy
//! ```
//!
//! - **Receive**: the port's rx queues are its members' queues, member by member, so each
//!   stays owned by one worker as any queue is. A member whose link is down delivers
//!   nothing: what it still receives is drained and counted (`link_down`), so its fd does
//!   not keep a worker awake.
//! - **Transmit**: [`TxPolicy`] picks the member; with no member up, frames are counted as
//!   `link_down`.
//! - **Link state**: [`Member::set_up`], for whoever knows it (carrier from netlink events,
//!   LACP); one relaxed load per burst on the data path.
//!
//! A bond kind adds a `Device` variant holding `Members`, its config, and its policies
//! (balance-slb, balance-tcp: a choice per frame rather than per burst) beside
//! [`TxPolicy::ActiveBackup`].

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Device, Port, TxDone};
use crate::packet::Pkt;
use crate::stats::{DropReason, DropTally};

/// One member device of a [`Members`] port, with its own link state (up when made).
#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub dev: Device,
    queues: u16,
    up: AtomicBool,
}

impl Member {
    /// Member `name`: `dev` with `queues` rx queues (at least one).
    pub fn new(name: &str, dev: Device, queues: u16) -> Member {
        Member {
            name: name.to_string(),
            dev,
            queues: queues.max(1),
            up: AtomicBool::new(true),
        }
    }

    /// Sets the member's link state.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }

    /// Whether the member's link is up.
    #[inline]
    pub fn up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }
}

/// Which member carries what a [`Members`] port transmits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxPolicy {
    /// Everything through the first member whose link is up: the first listed is the
    /// primary, the others its backups in order.
    ActiveBackup,
}

/// A port made of member devices (see the module docs).
#[derive(Debug)]
pub struct Members {
    members: Vec<Member>,
    /// Rx queue → (member, the member's queue).
    queues: Vec<(usize, u16)>,
    policy: TxPolicy,
}

impl Members {
    pub fn new(members: Vec<Member>, policy: TxPolicy) -> Members {
        let queues = members
            .iter()
            .enumerate()
            .flat_map(|(m, member)| (0..member.queues).map(move |q| (m, q)))
            .collect();
        Members {
            members,
            queues,
            policy,
        }
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The port's rx queues: the sum of its members'.
    pub fn queues(&self) -> u16 {
        u16::try_from(self.queues.len()).unwrap_or(u16::MAX)
    }

    /// The member that transmits now, if any link is up.
    pub fn active(&self) -> Option<usize> {
        match self.policy {
            TxPolicy::ActiveBackup => self.members.iter().position(Member::up),
        }
    }

    /// The member (its index) and the member's queue behind the port's rx queue `queue`.
    #[inline]
    pub fn member_of(&self, queue: u16) -> Option<(usize, u16)> {
        self.queues.get(usize::from(queue)).copied()
    }

    fn member(&self, queue: u16) -> Option<(&Member, u16)> {
        let &(m, q) = self.queues.get(usize::from(queue))?;
        Some((&self.members[m], q))
    }
}

impl Port for Members {
    fn rx_burst(&self, queue: u16, pkts: &mut [Pkt], now: u64, drops: &mut DropTally) -> usize {
        let Some((m, q)) = self.member(queue) else {
            return 0;
        };
        let n = m.dev.rx_burst(q, pkts, now, drops);
        if m.up() {
            return n;
        }
        drops.count_n(DropReason::LinkDown, n as u32);
        0
    }

    fn tx_burst(
        &self,
        worker: usize,
        pkts: &mut [Pkt],
        sel: &[u8],
        drops: &mut DropTally,
    ) -> TxDone {
        match self.active() {
            Some(m) => self.members[m].dev.tx_burst(worker, pkts, sel, drops),
            None => {
                drops.count_n(DropReason::LinkDown, sel.len() as u32);
                TxDone::default()
            }
        }
    }

    fn rx_fd(&self, queue: u16) -> Option<RawFd> {
        self.member(queue).and_then(|(m, q)| m.dev.rx_fd(q))
    }

    fn rx_arm(&self, queue: u16) -> bool {
        self.member(queue).is_none_or(|(m, q)| m.dev.rx_arm(q))
    }

    fn rx_dead(&self, queue: u16) -> bool {
        self.member(queue).is_some_and(|(m, q)| m.dev.rx_dead(q))
    }

    fn rx_due_in(&self, queue: u16, now: u64) -> Option<u64> {
        self.member(queue)
            .and_then(|(m, q)| m.dev.rx_due_in(q, now))
    }

    /// What every member offers: transmits may move to any of them.
    fn offloads(&self) -> Vec<&'static str> {
        let mut all = self.members.iter().map(|m| m.dev.offloads());
        let first = all.next().unwrap_or_default();
        all.fold(first, |acc, o| {
            acc.into_iter().filter(|x| o.contains(x)).collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::port::inject::InjectPort;

    fn frame(tag: u8) -> Vec<u8> {
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, tag]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0xee]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f
    }

    /// A port of two inject members, a (primary) and b, and handles on both.
    fn bond() -> (Members, Arc<InjectPort>, Arc<InjectPort>) {
        let (a, b) = (Arc::new(InjectPort::new()), Arc::new(InjectPort::new()));
        let m = Members::new(
            vec![
                Member::new("a", Device::Inject(a.clone()), 1),
                Member::new("b", Device::Inject(b.clone()), 1),
            ],
            TxPolicy::ActiveBackup,
        );
        (m, a, b)
    }

    fn send(m: &Members, tags: &[u8], drops: &mut DropTally) -> TxDone {
        let mut pkts: Vec<Pkt> = tags
            .iter()
            .map(|&t| {
                let mut p = Pkt::new();
                p.fill(&frame(t));
                p
            })
            .collect();
        let sel: Vec<u8> = (0..tags.len() as u8).collect();
        m.tx_burst(0, &mut pkts, &sel, drops)
    }

    #[test]
    fn transmits_through_the_first_member_that_is_up() {
        let (m, a, b) = bond();
        let mut drops = DropTally::default();
        assert_eq!(send(&m, &[1, 2], &mut drops).packets, 2);
        assert_eq!((a.take_captured().len(), b.take_captured().len()), (2, 0));

        m.members()[0].set_up(false);
        assert_eq!(m.active(), Some(1));
        assert_eq!(send(&m, &[3], &mut drops).packets, 1);
        assert_eq!(a.take_captured(), Vec::<Vec<u8>>::new());
        assert_eq!(b.take_captured(), vec![frame(3)]);

        m.members()[1].set_up(false);
        assert_eq!(m.active(), None);
        assert_eq!(send(&m, &[4, 5], &mut drops).packets, 0);
        assert_eq!(drops.total(), 2, "counted as link_down");

        m.members()[0].set_up(true);
        assert_eq!(send(&m, &[6], &mut drops).packets, 1);
        assert_eq!(a.take_captured(), vec![frame(6)], "back to the primary");
    }

    #[test]
    fn receives_from_the_members_that_are_up() {
        let (m, a, b) = bond();
        assert_eq!(m.queues(), 2);
        a.inject(&frame(1));
        b.inject(&frame(2));
        m.members()[1].set_up(false);
        let mut pkts: Vec<Pkt> = (0..4).map(|_| Pkt::new()).collect();
        let mut drops = DropTally::default();
        assert_eq!(m.rx_burst(0, &mut pkts, 0, &mut drops), 1);
        assert_eq!(pkts[0].frame(), &frame(1)[..]);
        assert_eq!(m.rx_burst(1, &mut pkts, 0, &mut drops), 0);
        assert_eq!((drops.total(), b.pending()), (1, 0), "drained, counted");
        assert_eq!(m.rx_burst(2, &mut pkts, 0, &mut drops), 0, "no such queue");
    }
}
