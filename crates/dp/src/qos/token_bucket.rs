//! A token bucket shared lock-free by the workers that poll one port's queues.
//!
//! Tokens are kept in nano-bytes (bytes × 10⁹), so a refill is exactly `dt_ns × bytes/s`
//! with no division and no rounding loss however short the interval. The rate and depth are
//! passed into every call (the allocator may change them at any tick), and so is `now`: the
//! bucket never reads a clock.
//!
//! Two ways to use it:
//! - [`TokenBucket::conform`] is the classic single-rate meter (RFC 2697's committed bucket,
//!   colour-blind): a packet conforms and takes its tokens only if enough are there.
//! - The datapath uses [`TokenBucket::refill`] + [`TokenBucket::available`] before a poll
//!   and [`TokenBucket::take`] after it: a port is polled while it has any tokens, and what
//!   the poll brought in is charged afterwards, possibly into debt. A port in debt is not
//!   polled until the debt is paid back, so the long-run rate is exact, frames are never
//!   dropped for lack of tokens, and a 64 KiB TSO segment needs no 64 KiB of depth.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

const NANO: i64 = 1_000_000_000;
/// Longest interval credited at once; depth caps the credit anyway.
const MAX_DT_NS: u64 = 10 * 1_000_000_000;

/// See the module documentation.
#[derive(Debug)]
pub struct TokenBucket {
    /// Nano-bytes; negative = debt.
    tokens: AtomicI64,
    /// Time of the last refill, ns.
    last: AtomicU64,
}

impl TokenBucket {
    /// A bucket holding `initial` bytes at time `now`.
    pub fn new(initial: u64, now: u64) -> TokenBucket {
        TokenBucket {
            tokens: AtomicI64::new(to_nano(initial)),
            last: AtomicU64::new(now),
        }
    }

    /// Credits `rate_bps` (bits/s) for the time since the last refill, up to `depth` bytes.
    /// Concurrent callers each credit a disjoint interval.
    #[inline]
    pub fn refill(&self, now: u64, rate_bps: u64, depth: u64) {
        let last = self.last.load(Ordering::Relaxed);
        if now <= last
            || self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let dt = u128::from((now - last).min(MAX_DT_NS));
        let add = (dt * u128::from(rate_bps / 8)).min(i64::MAX as u128 / 4) as i64;
        let depth = to_nano(depth);
        let before = self.tokens.fetch_add(add, Ordering::Relaxed);
        if before.saturating_add(add) > depth {
            self.tokens.fetch_min(depth, Ordering::Relaxed);
        }
    }

    /// Whole bytes available now (negative: debt).
    #[inline]
    pub fn available(&self) -> i64 {
        self.tokens.load(Ordering::Relaxed) / NANO
    }

    /// Whole bytes a [`TokenBucket::refill`] at `now` would leave (negative: debt), without
    /// refilling or taking anything: a read-only look for `trace`.
    pub fn peek(&self, now: u64, rate_bps: u64, depth: u64) -> i64 {
        let last = self.last.load(Ordering::Relaxed);
        let tokens = self.tokens.load(Ordering::Relaxed);
        if now <= last {
            return tokens / NANO;
        }
        let dt = u128::from((now - last).min(MAX_DT_NS));
        let add = (dt * u128::from(rate_bps / 8)).min(i64::MAX as u128 / 4) as i64;
        tokens.saturating_add(add).min(to_nano(depth)) / NANO
    }

    /// Takes `bytes`, going into debt if there are not enough.
    #[inline]
    pub fn take(&self, bytes: u64) {
        self.tokens.fetch_sub(to_nano(bytes), Ordering::Relaxed);
    }

    /// Nanoseconds until the bucket is out of debt at `rate_bps` (0 if it is not in debt;
    /// `u64::MAX` at rate 0).
    pub fn ns_until_positive(&self, rate_bps: u64) -> u64 {
        let t = self.tokens.load(Ordering::Relaxed);
        if t > 0 {
            return 0;
        }
        let bytes_per_s = rate_bps / 8;
        if bytes_per_s == 0 {
            return u64::MAX;
        }
        (t.unsigned_abs() / bytes_per_s).saturating_add(1)
    }

    /// RFC 2697-style colour-blind meter: refills, then takes `bytes` and returns true if
    /// that many tokens are there; otherwise takes nothing and returns false.
    pub fn conform(&self, bytes: u64, now: u64, rate_bps: u64, depth: u64) -> bool {
        self.refill(now, rate_bps, depth);
        let need = to_nano(bytes);
        let mut cur = self.tokens.load(Ordering::Relaxed);
        loop {
            if cur < need {
                return false;
            }
            match self.tokens.compare_exchange_weak(
                cur,
                cur - need,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(x) => cur = x,
            }
        }
    }
}

#[inline]
fn to_nano(bytes: u64) -> i64 {
    i64::try_from(bytes)
        .unwrap_or(i64::MAX)
        .saturating_mul(NANO)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// RFC 2697's committed bucket with CIR 8 Mbit/s (1 byte/µs) and CBS 3000 bytes, on an
    /// injected clock: starts full, 1500-byte packets back to back conform until the bucket
    /// is empty, then exactly at the refill rate.
    #[test]
    fn rfc2697_sequence() {
        let (rate, cbs) = (8_000_000, 3000);
        let b = TokenBucket::new(cbs, 0);
        let mut got = Vec::new();
        // t = 0: two fit (3000 tokens), the third does not.
        for _ in 0..3 {
            got.push(b.conform(1500, 0, rate, cbs));
        }
        assert_eq!(got, [true, true, false]);
        // 1 ms later 1000 bytes came back: still not enough for 1500.
        assert!(!b.conform(1500, MS, rate, cbs));
        // 1.5 ms after the start: 1500 bytes, exactly one packet.
        assert!(b.conform(1500, 1500 * 1000, rate, cbs));
        assert!(!b.conform(1, 1500 * 1000, rate, cbs));
        // Idle for 1 s: the bucket holds CBS, not a second's worth.
        let t = 1500 * 1000 + 1000 * MS;
        assert_eq!(
            {
                b.refill(t, rate, cbs);
                b.available()
            },
            3000
        );
        assert!(b.conform(3000, t, rate, cbs));
        assert!(!b.conform(64, t, rate, cbs));
        // Small packets: 64 bytes every 64 µs conform forever (exactly the rate).
        let mut t = t;
        for _ in 0..1000 {
            t += 64_000;
            assert!(b.conform(64, t, rate, cbs));
        }
        // Time going backwards credits nothing.
        assert!(!b.conform(64, t - 1000, rate, cbs));
    }

    #[test]
    fn debt_is_paid_back_at_the_rate() {
        let rate = 80_000_000; // 10 bytes per µs
        let b = TokenBucket::new(1000, 0);
        b.take(65_000);
        assert_eq!(b.available(), -64_000);
        assert_eq!(b.ns_until_positive(rate), 6_400_001);
        b.refill(6_400 * 1000, rate, 100_000);
        assert_eq!(b.available(), 0);
        b.refill(6_500 * 1000, rate, 100_000);
        assert_eq!(b.available(), 1000);
        assert_eq!(b.ns_until_positive(rate), 0);
        assert_eq!(b.ns_until_positive(0), 0);
        b.take(2000);
        assert_eq!(b.ns_until_positive(0), u64::MAX);
    }

    /// `peek` sees what a refill at that time would leave, and changes nothing.
    #[test]
    fn peek_takes_nothing() {
        let (rate, depth) = (8_000, 10); // 1 byte per ms
        let b = TokenBucket::new(depth, 0);
        assert!(b.conform(9, 0, rate, depth));
        assert_eq!(b.peek(0, rate, depth), 1);
        assert_eq!(b.peek(3 * MS, rate, depth), 4);
        assert_eq!(b.peek(100 * MS, rate, depth), 10, "capped at depth");
        assert_eq!(b.peek(3 * MS, rate, depth), 4, "nothing was credited");
        assert!(b.conform(4, 3 * MS, rate, depth));
        assert!(!b.conform(1, 3 * MS, rate, depth));
        assert_eq!(
            b.peek(MS, rate, depth),
            0,
            "time going backwards credits nothing"
        );
    }

    /// Over many irregular polls the admitted bytes match rate × time (no rounding loss).
    #[test]
    fn long_run_rate_is_exact() {
        let rate = 100_000_000; // 12.5 bytes/µs
        let b = TokenBucket::new(0, 0);
        let (mut t, mut admitted) = (0u64, 0u64);
        let mut step = 1u64;
        while t < 1000 * MS {
            step = (step * 7919 + 13) % 50_000 + 1; // 1 ns .. 50 µs
            t += step;
            b.refill(t, rate, 200_000);
            if b.available() > 0 {
                b.take(1514);
                admitted += 1514;
            }
        }
        let expect = 12_500_000.0;
        assert!((admitted as f64 - expect).abs() < 3000.0, "{admitted}");
    }
}
