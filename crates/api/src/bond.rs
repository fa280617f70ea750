//! What `qswitch bond show` prints: a bond port's mode, its members and their link and LACP
//! state (see docs/teaming.md).

use serde::{Deserialize, Serialize};

use crate::config::{BondMode, LacpMode, LacpRate};

/// One bond port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BondInfo {
    pub name: String,
    pub mode: BondMode,
    pub lacp: LacpMode,
    pub lacp_rate: LacpRate,
    /// The member that carries everything (active-backup) or takes broadcast and multicast
    /// (balance-slb); `None` when no member carries traffic.
    pub active: Option<String>,
    pub members: Vec<BondMemberInfo>,
}

/// One member of a bond.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BondMemberInfo {
    /// Its interface.
    pub name: String,
    /// Carrier, as the last netlink link notification left it.
    pub carrier: bool,
    /// Whether it carries traffic now (carrier with the up/down delays, and LACP
    /// distributing when LACP is on).
    pub enabled: bool,
    /// Hash buckets (of 256) it transmits (balance-slb, balance-tcp).
    pub buckets: u32,
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// Frames received on a member that does not take them (a backup, a balance-slb flood
    /// from a non-active member, a frame of a local MAC coming back).
    pub rx_dropped: u64,
    pub lacp_rx: u64,
    pub lacp_tx: u64,
    /// Gratuitous RARPs sent by the member (failover, a MAC moving to it).
    pub rarp_tx: u64,
    /// LACP state when LACP is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lacp_state: Option<LacpMemberInfo>,
}

/// A member's LACP state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LacpMemberInfo {
    /// Receive machine: current, expired, defaulted, disabled.
    pub rx: String,
    /// Mux: detached, attached, collecting, distributing.
    pub mux: String,
    pub selected: bool,
    /// The actor state octet this side sends.
    pub actor_state: u8,
    /// The partner's system id (MAC), priority, key, port and state octet.
    pub partner_system: String,
    pub partner_priority: u16,
    pub partner_key: u16,
    pub partner_port: u16,
    pub partner_state: u8,
    pub partner_in_sync: bool,
}

impl LacpMemberInfo {
    /// Whether the member collects and distributes.
    pub fn distributing(&self) -> bool {
        self.mux == "distributing"
    }
}
