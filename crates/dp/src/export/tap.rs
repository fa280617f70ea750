//! The data-path side of flow export: what the workers hand the exporter.
//!
//! An [`ExportTap`] is published with the port table (a worker's view holds it, so a
//! switch that exports nothing pays one predictable branch per burst, in
//! [`crate::engine`]). It has one [`Slot`] per worker behind a mutex that only that worker
//! and the exporter ever take: the worker once per burst, the exporter a few times a second
//! to take what is pending and to expire flows. No lock is shared between workers.
//!
//! Per burst, for every frame the pipeline sent to a destination (a flooded frame once per
//! destination, as the egress port is part of a flow's key):
//! - IPFIX: the worker's [`FlowCache`] is offered them, a destination's frames at once
//!   ([`FlowCache::observe_burst`], 1 in N accounted); records that end (timeouts met at the
//!   flow's next frame, evictions) go to the slot's pending list;
//! - sFlow: the ingress port's [`Sampler`] (one per port and worker) picks 1 in N on
//!   average; a picked frame's first [`HEADER_BYTES`] are copied into the pending samples.
//!
//! Both pending lists are bounded ([`MAX_PENDING_RECORDS`], [`MAX_PENDING_SAMPLES`]): what
//! does not fit is dropped and counted, so a stalled exporter never slows a worker, and
//! nothing allocates on the worker's side (the exporter swaps in an empty list of the same
//! capacity when it takes the full one).

use parking_lot::Mutex;

use super::cache::{CacheConfig, CacheStats, FlowCache, FlowRecord};
use super::sflow::{Sampler, HEADER_BYTES};
use crate::ids::PortId;
use crate::packet::{Pkt, BURST};

/// Flow records a worker holds for the exporter at most.
pub const MAX_PENDING_RECORDS: usize = 16_384;
/// sFlow samples a worker holds for the exporter at most.
pub const MAX_PENDING_SAMPLES: usize = 1_024;

/// What to export, as the workers need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapConfig {
    /// IPFIX: the flow cache's settings (`None`: no IPFIX).
    pub ipfix: Option<CacheConfig>,
    /// sFlow: 1 in N frames sampled (`None`: no sFlow).
    pub sflow: Option<u32>,
}

/// One sampled frame, as the exporter encodes it ([`super::FlowSample`]).
#[derive(Clone)]
pub struct Sample {
    /// ifIndex of the ingress port (the sampling data source) and of the egress port.
    pub input: u32,
    pub output: u32,
    pub rate: u32,
    /// Frames this worker's sampler of the port had seen.
    pub pool: u32,
    /// Samples of the port this worker dropped before this one (full list).
    pub drops: u32,
    /// The frame's full length; its first `header_len` bytes.
    pub frame_len: u32,
    pub header_len: u8,
    pub header: [u8; HEADER_BYTES],
}

/// What one worker holds for the exporter.
pub struct Slot {
    pub cache: Option<FlowCache>,
    /// Records that ended, oldest first.
    pub records: Vec<FlowRecord>,
    pub samples: Vec<Sample>,
    /// Records and samples dropped because the lists were full.
    pub dropped_records: u64,
    pub dropped_samples: u64,
    /// sFlow: per port id.
    samplers: Vec<(Sampler, u32)>,
    rate: u32,
    worker: u64,
}

impl Slot {
    fn new(cfg: &TapConfig, worker: usize) -> Slot {
        Slot {
            cache: cfg.ipfix.map(FlowCache::new),
            records: Vec::with_capacity(if cfg.ipfix.is_some() {
                MAX_PENDING_RECORDS + BURST
            } else {
                0
            }),
            samples: Vec::with_capacity(if cfg.sflow.is_some() {
                MAX_PENDING_SAMPLES
            } else {
                0
            }),
            dropped_records: 0,
            dropped_samples: 0,
            // Made on first use of a port; room for a typical table from the start.
            samplers: Vec::with_capacity(if cfg.sflow.is_some() { 64 } else { 0 }),
            rate: cfg.sflow.unwrap_or(0),
            worker: worker as u64,
        }
    }

    /// The cache's counters (zero without IPFIX).
    pub fn cache_stats(&self) -> CacheStats {
        self.cache
            .as_ref()
            .map(FlowCache::stats)
            .unwrap_or_default()
    }

    fn sampler(&mut self, port: PortId) -> &mut (Sampler, u32) {
        let i = usize::from(port.0);
        if self.samplers.len() <= i {
            let rate = self.rate;
            let (base, w) = (self.samplers.len() as u64, self.worker);
            self.samplers.extend((base..=i as u64).map(|k| {
                // A different seed per port and worker, so samplers do not move in step.
                let seed = 0x9e37_79b9_7f4a_7c15u64.wrapping_mul(k + 1 + (w << 16));
                (Sampler::new(rate, seed), 0)
            }));
        }
        &mut self.samplers[i]
    }
}

/// The tap the workers see (see the module docs).
pub struct ExportTap {
    pub config: TapConfig,
    slots: Vec<Mutex<Slot>>,
}

/// A port's ifIndex in exported records: its id + 1 (0 means "none" in IPFIX and sFlow).
#[inline]
pub fn if_index(p: PortId) -> u32 {
    u32::from(p.0) + 1
}

impl ExportTap {
    /// A tap for `workers` workers.
    pub fn new(config: TapConfig, workers: usize) -> ExportTap {
        ExportTap {
            config,
            slots: (0..workers.max(1))
                .map(|w| Mutex::new(Slot::new(&config, w)))
                .collect(),
        }
    }

    /// The slots, for the exporter (one per worker).
    pub fn slots(&self) -> &[Mutex<Slot>] {
        &self.slots
    }

    /// Offers what worker `worker` is about to transmit: for each destination in
    /// `touched`, the frames of `pkts` that `out` lists for it. `vlan(i)` is frame `i`'s
    /// VLAN as the pipeline decided it (0: none). `now` is the switch clock (ns).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    pub fn offer(
        &self,
        worker: usize,
        pkts: &[Pkt],
        touched: &[PortId],
        out: &[Vec<u8>],
        ingress: PortId,
        vlan: impl Fn(usize) -> u16,
        now: u64,
    ) {
        let Some(slot) = self.slots.get(worker) else {
            return;
        };
        let mut slot = slot.lock();
        let s = &mut *slot;
        let now_ms = now / 1_000_000;
        let input = if_index(ingress);
        if let Some(cache) = s.cache.as_mut() {
            for &p in touched {
                let output = if_index(p);
                let Some(sel) = out.get(usize::from(p.0)) else {
                    continue;
                };
                let frames = sel.iter().map(|&i| {
                    let i = usize::from(i);
                    (pkts[i].frame(), vlan(i))
                });
                cache.observe_burst(frames, input, output, now_ms, &mut s.records);
                // At most one record a frame ended: within the list's spare room.
                if s.records.len() > MAX_PENDING_RECORDS {
                    s.dropped_records += (s.records.len() - MAX_PENDING_RECORDS) as u64;
                    s.records.truncate(MAX_PENDING_RECORDS);
                }
            }
        }
        if s.rate == 0 {
            return;
        }
        for &p in touched {
            let output = if_index(p);
            let Some(sel) = out.get(usize::from(p.0)) else {
                continue;
            };
            for &i in sel {
                let frame = pkts[usize::from(i)].frame();
                let full = s.samples.len() >= MAX_PENDING_SAMPLES;
                let (sampler, drops) = s.sampler(ingress);
                if !sampler.take() {
                    continue;
                }
                if full {
                    *drops = drops.wrapping_add(1);
                    s.dropped_samples += 1;
                    continue;
                }
                let (pool, d, rate) = (sampler.pool, *drops, sampler.rate());
                let n = frame.len().min(HEADER_BYTES);
                let mut header = [0u8; HEADER_BYTES];
                header[..n].copy_from_slice(&frame[..n]);
                s.samples.push(Sample {
                    input,
                    output,
                    rate,
                    pool,
                    drops: d,
                    frame_len: frame.len() as u32,
                    header_len: n as u8,
                    header,
                });
            }
        }
    }
}
