//! A pcapng writer (draft-ietf-opsawg-pcapng), for packet capture that tcpdump and Wireshark
//! read.
//!
//! **The one exception to "no I/O" in this crate**: [`Writer`] writes to a caller-supplied
//! [`std::io::Write`] (a `Vec<u8>`, a `BufWriter<File>`, stdout). It opens no file, reads no
//! clock and does not allocate: timestamps come in as arguments, and each block is written
//! with a few `write_all` calls from stack buffers, so give it a buffered writer.
//!
//! The file is one section: a Section Header Block, then one Interface Description Block per
//! port ([`Writer::add_interface`]: its name, link type Ethernet, the writer's snap length and
//! `if_tsresol` = 9, so timestamps are nanoseconds), then Enhanced Packet Blocks
//! ([`Writer::write_packet`]) with the captured and original lengths and an `epb_flags` option
//! for the direction. Blocks are written little-endian (the byte-order magic says so; readers
//! accept either order).
//!
//! The snap length is the writer's, not each interface's: libpcap (and so tcpdump) refuses a
//! section whose interfaces differ in snap length or link type.
//!
//! ```
//! use qswitch_wire::pcapng::{Direction, Writer};
//!
//! let mut pcap = Writer::new(Vec::new(), 0)?;
//! let port = pcap.add_interface("vm1")?;
//! pcap.write_packet(port, 1_700_000_000_123_456_789, Direction::Inbound, &[0u8; 60])?;
//! let bytes = pcap.into_inner();
//! assert_eq!(&bytes[..4], &[0x0a, 0x0d, 0x0d, 0x0a]);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, Write};

/// Section Header Block type.
pub const SHB_TYPE: u32 = 0x0a0d_0d0a;
/// Interface Description Block type.
pub const IDB_TYPE: u32 = 0x0000_0001;
/// Enhanced Packet Block type.
pub const EPB_TYPE: u32 = 0x0000_0006;
/// The byte-order magic of the Section Header Block.
pub const BYTE_ORDER_MAGIC: u32 = 0x1a2b_3c4d;
/// `LINKTYPE_ETHERNET`.
pub const LINKTYPE_ETHERNET: u16 = 1;

const OPT_ENDOFOPT: u16 = 0;
const SHB_USERAPPL: u16 = 4;
const IF_NAME: u16 = 2;
const IF_TSRESOL: u16 = 9;
const EPB_FLAGS: u16 = 2;
/// `if_tsresol` 9: timestamps in units of 10^-9 s.
const TSRESOL_NANOSECONDS: u8 = 9;
const EPB_FLAG_INBOUND: u32 = 0b01;
const EPB_FLAG_OUTBOUND: u32 = 0b10;

/// The application name recorded in the Section Header Block.
const USER_APPLICATION: &str = "qswitch";

/// Which way a frame went, as seen from the port it was captured on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Received on the port (from the guest or the wire into the switch).
    Inbound,
    /// Sent out of the port.
    Outbound,
}

/// An interface added with [`Writer::add_interface`]: its index in the section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InterfaceId(u32);

impl InterfaceId {
    /// The interface's index in the section (0 for the first one added).
    pub fn index(&self) -> u32 {
        self.0
    }
}

/// Writes a pcapng section to `W`.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
    snaplen: u32,
    interfaces: u32,
}

/// Bytes of padding after `len` bytes to reach a multiple of 4.
fn padding(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// The length of an option with a value of `len` bytes, padding included.
fn option_len(len: usize) -> usize {
    4 + len + padding(len)
}

fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

impl<W: Write> Writer<W> {
    /// Starts a section: writes the Section Header Block (version 1.0, section length
    /// unspecified, `shb_userappl` "qswitch"). At most `snaplen` bytes of each frame will be
    /// kept (0: no limit).
    pub fn new(mut out: W, snaplen: u32) -> io::Result<Writer<W>> {
        let total = 28 + option_len(USER_APPLICATION.len()) + 4;
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&SHB_TYPE.to_le_bytes());
        header[4..8].copy_from_slice(&(total as u32).to_le_bytes());
        header[8..12].copy_from_slice(&BYTE_ORDER_MAGIC.to_le_bytes());
        header[12..14].copy_from_slice(&1u16.to_le_bytes());
        header[14..16].copy_from_slice(&0u16.to_le_bytes());
        header[16..24].copy_from_slice(&(-1i64).to_le_bytes());
        out.write_all(&header)?;
        write_option(&mut out, SHB_USERAPPL, USER_APPLICATION.as_bytes())?;
        write_end(&mut out, total)?;
        Ok(Writer {
            out,
            snaplen,
            interfaces: 0,
        })
    }

    /// Describes a port: writes an Interface Description Block with link type Ethernet, the
    /// writer's snap length, `if_name` = `name` and nanosecond timestamps. Fails with
    /// [`io::ErrorKind::InvalidInput`] if the name is longer than 65535 bytes.
    pub fn add_interface(&mut self, name: &str) -> io::Result<InterfaceId> {
        if name.len() > usize::from(u16::MAX) {
            return Err(invalid("interface name longer than 65535 bytes"));
        }
        let total = 16 + option_len(name.len()) + option_len(1) + 4 + 4;
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&IDB_TYPE.to_le_bytes());
        header[4..8].copy_from_slice(&(total as u32).to_le_bytes());
        header[8..10].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        header[12..16].copy_from_slice(&self.snaplen.to_le_bytes());
        self.out.write_all(&header)?;
        write_option(&mut self.out, IF_NAME, name.as_bytes())?;
        write_option(&mut self.out, IF_TSRESOL, &[TSRESOL_NANOSECONDS])?;
        write_end(&mut self.out, total)?;
        let id = InterfaceId(self.interfaces);
        self.interfaces += 1;
        Ok(id)
    }

    /// Writes a frame captured whole on `interface` at `timestamp_ns` (nanoseconds since the
    /// Unix epoch), cut to the snap length.
    pub fn write_packet(
        &mut self,
        interface: InterfaceId,
        timestamp_ns: u64,
        direction: Direction,
        frame: &[u8],
    ) -> io::Result<()> {
        self.write_packet_truncated(interface, timestamp_ns, direction, frame, frame.len())
    }

    /// Writes the first bytes of a frame that was `original_len` bytes long (the capture may
    /// have kept only `data`), cut further to the snap length. Fails with
    /// [`io::ErrorKind::InvalidInput`] if `original_len` is less than `data.len()` or a
    /// length does not fit the format's 32 bits.
    pub fn write_packet_truncated(
        &mut self,
        interface: InterfaceId,
        timestamp_ns: u64,
        direction: Direction,
        data: &[u8],
        original_len: usize,
    ) -> io::Result<()> {
        if original_len < data.len() {
            return Err(invalid("original length below captured length"));
        }
        let original = u32::try_from(original_len).map_err(|_| invalid("frame too long"))?;
        let mut captured = data.len();
        if self.snaplen != 0 {
            captured = captured.min(self.snaplen as usize);
        }
        let data = &data[..captured];
        let body = 28 + captured + padding(captured) + option_len(4) + 4;
        let total = u32::try_from(body + 4).map_err(|_| invalid("frame too long"))?;
        let mut header = [0u8; 28];
        header[0..4].copy_from_slice(&EPB_TYPE.to_le_bytes());
        header[4..8].copy_from_slice(&total.to_le_bytes());
        header[8..12].copy_from_slice(&interface.0.to_le_bytes());
        header[12..16].copy_from_slice(&((timestamp_ns >> 32) as u32).to_le_bytes());
        header[16..20].copy_from_slice(&(timestamp_ns as u32).to_le_bytes());
        header[20..24].copy_from_slice(&(captured as u32).to_le_bytes());
        header[24..28].copy_from_slice(&original.to_le_bytes());
        self.out.write_all(&header)?;
        self.out.write_all(data)?;
        self.out.write_all(&[0; 3][..padding(captured)])?;
        let flags = match direction {
            Direction::Inbound => EPB_FLAG_INBOUND,
            Direction::Outbound => EPB_FLAG_OUTBOUND,
        };
        write_option(&mut self.out, EPB_FLAGS, &flags.to_le_bytes())?;
        write_end(&mut self.out, total as usize)
    }

    /// Flushes the writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The writer.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Returns the writer (not flushed).
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Writes one option, padded. `value` is at most 65535 bytes.
fn write_option(out: &mut impl Write, code: u16, value: &[u8]) -> io::Result<()> {
    let mut header = [0u8; 4];
    header[0..2].copy_from_slice(&code.to_le_bytes());
    header[2..4].copy_from_slice(&(value.len() as u16).to_le_bytes());
    out.write_all(&header)?;
    out.write_all(value)?;
    out.write_all(&[0; 3][..padding(value.len())])
}

/// Writes `opt_endofopt` and the trailing Block Total Length.
fn write_end(out: &mut impl Write, total: usize) -> io::Result<()> {
    let mut end = [0u8; 8];
    end[0..2].copy_from_slice(&OPT_ENDOFOPT.to_le_bytes());
    end[4..8].copy_from_slice(&(total as u32).to_le_bytes());
    out.write_all(&end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{ARP_REQUEST, TCP_SYN, UDP4, UDP6};

    fn u16_at(bytes: &[u8], at: usize) -> u16 {
        u16::from_le_bytes(bytes[at..at + 2].try_into().unwrap())
    }

    fn u32_at(bytes: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
    }

    /// The options of a block body starting at `at`: (code, value) pairs up to opt_endofopt.
    fn options(body: &[u8], mut at: usize) -> Vec<(u16, Vec<u8>)> {
        let mut found = Vec::new();
        loop {
            let (code, len) = (u16_at(body, at), usize::from(u16_at(body, at + 2)));
            if code == OPT_ENDOFOPT {
                assert_eq!(len, 0);
                assert_eq!(at + 4, body.len(), "options end the block");
                return found;
            }
            found.push((code, body[at + 4..at + 4 + len].to_vec()));
            at += option_len(len);
        }
    }

    /// Splits a file into (type, body) blocks, checking both length fields.
    fn blocks(file: &[u8]) -> Vec<(u32, &[u8])> {
        let mut blocks = Vec::new();
        let mut rest = file;
        while !rest.is_empty() {
            let len = u32_at(rest, 4) as usize;
            assert_eq!(len % 4, 0);
            assert_eq!(u32_at(rest, len - 4) as usize, len);
            blocks.push((u32_at(rest, 0), &rest[8..len - 4]));
            rest = &rest[len..];
        }
        blocks
    }

    /// An Enhanced Packet Block's interface, timestamp, captured and original lengths, data
    /// and flags.
    type Epb = (u32, u64, usize, u32, &'static [u8], u32);

    #[test]
    fn blocks_as_the_spec_lays_them_out() {
        let mut pcap = Writer::new(Vec::new(), 64).unwrap();
        let a = pcap.add_interface("vm1").unwrap();
        let b = pcap.add_interface("uplink0").unwrap();
        assert_eq!((a.index(), b.index()), (0, 1));
        pcap.write_packet(a, 0x1_0000_0002, Direction::Inbound, &UDP6)
            .unwrap();
        pcap.write_packet(b, 7, Direction::Outbound, &TCP_SYN)
            .unwrap();
        pcap.write_packet_truncated(a, 8, Direction::Outbound, &ARP_REQUEST[..41], 60)
            .unwrap();
        let file = pcap.into_inner();
        let blocks = blocks(&file);
        assert_eq!(blocks.len(), 6);

        let (kind, shb) = blocks[0];
        assert_eq!(kind, SHB_TYPE);
        assert_eq!(u32_at(shb, 0), BYTE_ORDER_MAGIC);
        assert_eq!((u16_at(shb, 4), u16_at(shb, 6)), (1, 0));
        assert_eq!(&shb[8..16], &[0xff; 8]);
        assert_eq!(options(shb, 16), vec![(SHB_USERAPPL, b"qswitch".to_vec())]);

        for ((kind, idb), (name, snaplen)) in
            blocks[1..3].iter().zip([("vm1", 64), ("uplink0", 64)])
        {
            assert_eq!(*kind, IDB_TYPE);
            assert_eq!((u16_at(idb, 0), u16_at(idb, 2)), (LINKTYPE_ETHERNET, 0));
            assert_eq!(u32_at(idb, 4), snaplen);
            let expected = vec![(IF_NAME, name.as_bytes().to_vec()), (IF_TSRESOL, vec![9])];
            assert_eq!(options(idb, 8), expected);
        }

        let expected: [Epb; 3] = [
            (0, 0x1_0000_0002, 64, 75, &UDP6[..64], 1),
            (1, 7, 64, 74, &TCP_SYN[..64], 2),
            (0, 8, 41, 60, &ARP_REQUEST[..41], 2),
        ];
        for ((kind, epb), (iface, ts, cap, orig, data, flags)) in blocks[3..].iter().zip(expected) {
            assert_eq!(*kind, EPB_TYPE);
            assert_eq!(u32_at(epb, 0), iface);
            let timestamp = (u64::from(u32_at(epb, 4)) << 32) | u64::from(u32_at(epb, 8));
            assert_eq!(timestamp, ts);
            assert_eq!(u32_at(epb, 12) as usize, cap);
            assert_eq!(u32_at(epb, 16), orig);
            assert_eq!(&epb[20..20 + cap], data);
            assert!(epb[20 + cap..20 + cap + padding(cap)]
                .iter()
                .all(|&b| b == 0));
            let flags_value = flags.to_le_bytes().to_vec();
            assert_eq!(
                options(epb, 20 + cap + padding(cap)),
                vec![(EPB_FLAGS, flags_value)]
            );
        }
    }

    #[test]
    fn rejects_impossible_lengths() {
        let mut pcap = Writer::new(Vec::new(), 0).unwrap();
        let port = pcap.add_interface("p").unwrap();
        let error = pcap
            .write_packet_truncated(port, 0, Direction::Inbound, &UDP4, 63)
            .unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
        let long_name = "x".repeat(65_536);
        assert_eq!(
            pcap.add_interface(&long_name).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // Nothing was written by the failed calls.
        assert_eq!(blocks(pcap.get_ref()).len(), 2);
    }

    /// Writes a file with frames on two ports and has tcpdump read it back: the count, the
    /// nanosecond timestamps, the original lengths and the direction flags it prints.
    #[test]
    fn tcpdump_reads_it() {
        let Some(tcpdump) = find_tool("tcpdump") else {
            assert!(
                std::env::var("QSWITCH_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
                "tcpdump is not installed and QSWITCH_REQUIRE_PRIVILEGED=1"
            );
            println!("skipped: tcpdump is not installed");
            return;
        };
        let path = std::env::temp_dir().join(format!("qswitch-wire-{}.pcapng", std::process::id()));
        let _remove = RemoveOnDrop(path.clone());
        let mut pcap = Writer::new(
            io::BufWriter::new(std::fs::File::create(&path).unwrap()),
            40,
        )
        .unwrap();
        let vm = pcap.add_interface("vm1").unwrap();
        let uplink = pcap.add_interface("uplink0").unwrap();
        let base = 1_700_000_000_000_000_000u64;
        pcap.write_packet(vm, base + 123_456_789, Direction::Inbound, &ARP_REQUEST)
            .unwrap();
        pcap.write_packet(uplink, base + 1_000_000_001, Direction::Outbound, &TCP_SYN)
            .unwrap();
        pcap.write_packet(vm, base + 2_000_000_000, Direction::Outbound, &UDP6)
            .unwrap();
        pcap.write_packet(uplink, base + 3_000_000_003, Direction::Inbound, &UDP4)
            .unwrap();
        pcap.flush().unwrap();
        drop(pcap);

        let output = std::process::Command::new(tcpdump)
            .args(["-r", path.to_str().unwrap(), "-nn", "-e", "-tt"])
            .args(["--time-stamp-precision=nano"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "tcpdump failed: {stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 4, "{stdout}");
        assert!(lines[0].starts_with("1700000000.123456789 "), "{stdout}");
        assert!(lines[1].starts_with("1700000001.000000001 "), "{stdout}");
        assert!(lines[3].starts_with("1700000003.000000003 "), "{stdout}");
        assert!(
            lines[0].contains("ARP") && lines[0].contains("length 42"),
            "{stdout}"
        );
        // The snap length of 40 cut the SYN; tcpdump reports the original length.
        assert!(lines[1].contains("length 74"), "{stdout}");
        assert!(
            lines[2].contains("IPv6") && lines[2].contains("length 75"),
            "{stdout}"
        );
        // tcpdump does not print the epb_flags direction; tshark does, when it is installed.
        if let Some(tshark) = find_tool("tshark") {
            let output = std::process::Command::new(tshark)
                .args(["-r", path.to_str().unwrap(), "-T", "fields"])
                .args([
                    "-e",
                    "frame.interface_name",
                    "-e",
                    "frame.packet_flags_direction",
                ])
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let fields: Vec<Vec<&str>> = stdout.lines().map(|l| l.split('\t').collect()).collect();
            let expected = [("vm1", 1), ("uplink0", 2), ("vm1", 2), ("uplink0", 1)];
            assert_eq!(fields.len(), expected.len(), "{stdout}");
            for (line, (name, direction)) in fields.iter().zip(expected) {
                assert_eq!(line[0], name, "{stdout}");
                let value = line[1].trim_start_matches("0x");
                assert_eq!(
                    u32::from_str_radix(value, 16).unwrap(),
                    direction,
                    "{stdout}"
                );
            }
        }
    }

    /// Removes a file when dropped, so a failing test leaves nothing behind.
    struct RemoveOnDrop(std::path::PathBuf);

    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn find_tool(name: &str) -> Option<std::path::PathBuf> {
        ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin"]
            .iter()
            .map(|dir| std::path::Path::new(dir).join(name))
            .find(|path| path.exists())
    }
}
