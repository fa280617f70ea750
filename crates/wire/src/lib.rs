//! Frame formats as typed, zero-copy views over bytes.
//!
//! Each protocol module offers a view, such as [`ethernet::Frame`] or [`ipv4::Packet`], that
//! wraps any buffer `T: AsRef<[u8]>` (a `&[u8]`, a `&mut [u8]`, a `Vec<u8>`) and reads its
//! fields in place; setters are available when `T: AsMut<[u8]>`. Payload accessors on a view of
//! `&'a [u8]` return slices that live for `'a`, so views can be chained without copying.
//! On top of the views sit the datapath helpers: [`l2::classify`] (run on every frame),
//! [`flow::extract`] (flow keys for RSS and QoS), [`virtio_net_hdr`] and [`checksum`]; for
//! tunnels, port security and capture, [`vxlan`] (encapsulation and decapsulation),
//! [`guard::inspect`] (the facts port security checks) and [`pcapng`] (a capture writer); for
//! the firewall, [`ct::parse`] (a frame's connection key, TCP flags, ICMP errors, fragments).
//! For the link control protocols a bond and its members speak: [`lacp`] (LACPDUs, IEEE
//! 802.1AX) and [`lldp`] (LLDPDUs, IEEE 802.1AB).
//!
//! # The contract
//!
//! * `new_unchecked` wraps a buffer without looking at it. Accessors on a view made this way
//!   may panic if the buffer is too short; use it only on buffers already checked.
//! * `check_len` verifies that the buffer is long enough for every accessor of the view, and
//!   that the length fields the accessors rely on are consistent (an IPv4 header length no
//!   larger than the total length, and so on). `new_checked` is `new_unchecked` followed by
//!   `check_len`.
//! * After a successful `check_len`, no getter, setter or payload accessor panics, whatever
//!   the bytes are, until a setter changes a length field (`set_total_len`, `set_len`,
//!   `set_payload_len`): check again after that.
//! * The free functions ([`l2::classify`], [`flow::extract`],
//!   [`virtio_net_hdr::VirtioNetHdr::parse`], [`checksum::complete_partial`],
//!   [`vxlan::decap`], [`guard::inspect`], ...) check their input themselves and never panic
//!   on any input.
//! * Nothing here allocates, performs I/O or uses `unsafe`, with one exception:
//!   [`pcapng::Writer`] writes to a [`std::io::Write`] the caller supplies.
//! * Codes this crate has no name for are kept, not rejected: an unknown EtherType reads as
//!   [`ethernet::EtherType::Unknown`], an unknown IP protocol as [`IpProtocol::Unknown`].
//!
//! Multi-byte fields are big-endian (network order) everywhere except in the virtio-net
//! header, which is little-endian.
//!
//! # Example
//!
//! ```
//! use qswitch_wire::ethernet::{EtherType, Frame};
//! use qswitch_wire::{ipv4, l2, Error, MacAddr};
//!
//! let mut bytes = [0u8; 60];
//! let mut eth = Frame::new_checked(&mut bytes[..])?;
//! eth.set_dst_addr(MacAddr::BROADCAST);
//! eth.set_src_addr("52:54:00:12:34:01".parse().unwrap());
//! eth.set_ethertype(EtherType::Ipv4);
//!
//! let info = l2::classify(&bytes).unwrap();
//! assert_eq!((info.dst, info.vlan, info.ethertype), (MacAddr::BROADCAST, None, EtherType::Ipv4));
//! // An all-zero IPv4 header has version 0.
//! let ip = ipv4::Packet::new_checked(&bytes[info.l3_offset..]);
//! assert_eq!(ip, Err(Error::Malformed));
//! # Ok::<(), Error>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod arp;
pub mod checksum;
pub mod ct;
pub mod erspan;
pub mod ethernet;
pub mod flow;
pub mod gro;
pub mod gso;
pub mod guard;
pub mod ipv4;
pub mod ipv6;
mod ipv6_ext;
pub mod l2;
pub mod lacp;
pub mod lldp;
pub mod mac;
pub mod pcapng;
pub mod tcp;
pub mod udp;
pub mod virtio_net_hdr;
pub mod vlan;
pub mod vxlan;

#[cfg(test)]
mod testdata;

pub use mac::MacAddr;

use core::fmt;

/// Why a buffer could not be viewed as a given format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer is shorter than the header, or than a length field says it should be.
    Truncated,
    /// A field holds a value that makes the rest unparseable (e.g. an IPv4 header length
    /// below 20).
    Malformed,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Truncated => "truncated packet",
            Error::Malformed => "malformed packet",
        })
    }
}

impl std::error::Error for Error {}

/// The result type of this crate's parsers.
pub type Result<T> = core::result::Result<T, Error>;

/// Declares a code enum that keeps values it has no name for in an `Unknown` variant, with
/// conversions from and to the raw integer. `From<raw>` never yields `Unknown` for a named
/// value.
macro_rules! enum_with_unknown {
    (
        $(#[$meta:meta])*
        pub enum $name:ident($ty:ty) {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value with no name here, kept as it is.
            Unknown($ty),
        }

        impl From<$ty> for $name {
            #[inline]
            fn from(value: $ty) -> Self {
                match value {
                    $( $value => $name::$variant, )+
                    other => $name::Unknown(other),
                }
            }
        }

        impl From<$name> for $ty {
            #[inline]
            fn from(value: $name) -> Self {
                match value {
                    $( $name::$variant => $value, )+
                    $name::Unknown(other) => other,
                }
            }
        }
    };
}
pub(crate) use enum_with_unknown;

enum_with_unknown! {
    /// An IP protocol number: the IPv4 Protocol field, or an IPv6 Next Header value.
    pub enum IpProtocol(u8) {
        /// IPv6 Hop-by-Hop Options extension header.
        HopByHop = 0,
        /// ICMP for IPv4.
        Icmp = 1,
        /// TCP.
        Tcp = 6,
        /// UDP.
        Udp = 17,
        /// IPv6 Routing extension header.
        Ipv6Route = 43,
        /// IPv6 Fragment extension header.
        Ipv6Frag = 44,
        /// ICMPv6.
        Icmpv6 = 58,
        /// IPv6 "no next header".
        Ipv6NoNxt = 59,
        /// IPv6 Destination Options extension header.
        Ipv6Opts = 60,
    }
}

/// A header field: a range of byte offsets.
type Field = core::ops::Range<usize>;
/// Everything from a byte offset to the end.
type Rest = core::ops::RangeFrom<usize>;

/// Reads a fixed-size field. The field's length must be `N` (the field tables guarantee it).
#[inline]
fn read_array<const N: usize>(data: &[u8], field: Field) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&data[field]);
    out
}

#[inline]
fn read_u16(data: &[u8], field: Field) -> u16 {
    u16::from_be_bytes(read_array(data, field))
}

#[inline]
fn read_u32(data: &[u8], field: Field) -> u32 {
    u32::from_be_bytes(read_array(data, field))
}

#[inline]
fn write_u16(data: &mut [u8], field: Field, value: u16) {
    data[field].copy_from_slice(&value.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_protocol_round_trips_and_keeps_unknown_values() {
        for raw in 0..=u8::MAX {
            assert_eq!(u8::from(IpProtocol::from(raw)), raw);
        }
        assert_eq!(IpProtocol::from(6), IpProtocol::Tcp);
        assert_eq!(IpProtocol::from(132), IpProtocol::Unknown(132));
    }

    #[test]
    fn errors_display() {
        assert_eq!(Error::Truncated.to_string(), "truncated packet");
        assert_eq!(Error::Malformed.to_string(), "malformed packet");
    }
}
