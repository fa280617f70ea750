//! One-core load generation: transmit and receive in the same loop.

use std::time::{Duration, Instant};

use crate::{Driver, Result};

/// What [`Driver::poll_loop`] / [`poll_loop_between`] do.
#[derive(Clone, Debug)]
pub struct LoadSpec<'a> {
    /// Pair to transmit on.
    pub tx_pair: u16,
    /// Pair to receive on; None = every enabled pair of the receiving driver.
    pub rx_pair: Option<u16>,
    /// Header bytes sent before each frame (normally 12 bytes of [`crate::NetHdr`]).
    pub hdr: &'a [u8],
    /// The template frame, sent as is every time.
    pub frame: &'a [u8],
    /// How long to transmit.
    pub duration: Duration,
    /// Packets queued per publish (one index update, at most one kick) and received per
    /// poll per pair. Default 32.
    pub burst: usize,
    /// Stop transmitting after this many packets (None: only the duration limits).
    pub tx_limit: Option<u64>,
    /// After transmitting, keep receiving until nothing has arrived for this long
    /// (default 0: stop at once). Not part of [`LoadStats::elapsed`].
    pub drain: Duration,
}

impl<'a> LoadSpec<'a> {
    /// Send on pair 0, receive on every enabled pair, bursts of 32, no limit, no drain.
    pub fn new(hdr: &'a [u8], frame: &'a [u8], duration: Duration) -> LoadSpec<'a> {
        LoadSpec {
            tx_pair: 0,
            rx_pair: None,
            hdr,
            frame,
            duration,
            burst: 32,
            tx_limit: None,
            drain: Duration::ZERO,
        }
    }
}

/// What a load loop did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Packets queued for transmission.
    pub tx_pkts: u64,
    /// Packets received (including during the drain).
    pub rx_pkts: u64,
    /// Bytes received, virtio-net headers included.
    pub rx_bytes: u64,
    /// Bursts cut short because the tx ring was full (back-pressure from the back-end).
    pub tx_ring_full: u64,
    /// Time spent transmitting (the drain excluded).
    pub elapsed: Duration,
}

impl Driver {
    /// Transmit `spec.frame` as fast as the tx ring allows on `spec.tx_pair` while
    /// receiving (without copying) on `spec.rx_pair` — one loop, one thread. For a
    /// back-end that loops packets back to the same port.
    pub fn poll_loop(&mut self, spec: &LoadSpec<'_>) -> Result<LoadStats> {
        run(Ends::One(self), spec)
    }
}

/// Like [`Driver::poll_loop`], transmitting on `tx` and receiving on `rx` (two ports of
/// the switch) in one loop on one thread.
pub fn poll_loop_between(
    tx: &mut Driver,
    rx: &mut Driver,
    spec: &LoadSpec<'_>,
) -> Result<LoadStats> {
    run(Ends::Two(tx, rx), spec)
}

enum Ends<'a> {
    One(&'a mut Driver),
    Two(&'a mut Driver, &'a mut Driver),
}

impl Ends<'_> {
    fn tx(&mut self) -> &mut Driver {
        match self {
            Ends::One(d) => d,
            Ends::Two(t, _) => t,
        }
    }
    fn rx(&mut self) -> &mut Driver {
        match self {
            Ends::One(d) => d,
            Ends::Two(_, r) => r,
        }
    }
}

fn run(mut ends: Ends<'_>, spec: &LoadSpec<'_>) -> Result<LoadStats> {
    let burst = spec.burst.max(1);
    let rx_pairs: Vec<u16> = match spec.rx_pair {
        Some(p) => vec![p],
        None => (0..ends.rx().enabled_pairs()).collect(),
    };
    let mut st = LoadStats::default();
    let start = Instant::now();
    let end = start + spec.duration;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let want = match spec.tx_limit {
            Some(l) if st.tx_pkts >= l => 0,
            Some(l) => burst.min((l - st.tx_pkts) as usize),
            None => burst,
        };
        if want == 0 {
            break;
        }
        let n = ends
            .tx()
            .send_burst(spec.tx_pair, spec.hdr, spec.frame, want)?;
        if n < want {
            st.tx_ring_full += 1;
        }
        st.tx_pkts += n as u64;
        for &p in &rx_pairs {
            let (k, b) = ends.rx().recv_discard(p, burst)?;
            st.rx_pkts += k;
            st.rx_bytes += b;
        }
    }
    st.elapsed = start.elapsed();
    if !spec.drain.is_zero() {
        let mut last = Instant::now();
        loop {
            let mut got = 0;
            for &p in &rx_pairs {
                let (k, b) = ends.rx().recv_discard(p, burst)?;
                got += k;
                st.rx_bytes += b;
            }
            st.rx_pkts += got;
            // Keep reclaiming so the tx side's completions are seen too.
            ends.tx().tx_in_flight(spec.tx_pair)?;
            let now = Instant::now();
            if got > 0 {
                last = now;
            } else if now - last >= spec.drain {
                break;
            }
        }
    }
    Ok(st)
}
