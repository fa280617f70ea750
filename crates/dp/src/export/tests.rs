use super::*;
use qswitch_wire::flow::IpPair;

const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

/// Ethernet + IPv4 + UDP (or TCP when `flags` is set) with `payload` bytes.
fn v4(sport: u16, flags: Option<u8>, payload: usize) -> Vec<u8> {
    let l4 = if flags.is_some() { 20 } else { 8 };
    let mut f = Vec::new();
    f.extend_from_slice(&B);
    f.extend_from_slice(&A);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
    f.extend_from_slice(&((20 + l4 + payload) as u16).to_be_bytes());
    f.extend_from_slice(&[
        0,
        0,
        0x40,
        0,
        64,
        if flags.is_some() { 6 } else { 17 },
        0,
        0,
    ]);
    f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&80u16.to_be_bytes());
    if let Some(fl) = flags {
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&[0x50, fl, 0xff, 0xff, 0, 0, 0, 0]);
    } else {
        f.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
    }
    f.resize(f.len() + payload, 0xab);
    f
}

fn cache(capacity: usize, sampling: u32) -> FlowCache {
    FlowCache::new(CacheConfig {
        capacity,
        sampling,
        active_timeout_ms: 60_000,
        idle_timeout_ms: 15_000,
    })
}

#[test]
fn counts_a_flow_and_its_tcp_flags() {
    let mut c = cache(64, 1);
    let mut out = Vec::new();
    c.observe(&v4(1000, Some(0x02), 0), 1, 2, 1_000, &mut out);
    c.observe(&v4(1000, Some(0x10), 100), 1, 2, 1_500, &mut out);
    c.observe(&v4(1000, Some(0x11), 0), 1, 2, 2_000, &mut out);
    assert!(out.is_empty());
    c.flush(&mut out);
    assert_eq!(out.len(), 1);
    let r = out[0];
    assert_eq!((r.packets, r.octets), (3, 40 + 140 + 40));
    assert_eq!((r.start_ms, r.end_ms), (1_000, 2_000));
    assert_eq!(r.tcp_flags, 0x13);
    assert_eq!(r.end_reason, EndReason::ForcedEnd);
    assert_eq!(
        r.key.ips,
        IpPair::V4 {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2]
        }
    );
    assert_eq!((r.key.src_port, r.key.dst_port, r.key.proto), (1000, 80, 6));
    assert_eq!((r.key.ingress, r.key.egress, r.key.vlan), (1, 2, None));
    assert_eq!((r.key.src_mac, r.key.dst_mac), (A, B));
    assert!(c.is_empty());
}

#[test]
fn timeouts_end_flows_with_their_reason() {
    let mut c = cache(64, 1);
    let mut out = Vec::new();
    c.observe(&v4(1, None, 10), 1, 2, 0, &mut out);
    c.observe(&v4(2, None, 10), 1, 2, 0, &mut out);
    // Flow 2 stays busy up to its active timeout (its 61st frame, at 60 s, opens a new
    // record); flow 1 goes idle.
    for t in (1_000..=60_000).step_by(1_000) {
        c.observe(&v4(2, None, 10), 1, 2, t, &mut out);
    }
    c.expire(60_000, &mut out);
    let mut reasons: Vec<(u16, EndReason, u64)> = out
        .iter()
        .map(|r| (r.key.src_port, r.end_reason, r.packets))
        .collect();
    reasons.sort_by_key(|r| r.0);
    assert_eq!(
        reasons,
        [
            (1, EndReason::IdleTimeout, 1),
            (2, EndReason::ActiveTimeout, 60)
        ]
    );
    let s = c.stats();
    assert_eq!((s.idle, s.active, s.flows), (1, 1, 3));
    assert_eq!(c.len(), 1);
    // An idle flow that comes back starts a new record; the old one ends idle.
    out.clear();
    c.observe(&v4(3, None, 10), 1, 2, 100_000, &mut out);
    c.observe(&v4(3, None, 10), 1, 2, 120_000, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].end_reason, EndReason::IdleTimeout);
}

#[test]
fn a_full_cache_evicts_the_least_recent_flow_and_counts_it() {
    // One set of WAYS slots: the WAYS+1st flow evicts the oldest.
    let mut c = cache(1, 1);
    let mut out = Vec::new();
    for p in 0..cache::WAYS as u16 {
        c.observe(&v4(p, None, 0), 1, 2, u64::from(p), &mut out);
    }
    assert!(out.is_empty());
    c.observe(&v4(0, None, 0), 1, 2, 100, &mut out); // port 0 is recent again
    c.observe(&v4(99, None, 0), 1, 2, 101, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].key.src_port, 1);
    assert_eq!(out[0].end_reason, EndReason::LackOfResources);
    assert_eq!(c.stats().evicted, 1);
    assert_eq!(c.len(), cache::WAYS);
}

#[test]
fn sampling_accounts_one_in_n_and_skips_what_is_not_ip() {
    let mut c = cache(64, 10);
    let mut out = Vec::new();
    for t in 0..1000 {
        c.observe(&v4(7, None, 0), 1, 2, t, &mut out);
    }
    let arp = [0xffu8; 60];
    for _ in 0..10 {
        c.observe(&arp, 1, 2, 0, &mut out);
    }
    c.flush(&mut out);
    assert_eq!(out[0].packets, 100);
    let s = c.stats();
    assert_eq!((s.frames, s.sampled, s.not_ip), (1010, 101, 1));
    // Bad input: truncated frames are counted, never a panic.
    let f = v4(7, Some(2), 0);
    for n in 0..f.len() {
        c.observe(&f[..n], 1, 2, 0, &mut out);
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// The sets of a message: (set id, body).
fn sets(m: &[u8]) -> Vec<(u16, &[u8])> {
    assert_eq!(be16(m, 0), 10);
    assert_eq!(usize::from(be16(m, 2)), m.len());
    let mut v = Vec::new();
    let mut at = 16;
    while at < m.len() {
        let len = usize::from(be16(m, at + 2));
        assert!(len >= 4 && at + len <= m.len(), "set length {len} at {at}");
        v.push((be16(m, at), &m[at + 4..at + len]));
        at += len;
    }
    v
}

fn records(n: usize, v6: bool) -> Vec<FlowRecord> {
    let mut c = cache(4096, 1);
    let mut out = Vec::new();
    for p in 0..n as u16 {
        let mut f = v4(p, None, 0);
        if v6 {
            // Turn it into IPv6/UDP with the same ports.
            let udp = f[34..42].to_vec();
            f.truncate(12);
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 8, 17, 64]);
            f.extend_from_slice(&[0xfd; 16]);
            f.extend_from_slice(&[0xfe; 16]);
            f.extend_from_slice(&udp);
        }
        c.observe(&f, 1, 2, 5, &mut out);
    }
    c.flush(&mut out);
    out
}

#[test]
fn ipfix_messages_fit_carry_templates_and_count_records() {
    let mut e = IpfixEncoder::new(7, 1, 1400);
    let mut recs = records(50, false);
    recs.extend(records(30, true));
    let msgs = e.encode(&recs, 1_700_000_000_000);
    assert!(msgs.len() >= 3, "{}", msgs.len());
    let mut seq = 0u32;
    let mut data = [0usize; 2];
    for (i, m) in msgs.iter().enumerate() {
        assert!(m.len() <= 1400);
        assert_eq!(be32(m, 4), 1_700_000_000);
        assert_eq!(be32(m, 8), seq, "message {i}");
        assert_eq!(be32(m, 12), 7);
        for (id, body) in sets(m) {
            match id {
                2 => {
                    assert_eq!(i, 0, "templates in the first message only");
                    assert_eq!(be16(body, 0), ipfix::TEMPLATE_V4);
                    assert_eq!(be16(body, 2), 16);
                }
                3 => assert_eq!(be16(body, 0), ipfix::TEMPLATE_SAMPLING),
                ipfix::TEMPLATE_SAMPLING => {
                    assert_eq!((be32(body, 0), be32(body, 4), body[8]), (7, 1, 1));
                    seq += 1;
                }
                ipfix::TEMPLATE_V4 | ipfix::TEMPLATE_V6 => {
                    let v6 = id == ipfix::TEMPLATE_V6;
                    let n = ipfix::record_len(v6);
                    assert_eq!(body.len() % n, 0);
                    data[usize::from(v6)] += body.len() / n;
                    seq += (body.len() / n) as u32;
                }
                other => panic!("set {other}"),
            }
        }
    }
    assert_eq!(data, [50, 30]);
    assert_eq!(e.sequence(), seq);
    // Not due again within the interval; due after it, or when asked.
    let again = e.encode(&recs[..1], 1_700_000_001_000);
    assert!(sets(&again[0]).iter().all(|(id, _)| *id != 2));
    assert_eq!(be32(&again[0], 8), seq);
    let later = e.encode(&[], 1_700_000_011_000);
    assert_eq!(sets(&later[0])[0].0, 2);
    e.resend_templates();
    assert_eq!(sets(&e.encode(&[], 1_700_000_012_000)[0])[0].0, 2);
    assert!(e.encode(&[], 1_700_000_013_000).is_empty());
}

#[test]
fn ipfix_record_layout() {
    let mut e = IpfixEncoder::new(1, 1, 1400);
    let r = records(1, false)[0];
    let m = &e.encode(&[r], 0)[0];
    let (_, body) = *sets(m)
        .iter()
        .find(|(id, _)| *id == ipfix::TEMPLATE_V4)
        .unwrap();
    assert_eq!(&body[0..6], &A);
    assert_eq!(&body[6..12], &B);
    assert_eq!(&body[14..18], &[10, 0, 0, 1]);
    assert_eq!(&body[18..22], &[10, 0, 0, 2]);
    assert_eq!((be16(body, 22), be16(body, 24), body[26]), (0, 80, 17));
    assert_eq!((be32(body, 29), be32(body, 33)), (1, 2));
    assert_eq!(u64::from_be_bytes(body[37..45].try_into().unwrap()), 1);
    assert_eq!(u64::from_be_bytes(body[45..53].try_into().unwrap()), 28);
    assert_eq!(body[69], EndReason::ForcedEnd as u8);
}

#[test]
fn sflow_datagrams() {
    let frame = v4(5, Some(0x02), 200);
    let mut s = Sampler::new(1, 1);
    assert!((0..5).all(|_| s.take()));
    let mut s = Sampler::new(100, 42);
    let n = (0..100_000).filter(|_| s.take()).count();
    assert!((900..1100).contains(&n), "{n}");
    let mut e = SflowEncoder::new("192.0.2.1".parse().unwrap(), 0, 1400);
    let flows: Vec<FlowSample> = (0..20)
        .map(|i| FlowSample {
            frame_len: None,
            source: 1,
            input: 1,
            output: 2,
            sampling_rate: 100,
            sample_pool: i * 100,
            drops: 0,
            frame: &frame,
        })
        .collect();
    let counters = [IfCounters {
        if_index: 1,
        in_octets: 12345,
        in_ucast: 10,
        up: true,
        ..Default::default()
    }];
    let dgs = e.encode(&flows, &counters, 1000);
    assert!(dgs.len() >= 2);
    let mut samples = 0;
    for (i, d) in dgs.iter().enumerate() {
        assert!(d.len() <= 1400);
        assert_eq!(be32(d, 0), 5);
        assert_eq!(be32(d, 4), 1);
        assert_eq!(be32(d, 16), i as u32 + 1);
        let n = be32(d, 24) as usize;
        let mut at = 28;
        for _ in 0..n {
            let len = be32(d, at + 4) as usize;
            at += 8 + len;
        }
        assert_eq!(at, d.len(), "sample lengths add up");
        samples += n;
    }
    assert_eq!(samples, 21);
    // First flow sample: raw header of 128 bytes of a 254-byte frame.
    let d = &dgs[0];
    assert_eq!(be32(d, 28), 1);
    assert_eq!(be32(d, 36), 1, "sample sequence");
    assert_eq!(be32(d, 44), 100, "rate");
    assert_eq!((be32(d, 56), be32(d, 60)), (1, 2), "in, out");
    assert_eq!(be32(d, 80), frame.len() as u32);
    assert_eq!(be32(d, 88), 128);
    assert_eq!(&d[92..92 + 128], &frame[..128]);
}

#[test]
fn the_in_place_parse_agrees_with_the_general_one() {
    // Every byte of the headers set to values that matter to either parse, and every
    // truncation: the fast path takes what it can and says the same as the general one.
    for base in [
        v4(1000, None, 30),
        v4(2000, Some(0x12), 0),
        v4(3000, None, 0),
    ] {
        for len in 0..=base.len() {
            let f = &base[..len];
            assert_eq!(
                cache::parse(f, 1, 2),
                cache::parse_general(f, 1, 2),
                "{len}"
            );
        }
        for at in 0..base.len().min(60) {
            for v in [
                0, 1, 0x06, 0x08, 0x11, 0x1f, 0x20, 0x45, 0x46, 0x60, 0x81, 0xff,
            ] {
                let mut f = base.clone();
                f[at] = v;
                assert_eq!(
                    cache::parse(&f, 1, 2),
                    cache::parse_general(&f, 1, 2),
                    "{at} {v}"
                );
            }
        }
    }
}

#[test]
fn interleaved_and_repeated_flows_keep_exact_counts() {
    // 4 flows frame by frame (as the DPDK load sends), runs of one flow (a guest's burst),
    // then more flows than the cache holds: every frame and octet is in exactly one record.
    // Frames of 12 payload bytes or more take the memo of recent flows, shorter ones not.
    let mut c = cache(1_024, 1);
    let mut out = Vec::new();
    let mut sent = std::collections::HashMap::<u16, (u64, u64)>::new();
    let mut offer = |c: &mut FlowCache, out: &mut Vec<FlowRecord>, sport: u16, payload| {
        let f = v4(sport, None, payload);
        c.observe(&f, 1, 2, 1_000, out);
        let e = sent.entry(sport).or_default();
        *e = (e.0 + 1, e.1 + (f.len() - 14) as u64);
    };
    for i in 0..400u16 {
        offer(&mut c, &mut out, i % 4, 12 + usize::from(i % 7));
    }
    for i in 0..400u16 {
        offer(&mut c, &mut out, 10 + i / 50, 20);
    }
    for i in 0..5_000u16 {
        offer(
            &mut c,
            &mut out,
            100 + i % 2_500,
            if i % 3 == 0 { 1 } else { 12 },
        );
    }
    c.flush(&mut out);
    let mut got = std::collections::HashMap::<u16, (u64, u64)>::new();
    for r in &out {
        let e = got.entry(r.key.src_port).or_default();
        *e = (e.0 + r.packets, e.1 + r.octets);
    }
    assert_eq!(got, sent);
    assert!(c.stats().evicted > 0, "more flows than room");
    assert!(c.is_empty());
}

#[test]
fn the_memo_never_names_a_slot_its_flow_left() {
    // One set: after the flush, b takes the slot a had; a's memo entry must not count a's
    // next frame into b, nor after an expiry.
    let mut c = cache(cache::WAYS, 1);
    let mut out = Vec::new();
    let (a, b) = (v4(1, None, 20), v4(2, None, 20));
    c.observe(&a, 1, 2, 1_000, &mut out);
    c.observe(&a, 1, 2, 1_000, &mut out);
    c.flush(&mut out);
    c.observe(&b, 1, 2, 2_000, &mut out);
    c.observe(&a, 1, 2, 2_000, &mut out);
    c.expire(100_000, &mut out);
    c.observe(&b, 1, 2, 100_000, &mut out);
    c.observe(&b, 1, 2, 100_000, &mut out);
    c.flush(&mut out);
    let counts: Vec<(u16, u64)> = out.iter().map(|r| (r.key.src_port, r.packets)).collect();
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(counts[0] == (1, 2) && counts[3] == (2, 2), "{counts:?}");
    assert!(
        counts[1..3].contains(&(1, 1)) && counts[1..3].contains(&(2, 1)),
        "{counts:?}"
    );
    assert_eq!(c.stats().flows, 4);
}
