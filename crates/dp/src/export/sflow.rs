//! An sFlow version 5 datagram encoder (sflow.org, "sFlow Version 5", 2004) and the packet
//! sampler that feeds it.
//!
//! - Flow samples (enterprise 0, format 1): the sampling port as source, the sampling rate,
//!   the sample pool, input and output port, and one raw packet header record (format 1,
//!   header protocol 1 = Ethernet) with the first [`HEADER_BYTES`] bytes of the frame.
//! - Counter samples (enterprise 0, format 2) with one generic interface counters record
//!   (format 1) per port.
//!
//! Ports are identified by their ifIndex, which qswitch takes as the port's index + 1 (0
//! means "unknown" in sFlow). Samples are packed into datagrams of at most `max_len` bytes;
//! each datagram carries the agent's sequence number, each sample its source's.

use std::net::IpAddr;

/// Bytes of a sampled frame copied into a flow sample.
pub const HEADER_BYTES: usize = 128;
/// The sFlow version number.
pub const VERSION: u32 = 5;

/// A 1-in-N packet sampler for one port (sFlow asks for random sampling: the skip between
/// samples is drawn uniformly from 1..=2N-1, mean N, with a xorshift generator).
#[derive(Debug, Clone)]
pub struct Sampler {
    rate: u32,
    skip: u32,
    rng: u64,
    /// Frames seen (the sample pool).
    pub pool: u32,
    /// Frames sampled.
    pub samples: u32,
}

impl Sampler {
    pub fn new(rate: u32, seed: u64) -> Sampler {
        let mut s = Sampler {
            rate: rate.max(1),
            skip: 0,
            rng: seed | 1,
            pool: 0,
            samples: 0,
        };
        s.skip = s.next_skip();
        s
    }

    pub fn rate(&self) -> u32 {
        self.rate
    }

    fn next_skip(&mut self) -> u32 {
        if self.rate == 1 {
            return 1;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        1 + (self.rng % (2 * u64::from(self.rate) - 1)) as u32
    }

    /// Counts a frame; true if it is to be sampled.
    pub fn take(&mut self) -> bool {
        self.pool = self.pool.wrapping_add(1);
        self.skip -= 1;
        if self.skip > 0 {
            return false;
        }
        self.skip = self.next_skip();
        self.samples = self.samples.wrapping_add(1);
        true
    }
}

/// One sampled frame.
#[derive(Debug, Clone)]
pub struct FlowSample<'a> {
    /// ifIndex of the port that sampled it (the data source).
    pub source: u32,
    pub input: u32,
    pub output: u32,
    pub sampling_rate: u32,
    /// Frames the source had seen when this one was sampled.
    pub sample_pool: u32,
    /// Frames the source could not sample (resources).
    pub drops: u32,
    /// The frame as it crossed the switch (without FCS); only its first
    /// [`HEADER_BYTES`] are sent.
    pub frame: &'a [u8],
    /// The frame's full length when `frame` holds only its start (`None`: `frame.len()`).
    pub frame_len: Option<u32>,
}

/// Generic interface counters of one port (RFC 2233 names; 32-bit ones wrap).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IfCounters {
    pub if_index: u32,
    /// bit/s (0: unknown).
    pub speed: u64,
    pub up: bool,
    pub in_octets: u64,
    pub in_ucast: u32,
    pub in_mcast: u32,
    pub in_bcast: u32,
    pub in_discards: u32,
    pub in_errors: u32,
    pub out_octets: u64,
    pub out_ucast: u32,
    pub out_mcast: u32,
    pub out_bcast: u32,
    pub out_discards: u32,
    pub out_errors: u32,
}

/// Writes sFlow datagrams (see the module docs). Pure: uptime passed in, datagrams returned.
#[derive(Debug, Clone)]
pub struct SflowEncoder {
    agent: IpAddr,
    sub_agent: u32,
    max_len: usize,
    datagrams: u32,
    /// Per source ifIndex: flow sample and counter sample sequence numbers.
    flow_seq: std::collections::BTreeMap<u32, u32>,
    counter_seq: std::collections::BTreeMap<u32, u32>,
}

const FLOW_SAMPLE: u32 = 1;
const COUNTER_SAMPLE: u32 = 2;
const RAW_HEADER: u32 = 1;
const GENERIC_IF: u32 = 1;
const GENERIC_IF_LEN: usize = 88;

impl SflowEncoder {
    /// An encoder for the agent at `agent` (the address collectors key on), writing
    /// datagrams of at most `max_len` bytes (at least 512).
    pub fn new(agent: IpAddr, sub_agent: u32, max_len: usize) -> SflowEncoder {
        SflowEncoder {
            agent,
            sub_agent,
            max_len: max_len.max(512),
            datagrams: 0,
            flow_seq: Default::default(),
            counter_seq: Default::default(),
        }
    }

    /// Datagrams written so far.
    pub fn datagrams(&self) -> u32 {
        self.datagrams
    }

    /// Datagrams carrying `flows` then `counters`, at `uptime_ms` (the agent's uptime).
    pub fn encode(
        &mut self,
        flows: &[FlowSample<'_>],
        counters: &[IfCounters],
        uptime_ms: u32,
    ) -> Vec<Vec<u8>> {
        let mut samples: Vec<Vec<u8>> = Vec::with_capacity(flows.len() + counters.len());
        for f in flows {
            samples.push(self.flow_sample(f));
        }
        for c in counters {
            samples.push(self.counter_sample(c));
        }
        let mut out = Vec::new();
        let mut dg: Option<(Vec<u8>, u32)> = None;
        for s in samples {
            if let Some((d, _)) = &dg {
                if d.len() + s.len() > self.max_len {
                    out.push(self.finish(dg.take().expect("open")));
                }
            }
            let (d, n) = dg.get_or_insert_with(|| (self.start(uptime_ms), 0));
            d.extend_from_slice(&s);
            *n += 1;
        }
        if let Some(open) = dg {
            out.push(self.finish(open));
        }
        out
    }

    fn start(&mut self, uptime_ms: u32) -> Vec<u8> {
        self.datagrams = self.datagrams.wrapping_add(1);
        let mut d = Vec::with_capacity(self.max_len);
        put32(&mut d, VERSION);
        match self.agent {
            IpAddr::V4(a) => {
                put32(&mut d, 1);
                d.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                put32(&mut d, 2);
                d.extend_from_slice(&a.octets());
            }
        }
        put32(&mut d, self.sub_agent);
        put32(&mut d, self.datagrams);
        put32(&mut d, uptime_ms);
        put32(&mut d, 0); // sample count, in finish
        d
    }

    fn finish(&self, (mut d, n): (Vec<u8>, u32)) -> Vec<u8> {
        let at = match self.agent {
            IpAddr::V4(_) => 24,
            IpAddr::V6(_) => 36,
        };
        d[at..at + 4].copy_from_slice(&n.to_be_bytes());
        d
    }

    fn flow_sample(&mut self, f: &FlowSample<'_>) -> Vec<u8> {
        let seq = self.flow_seq.entry(f.source).or_insert(0);
        *seq = seq.wrapping_add(1);
        let header = &f.frame[..f.frame.len().min(HEADER_BYTES)];
        let padded = header.len().div_ceil(4) * 4;
        let record_len = 16 + padded;
        let mut s = Vec::with_capacity(8 + 32 + 8 + record_len);
        put32(&mut s, FLOW_SAMPLE);
        put32(&mut s, (32 + 8 + record_len) as u32);
        put32(&mut s, *seq);
        put32(&mut s, f.source & 0x00ff_ffff); // source id: type 0 (ifIndex), index
        put32(&mut s, f.sampling_rate);
        put32(&mut s, f.sample_pool);
        put32(&mut s, f.drops);
        put32(&mut s, f.input);
        put32(&mut s, f.output);
        put32(&mut s, 1); // flow records
        put32(&mut s, RAW_HEADER);
        put32(&mut s, record_len as u32);
        put32(&mut s, 1); // header protocol: Ethernet (ISO 8802-3)
        put32(&mut s, f.frame_len.unwrap_or(f.frame.len() as u32)); // frame length
        put32(&mut s, 0); // stripped: we hold no FCS
        put32(&mut s, header.len() as u32);
        s.extend_from_slice(header);
        s.resize(s.len() + padded - header.len(), 0);
        s
    }

    fn counter_sample(&mut self, c: &IfCounters) -> Vec<u8> {
        let seq = self.counter_seq.entry(c.if_index).or_insert(0);
        *seq = seq.wrapping_add(1);
        let mut s = Vec::with_capacity(8 + 12 + 8 + GENERIC_IF_LEN);
        put32(&mut s, COUNTER_SAMPLE);
        put32(&mut s, (12 + 8 + GENERIC_IF_LEN) as u32);
        put32(&mut s, *seq);
        put32(&mut s, c.if_index & 0x00ff_ffff);
        put32(&mut s, 1); // counter records
        put32(&mut s, GENERIC_IF);
        put32(&mut s, GENERIC_IF_LEN as u32);
        put32(&mut s, c.if_index);
        put32(&mut s, 6); // ifType: ethernetCsmacd
        s.extend_from_slice(&c.speed.to_be_bytes());
        put32(&mut s, 1); // ifDirection: full duplex
        put32(&mut s, if c.up { 3 } else { 0 }); // ifStatus: admin and oper up
        s.extend_from_slice(&c.in_octets.to_be_bytes());
        for v in [
            c.in_ucast,
            c.in_mcast,
            c.in_bcast,
            c.in_discards,
            c.in_errors,
            0,
        ] {
            put32(&mut s, v); // ..., ifInUnknownProtos
        }
        s.extend_from_slice(&c.out_octets.to_be_bytes());
        for v in [
            c.out_ucast,
            c.out_mcast,
            c.out_bcast,
            c.out_discards,
            c.out_errors,
            0,
        ] {
            put32(&mut s, v); // ..., ifPromiscuousMode
        }
        s
    }
}

fn put32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_be_bytes());
}
