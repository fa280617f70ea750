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
    // Frames of 12 payload bytes or more are read in place into packed words, shorter ones
    // take the general parse.
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
fn a_slot_freed_and_taken_again_counts_only_its_new_flow() {
    // One set: after the flush, b takes the slot a had; a's next frame must not count into
    // b, nor after an expiry.
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

#[test]
fn the_packed_words_are_the_keys() {
    // For every frame the in-place words take (any VLAN decided, the ports of the switch),
    // they are the packed words of the key the general parse makes, and unpack to it.
    let mut taken = 0;
    for base in [
        v4(1000, None, 30),
        v4(2000, Some(0x12), 0),
        v4(3000, None, 0),
    ] {
        let mut frames = Vec::new();
        for len in 0..=base.len() {
            frames.push(base[..len].to_vec());
        }
        for at in 0..base.len().min(60) {
            for v in [
                0, 1, 0x06, 0x08, 0x11, 0x1f, 0x20, 0x45, 0x46, 0x60, 0x81, 0xff,
            ] {
                let mut f = base.clone();
                f[at] = v;
                frames.push(f);
            }
        }
        for f in &frames {
            for (ingress, egress, vlan) in [(1, 2, 0u16), (7, 65_535, 10), (65_535, 3, 4_095)] {
                let code = if vlan == 0 {
                    0
                } else {
                    u64::from(vlan) | 0x1000
                };
                let words = cache::frame_words(
                    f,
                    u64::from(ingress) << 40,
                    u64::from(egress) << 32 | code << 48,
                );
                let Some((words, octets, flags)) = words else {
                    continue;
                };
                taken += 1;
                let (mut key, o, fl) = cache::parse_general(f, ingress, egress).unwrap();
                key.vlan = (vlan != 0).then_some(vlan);
                assert_eq!((octets, flags), (o, fl));
                assert_eq!(cache::compact(&key), Some(words), "{f:?}");
                assert_eq!(cache::key_of(&words), key);
            }
        }
    }
    assert!(taken > 1_000, "{taken}");
    // Keys without packed words: IPv6, a port or VID that does not fit.
    let (key, _, _) = cache::parse(&v4(1, None, 0), 1, 2).unwrap();
    for k in [
        FlowKey {
            ingress: 70_000,
            ..key
        },
        FlowKey {
            egress: 70_000,
            ..key
        },
        FlowKey {
            vlan: Some(4_096),
            ..key
        },
        FlowKey {
            ips: IpPair::V6 {
                src: [1; 16],
                dst: [2; 16],
            },
            ..key
        },
    ] {
        assert_eq!(cache::compact(&k), None);
    }
}

/// Per source port: (frames, octets) in `records`.
fn totals(records: &[FlowRecord]) -> std::collections::BTreeMap<u16, (u64, u64)> {
    let mut got = std::collections::BTreeMap::new();
    for r in records {
        let e: &mut (u64, u64) = got.entry(r.key.src_port).or_default();
        *e = (e.0 + r.packets, e.1 + r.octets);
    }
    got
}

/// Offers `bursts` (each a list of (source port, payload bytes) frames) to a cache burst by
/// burst and to another frame by frame, both at `now_ms` + the burst's index; returns each
/// one's records (after a flush) and counters.
fn both_ways(
    capacity: usize,
    sampling: u32,
    bursts: &[Vec<(u16, usize)>],
) -> [(Vec<FlowRecord>, CacheStats); 2] {
    let (mut by_burst, mut by_frame) = (cache(capacity, sampling), cache(capacity, sampling));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (t, burst) in bursts.iter().enumerate() {
        let frames: Vec<Vec<u8>> = burst
            .iter()
            .map(|&(sport, payload)| v4(sport, (sport % 5 == 0).then_some(0x10), payload))
            .collect();
        let now = 1_000 + t as u64;
        by_burst.observe_burst(frames.iter().map(|f| (&f[..], 0)), 1, 2, now, &mut a);
        for f in &frames {
            by_frame.observe_in(f, 1, 2, Some(0), now, &mut b);
        }
    }
    by_burst.flush(&mut a);
    by_frame.flush(&mut b);
    let (sa, sb) = (by_burst.stats(), by_frame.stats());
    [(a, sa), (b, sb)]
}

#[test]
fn a_burst_of_one_flow_is_one_update_with_exact_counts() {
    let burst: Vec<(u16, usize)> = (0..32).map(|i| (7, 12 + i % 5)).collect();
    let [(a, sa), (b, sb)] = both_ways(64, 1, &[burst.clone(), burst]);
    assert_eq!(a.len(), 1, "one flow, one record");
    assert_eq!(a[0].packets, 64);
    assert_eq!(totals(&a), totals(&b));
    assert_eq!((sa.frames, sa.sampled, sa.flows), (64, 64, 1));
    assert_eq!(
        (sa.frames, sa.sampled, sa.flows),
        (sb.frames, sb.sampled, sb.flows)
    );
}

#[test]
fn interleaved_flows_in_bursts_keep_exact_counts() {
    // 4 flows frame by frame (as the DPDK load sends), a burst of more flows than the table
    // of runs holds, short frames (the general parse) among them, every 3rd frame sampled.
    let mut bursts = Vec::new();
    for b in 0..20u16 {
        bursts.push(
            (0..32u16)
                .map(|i| (i % 4, 12 + usize::from((b + i) % 7)))
                .collect(),
        );
        bursts.push(
            (0..32u16)
                .map(|i| (100 + i % 12, usize::from(i % 3)))
                .collect(),
        );
    }
    for sampling in [1, 3] {
        let [(a, sa), (b, sb)] = both_ways(1_024, sampling, &bursts);
        assert_eq!(totals(&a), totals(&b), "sampling {sampling}");
        assert_eq!(
            (sa.frames, sa.sampled, sa.not_ip, sa.evicted),
            (sb.frames, sb.sampled, sb.not_ip, sb.evicted)
        );
        assert_eq!(sa.frames, 40 * 32);
        // The TCP flags of the flows that have them.
        assert!(a
            .iter()
            .all(|r| (r.tcp_flags == 0x10) == (r.key.src_port % 5 == 0)));
    }
}

#[test]
fn flows_evicted_mid_burst_keep_exact_counts() {
    // One set: a burst of 3 flows with frames on both sides of 10 new flows, so flows of
    // the table of runs are evicted before the burst's end updates them, and frames past
    // the table's room are accounted one by one, evicting more.
    let mut bursts = vec![(0..8u16).map(|p| (p, 20)).collect::<Vec<_>>()];
    for round in 0..30u16 {
        let mut b: Vec<(u16, usize)> = vec![(1, 20), (2, 20), (3, 20)];
        b.extend((0..10).map(|i| (200 + (round * 10 + i) % 40, 12)));
        b.extend([(1, 30), (2, 30), (3, 30), (1, 40)]);
        bursts.push(b);
    }
    let [(a, sa), (b, _)] = both_ways(cache::WAYS, 1, &bursts);
    assert_eq!(totals(&a), totals(&b));
    assert!(sa.evicted > 30, "{sa:?}");
    let sent: u64 = bursts.iter().map(|b| b.len() as u64).sum();
    assert_eq!(a.iter().map(|r| r.packets).sum::<u64>(), sent);
}

#[test]
fn bursts_of_all_new_flows_skip_the_table_and_keep_exact_counts() {
    // Every frame a different flow for many bursts (the table off, then tried again), then
    // bursts of few flows again.
    let mut bursts: Vec<Vec<(u16, usize)>> = (0..3 * cache::RUNS_OFF as u16)
        .map(|b| {
            (0..32u16)
                .map(|i| (1_000 + (b * 32 + i) % 3_000, 12))
                .collect()
        })
        .collect();
    bursts.extend((0..10).map(|_| (0..32u16).map(|i| (i % 2, 20)).collect::<Vec<_>>()));
    let [(a, sa), (b, sb)] = both_ways(16_384, 1, &bursts);
    assert_eq!(totals(&a), totals(&b));
    assert_eq!(sa.flows, sb.flows);
}

#[test]
fn a_flow_past_its_timeout_starts_over_within_a_burst() {
    let mut c = cache(64, 1);
    let mut out = Vec::new();
    let f = v4(9, None, 20);
    c.observe(&f, 1, 2, 0, &mut out);
    let burst = [&f[..], &f[..], &f[..]];
    c.observe_burst(burst.iter().map(|f| (*f, 0)), 1, 2, 20_000, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].packets, out[0].end_reason),
        (1, EndReason::IdleTimeout)
    );
    c.flush(&mut out);
    assert_eq!((out[1].packets, out[1].start_ms), (3, 20_000));
    // The VLAN decided splits flows; a VID past 4095 takes the general path.
    let mut out = Vec::new();
    let burst = [(&f[..], 10), (&f[..], 0), (&f[..], 10), (&f[..], 5_000)];
    c.observe_burst(burst.into_iter(), 1, 2, 30_000, &mut out);
    c.flush(&mut out);
    let mut vlans: Vec<(Option<u16>, u64)> = out.iter().map(|r| (r.key.vlan, r.packets)).collect();
    vlans.sort();
    assert_eq!(vlans, [(None, 1), (Some(10), 2), (Some(5_000), 1)]);
}
