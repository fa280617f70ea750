//! `port add`'s fast placement path (`Core::replan_appended`) gives exactly what a full
//! replan gives: after every step of pseudo-random sequences of port additions (default
//! ports with 1–4 queues, some with a CPU set), removals and pins on 1 and 2 worker CPUs,
//! checked every few steps (so that several additions may take the fast path in a row): the
//! queues' workers and CPUs as `port list` shows them do not change when the placement
//! report replans fully, and every queue sits on its home CPU (static mode).

use qswitch_api::{CpuList, PlacementMode, PortConfig, VhostMode};
use qswitch_dp::{Options, Switch};

/// (port, queue, worker, cpu) of every queue, as `port list` shows them.
fn layout(sw: &Switch) -> Vec<(String, u16, usize, usize)> {
    let mut v: Vec<_> = sw
        .ports()
        .into_iter()
        .flat_map(|p| {
            p.queues
                .into_iter()
                .map(move |q| (p.name.clone(), q.queue, q.worker, q.cpu))
        })
        .collect();
    v.sort();
    v
}

/// A small deterministic generator (no dependency, the same sequence on every machine).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

#[test]
fn fast_replan_matches_full_replan() {
    let mut fast_steps = 0;
    for (seed, cpus) in [
        (1u64, vec![0]),
        (2, vec![0, 1]),
        (3, vec![0, 1]),
        (4, vec![0]),
    ] {
        let options = Options {
            placement: PlacementMode::Static,
            ..Options::default()
        };
        let sw = Switch::manual(&cpus, &options).expect("manual switch");
        // vhost-user ports in server mode (no frontend): real rx queues, no privileges.
        let dir = std::env::temp_dir().join(format!("qs-replan-{}-{seed}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut rng = Lcg(seed);
        let mut names: Vec<String> = Vec::new();
        for step in 0..120 {
            // The first 60 steps only add default ports (the fast path's case, several in a
            // row); then additions (some with a CPU set), removals (whose holes the next
            // additions fill) and pins mix.
            let op = if step < 60 { 0 } else { rng.next(10) };
            if op < 7 || names.is_empty() {
                let name = format!("p{seed}-{step}");
                let socket = dir
                    .join(format!("{step}.sock"))
                    .as_path()
                    .try_into()
                    .unwrap();
                let mut c = PortConfig::vhost_user(&name, socket, VhostMode::Server);
                c.queues = rng.next(5) as u16;
                if step >= 60 && rng.next(6) == 0 {
                    c.cpus = Some(CpuList::from_cpus([cpus[0]]).unwrap());
                }
                if c.queues == 0 {
                    c.queues = 1;
                }
                sw.add_port(&c).unwrap();
                names.push(name);
                fast_steps += 1;
            } else if op < 9 {
                let i = rng.next(names.len() as u64) as usize;
                sw.del_port(&names.remove(i)).unwrap();
            } else {
                let i = rng.next(names.len() as u64) as usize;
                let cpu = cpus[rng.next(cpus.len() as u64) as usize];
                let _ = sw.pin(&names[i], 0, Some(cpu));
            }
            // Several additions may go by before a report replans fully.
            if rng.next(3) != 0 && step != 119 {
                continue;
            }
            let before = layout(&sw);
            let report = sw.placement();
            let after = layout(&sw);
            assert_eq!(
                before, after,
                "seed {seed} step {step}: a full replan moved queues"
            );
            for q in &report.queues {
                if q.state == "home" {
                    assert_eq!(q.cpu, q.home_cpu, "seed {seed} step {step}: {q:?}");
                }
            }
        }
        drop(sw);
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(fast_steps > 100);
}
