//! Where each rx queue runs: VMQ / Dynamic VMQ's static placement, done right.
//!
//! [`plan`] is a pure function of the CPU topology, the CPUs that have workers, the reserved
//! CPUs and the ports' requests; [`Topology::read_sysfs`] is the only I/O, kept apart.
//!
//! # Rules
//! - A reserved CPU is never used, not even when an operator's set names it (a warning says
//!   so). CPUs without a worker cannot run queues and are ignored likewise.
//! - A port with an operator-given set uses it. Sets of different ports may overlap when the
//!   operator says so; the overlap is accepted and flagged ([`Warning::OverlappingSets`]).
//! - Ports without a set get default sets, disjoint from every other port's set (operator
//!   sets included) while the worker CPUs allow. The free CPUs are divided among these ports in
//!   proportion to their queue counts (each at least one CPU; largest remainder, ties to the
//!   earlier port). The ports pick their CPUs in turns (weighted round-robin), each taking
//!   its best free CPU by, in order: its device's NUMA node (when known; when unknown, nodes
//!   that fewer known-node ports want), a physical core none of whose threads is taken (else
//!   a sibling of one of its own cores, else a sibling of another port's core), the lower CPU
//!   number. Taking turns keeps two ports from landing on the two threads of the same cores.
//! - Only when there are more such ports than free CPUs (or every worker CPU is in an
//!   operator's set) do ports share CPUs: [`Rule::Shared`] and [`Warning::Shared`].
//! - Within its set, a port's queues go round-robin over the set's CPUs, in the order: fewest
//!   of this port's queues, fewest queues of other ports, in no other port's set, the port's
//!   NUMA node, a core with no busy thread (one hyperthread per core before any sibling), the
//!   lower CPU number. The ports take turns (queue 0 of each port, then queue 1, ...), so one
//!   port's later queues do not take the free cores before another port's first ones.
//!
//! Everything is ordered by port order, queue number and CPU number: the same inputs always
//! give the same plan.
//!
//! # Limitations
//! This is the static plan; moving queues by measured load (Dynamic VMQ) is
//! [`crate::control::balance`]'s, and the switch carries both out (`control/switch/runtime.rs`). A port with no queues
//! gets an empty set.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt::{self, Write as _};
use std::io;
use std::path::Path;

use qswitch_api::CpuList;

/// One logical CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CpuInfo {
    /// Its number.
    pub cpu: usize,
    /// Physical core id, unique within its package (`(package, core)` names the core).
    pub core: usize,
    /// Physical package (socket).
    pub package: usize,
    /// NUMA node.
    pub node: usize,
}

/// The machine's online CPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// Ascending by CPU number.
    pub cpus: Vec<CpuInfo>,
}

impl Topology {
    /// Reads the online CPUs' topology from sysfs mounted at `root` (normally `/sys`): the CPU
    /// list from `devices/system/cpu/online`; for each CPU `devices/system/cpu/cpuN/topology/`
    /// `core_id` and `physical_package_id` (CPU number and 0 when absent or negative), and its
    /// node from the `cpuN/nodeM` link, else from `devices/system/node/nodeM/cpulist`, else 0.
    /// Errors only when the online list cannot be read or parsed.
    pub fn read_sysfs(root: &Path) -> io::Result<Topology> {
        let cpu_dir = root.join("devices/system/cpu");
        let online = parse_list(&std::fs::read_to_string(cpu_dir.join("online"))?)?;
        let node_lists = read_node_lists(&root.join("devices/system/node"));
        let cpus = online
            .into_iter()
            .map(|cpu| {
                let dir = cpu_dir.join(format!("cpu{cpu}"));
                let number = |file: &str| {
                    std::fs::read_to_string(dir.join("topology").join(file))
                        .ok()
                        .and_then(|text| text.trim().parse::<usize>().ok())
                };
                let node = node_link(&dir).or_else(|| {
                    node_lists
                        .iter()
                        .find(|(_, cpus)| cpus.contains(&cpu))
                        .map(|&(node, _)| node)
                });
                CpuInfo {
                    cpu,
                    core: number("core_id").unwrap_or(cpu),
                    package: number("physical_package_id").unwrap_or(0),
                    node: node.unwrap_or(0),
                }
            })
            .collect();
        Ok(Topology { cpus })
    }

    /// A made-up machine numbered as Linux numbers most x86 machines: thread 0 of every core
    /// first (`cpu = package * cores + core`), then the second threads (`cpu + packages *
    /// cores`), and so on. One NUMA node per package.
    pub fn synthetic(packages: usize, cores_per_package: usize, threads_per_core: usize) -> Self {
        let per_thread = packages * cores_per_package;
        let mut cpus = Vec::with_capacity(per_thread * threads_per_core);
        for thread in 0..threads_per_core {
            for package in 0..packages {
                for core in 0..cores_per_package {
                    cpus.push(CpuInfo {
                        cpu: thread * per_thread + package * cores_per_package + core,
                        core,
                        package,
                        node: package,
                    });
                }
            }
        }
        Topology { cpus }
    }

    /// The CPU's description, if it is online.
    pub fn get(&self, cpu: usize) -> Option<&CpuInfo> {
        self.cpus.iter().find(|info| info.cpu == cpu)
    }
}

/// A kernel CPU list (`"0-3,8"`; empty for none).
fn parse_list(text: &str) -> io::Result<Vec<usize>> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.parse::<CpuList>()
        .map(|list| list.cpus().to_vec())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// `M` of a `nodeM` entry name.
fn node_number(name: &str) -> Option<usize> {
    name.strip_prefix("node")?.parse().ok()
}

/// The node of a CPU from its `nodeM` link (the lowest, should there be several).
fn node_link(cpu_dir: &Path) -> Option<usize> {
    std::fs::read_dir(cpu_dir)
        .ok()?
        .filter_map(|entry| node_number(entry.ok()?.file_name().to_str()?))
        .min()
}

/// `(node, its CPUs)` from `devices/system/node/nodeM/cpulist`, ascending by node.
fn read_node_lists(node_dir: &Path) -> Vec<(usize, Vec<usize>)> {
    let Ok(entries) = std::fs::read_dir(node_dir) else {
        return Vec::new();
    };
    let mut lists: Vec<(usize, Vec<usize>)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let node = node_number(entry.file_name().to_str()?)?;
            let text = std::fs::read_to_string(entry.path().join("cpulist")).ok()?;
            Some((node, parse_list(&text).ok()?))
        })
        .collect();
    lists.sort();
    lists
}

/// What a port asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortReq {
    /// The port's name.
    pub name: String,
    /// Its rx queues, numbered `0..queues`.
    pub queues: u16,
    /// The operator's CPU set, if any.
    pub cpus: Option<Vec<usize>>,
    /// The NUMA node of the port's device, when known.
    pub numa_node: Option<usize>,
}

/// Why a queue is where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// The CPU is in the operator's set for the port.
    OperatorSet,
    /// The CPU is in the port's default set, which no other port's set overlaps.
    DefaultDisjoint,
    /// Another thread of the CPU's physical core already runs a queue (placed earlier in the
    /// plan): there was no free core left in the set.
    SmtSibling,
    /// The CPU is on the NUMA node of the port's device.
    NumaLocal,
    /// The CPU is not on the NUMA node of the port's device (no CPU of the set was left there,
    /// or the operator's set has none).
    NumaRemote,
    /// The CPU is also in another port's set: no disjoint CPU was left (default sets), or the
    /// operator's sets overlap.
    Shared,
    /// The port's set is this one CPU: the queue could go nowhere else.
    Pinned,
}

/// Something in the requests the operator should know about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// Two operator-given sets overlap (after removing reserved CPUs and CPUs without a
    /// worker); the ports' queues share these CPUs.
    OverlappingSets {
        a: String,
        b: String,
        cpus: Vec<usize>,
    },
    /// An operator-given set names reserved CPUs; they are not used.
    ReservedInSet { port: String, cpus: Vec<usize> },
    /// An operator-given set names CPUs that run no worker; they are not used.
    NoWorker { port: String, cpus: Vec<usize> },
    /// Nothing of an operator-given set is usable; the port got a default set instead.
    EmptySet { port: String },
    /// A port without a set had to share CPUs with other ports: not enough CPUs for disjoint
    /// sets.
    Shared {
        port: String,
        cpus: Vec<usize>,
        with: Vec<String>,
    },
    /// No CPU is available at all (every worker CPU is reserved): the port's queues are not
    /// placed.
    NoCpu { port: String },
    /// Worker CPUs missing from the topology; each is taken as its own core on no known node.
    NotInTopology { cpus: Vec<usize> },
}

/// Renders CPU numbers as a CPU list (`0-3,8`).
fn cpu_list(cpus: &[usize]) -> String {
    CpuList::from_cpus(cpus.iter().copied()).map_or_else(|| "none".into(), |l| l.to_string())
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::OverlappingSets { a, b, cpus } => write!(
                f,
                "ports {a} and {b} have overlapping CPU sets: they share CPUs {}",
                cpu_list(cpus)
            ),
            Warning::ReservedInSet { port, cpus } => write!(
                f,
                "port {port}: its CPU set names reserved CPUs {}, which are not used",
                cpu_list(cpus)
            ),
            Warning::NoWorker { port, cpus } => write!(
                f,
                "port {port}: its CPU set names CPUs {} that run no worker, which are not used",
                cpu_list(cpus)
            ),
            Warning::EmptySet { port } => write!(
                f,
                "port {port}: no CPU of its set is usable; it gets a default set"
            ),
            Warning::Shared { port, cpus, with } => write!(
                f,
                "port {port}: not enough CPUs for disjoint sets; shares CPUs {} with {}",
                cpu_list(cpus),
                with.join(", ")
            ),
            Warning::NoCpu { port } => write!(
                f,
                "port {port}: no CPU available (every worker CPU is reserved); its queues are \
                 not placed"
            ),
            Warning::NotInTopology { cpus } => write!(
                f,
                "worker CPUs {} are not in the topology; each is taken as its own core",
                cpu_list(cpus)
            ),
        }
    }
}

/// Where one queue runs, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePlacement {
    pub port: String,
    pub queue: u16,
    pub cpu: usize,
    /// Why: the set it came from ([`Rule::OperatorSet`] or [`Rule::DefaultDisjoint`], or
    /// [`Rule::Shared`] alone for a default set that had to share), then any of
    /// [`Rule::Shared`], [`Rule::SmtSibling`], [`Rule::NumaLocal`] / [`Rule::NumaRemote`],
    /// [`Rule::Pinned`], in that order.
    pub rules: Vec<Rule>,
}

/// The outcome of [`plan`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Every placed queue, by port order then queue number.
    pub queues: Vec<QueuePlacement>,
    pub warnings: Vec<Warning>,
    /// The CPU set each port ended up with (ascending), in port order.
    pub port_sets: Vec<(String, Vec<usize>)>,
    /// For [`Plan::explain`]: each used CPU's NUMA node, each port's device node.
    cpu_nodes: BTreeMap<usize, usize>,
    port_nodes: BTreeMap<String, usize>,
    /// The ports (indices into `port_sets`) that may have had to share: [`Plan::shared_warnings`].
    shared_from: Vec<usize>,
}

impl Plan {
    /// The [`Warning::Shared`] warnings, in port order: each port with a default set that
    /// shares CPUs with other ports, and those ports. [`plan`] includes them in
    /// [`Plan::warnings`]; [`place`] leaves them to this.
    pub fn shared_warnings(&self) -> Vec<Warning> {
        // Per CPU, the ports whose sets hold it.
        let mut holders: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (j, (_, set)) in self.port_sets.iter().enumerate() {
            for &c in set {
                holders.entry(c).or_default().push(j);
            }
        }
        let mut warnings = Vec::new();
        for &i in &self.shared_from {
            let Some((port, set)) = self.port_sets.get(i) else {
                continue;
            };
            let mut cpus = BTreeSet::new();
            let mut with = BTreeSet::new();
            for c in set {
                for &j in holders.get(c).into_iter().flatten().filter(|&&j| j != i) {
                    cpus.insert(*c);
                    with.insert(j);
                }
            }
            if !with.is_empty() {
                warnings.push(Warning::Shared {
                    port: port.clone(),
                    cpus: cpus.into_iter().collect(),
                    with: with
                        .into_iter()
                        .map(|j| self.port_sets[j].0.clone())
                        .collect(),
                });
            }
        }
        warnings
    }

    /// One line per queue (`port/queue -> cpu N: default disjoint set, one thread per core,
    /// NUMA node 0`), then one per warning (`warning: ...`).
    pub fn explain(&self) -> String {
        let mut out = String::new();
        for q in &self.queues {
            let _ = writeln!(
                out,
                "{}/{} -> cpu {}: {}",
                q.port,
                q.queue,
                q.cpu,
                self.why(q)
            );
        }
        for w in &self.warnings {
            let _ = writeln!(out, "warning: {w}");
        }
        out
    }

    /// Why `q` is on its CPU, in words: `default disjoint set, one thread per core, NUMA
    /// node 0`.
    pub fn why(&self, q: &QueuePlacement) -> String {
        let mut why: Vec<String> = Vec::new();
        for (k, rule) in q.rules.iter().enumerate() {
            why.push(self.describe(q, *rule));
            // After the set the CPU came from: whether it has its core to itself.
            if k == 0 && !q.rules.contains(&Rule::SmtSibling) {
                why.push("one thread per core".into());
            }
        }
        why.join(", ")
    }

    /// The words for one rule of a placement.
    fn describe(&self, q: &QueuePlacement, rule: Rule) -> String {
        match rule {
            Rule::OperatorSet => "operator's set".into(),
            Rule::DefaultDisjoint => "default disjoint set".into(),
            Rule::Shared => {
                let with: Vec<&str> = self
                    .port_sets
                    .iter()
                    .filter(|(name, set)| *name != q.port && set.contains(&q.cpu))
                    .map(|(name, _)| name.as_str())
                    .collect();
                format!("shared with {}", with.join(", "))
            }
            Rule::SmtSibling => "SMT sibling of a busy thread".into(),
            Rule::NumaLocal => match self.cpu_nodes.get(&q.cpu) {
                Some(node) => format!("NUMA node {node}"),
                None => "NUMA local".into(),
            },
            Rule::NumaRemote => {
                let node = |n: Option<&usize>| n.map_or_else(|| "unknown".into(), usize::to_string);
                format!(
                    "remote NUMA node {} (device on node {})",
                    node(self.cpu_nodes.get(&q.cpu)),
                    node(self.port_nodes.get(&q.port))
                )
            }
            Rule::Pinned => "the only CPU of its set".into(),
        }
    }
}

/// A CPU as placement sees it.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    cpu: usize,
    /// `(package, core)`; `(usize::MAX, cpu)` for a CPU missing from the topology.
    core: (usize, usize),
    node: Option<usize>,
}

/// Places every port's queues. See the module documentation for the rules.
pub fn plan(topo: &Topology, workers: &[usize], reserved: &[usize], ports: &[PortReq]) -> Plan {
    let mut plan = place(topo, workers, reserved, ports);
    let shared = plan.shared_warnings();
    plan.warnings.extend(shared);
    plan
}

/// [`plan`] without its [`Warning::Shared`] warnings, which name, for every port that shares
/// CPUs, every port it shares them with (O(ports²) when many ports share few CPUs): the
/// switch asks for them with [`Plan::shared_warnings`] only when it reports them.
pub fn place(topo: &Topology, workers: &[usize], reserved: &[usize], ports: &[PortReq]) -> Plan {
    let reserved: BTreeSet<usize> = reserved.iter().copied().collect();
    let workers: BTreeSet<usize> = workers.iter().copied().collect();
    let info: BTreeMap<usize, &CpuInfo> = topo.cpus.iter().map(|c| (c.cpu, c)).collect();
    let cpus: BTreeMap<usize, Cpu> = workers
        .difference(&reserved)
        .map(|&cpu| {
            let c = match info.get(&cpu) {
                Some(i) => Cpu {
                    cpu,
                    core: (i.package, i.core),
                    node: Some(i.node),
                },
                None => Cpu {
                    cpu,
                    core: (usize::MAX, cpu),
                    node: None,
                },
            };
            (cpu, c)
        })
        .collect();
    let mut warnings = Vec::new();
    let unknown: Vec<usize> = cpus
        .keys()
        .filter(|c| !info.contains_key(c))
        .copied()
        .collect();
    if !unknown.is_empty() {
        warnings.push(Warning::NotInTopology { cpus: unknown });
    }

    // Operator sets, minus what cannot be used.
    let mut sets: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); ports.len()];
    let mut operator = vec![false; ports.len()];
    for (i, port) in ports.iter().enumerate() {
        let Some(asked) = &port.cpus else { continue };
        let asked: BTreeSet<usize> = asked.iter().copied().collect();
        let res: Vec<usize> = asked.intersection(&reserved).copied().collect();
        if !res.is_empty() {
            warnings.push(Warning::ReservedInSet {
                port: port.name.clone(),
                cpus: res,
            });
        }
        let idle: Vec<usize> = asked
            .iter()
            .filter(|c| !reserved.contains(c) && !workers.contains(c))
            .copied()
            .collect();
        if !idle.is_empty() {
            warnings.push(Warning::NoWorker {
                port: port.name.clone(),
                cpus: idle,
            });
        }
        let usable: BTreeSet<usize> = asked.into_iter().filter(|c| cpus.contains_key(c)).collect();
        if usable.is_empty() {
            warnings.push(Warning::EmptySet {
                port: port.name.clone(),
            });
        } else {
            sets[i] = usable;
            operator[i] = true;
        }
    }
    let operators: Vec<usize> = (0..ports.len()).filter(|&i| operator[i]).collect();
    for (k, &a) in operators.iter().enumerate() {
        for &b in &operators[k + 1..] {
            let both: Vec<usize> = sets[a].intersection(&sets[b]).copied().collect();
            if !both.is_empty() {
                warnings.push(Warning::OverlappingSets {
                    a: ports[a].name.clone(),
                    b: ports[b].name.clone(),
                    cpus: both,
                });
            }
        }
    }

    // Default sets.
    let defaults: Vec<usize> = (0..ports.len())
        .filter(|&i| !operator[i] && ports[i].queues > 0)
        .collect();
    if cpus.is_empty() {
        for &i in &defaults {
            warnings.push(Warning::NoCpu {
                port: ports[i].name.clone(),
            });
        }
    } else if !defaults.is_empty() {
        allocate_defaults(&cpus, ports, &defaults, &mut sets);
    }
    // The Shared warnings come last (Plan::shared_warnings), for these ports.
    let shared_from = if cpus.is_empty() {
        Vec::new()
    } else {
        defaults
    };

    // Queues, round-robin over each port's set. The ports take turns (queue 0 of every port,
    // then queue 1, ...), so that no port's later queues take the free cores before another
    // port's first ones.
    let mut holders: BTreeMap<usize, usize> = BTreeMap::new();
    for set in &sets {
        for &c in set {
            *holders.entry(c).or_insert(0) += 1;
        }
    }
    let port_cpus: Vec<Vec<Cpu>> = sets
        .iter()
        .map(|set| set.iter().map(|c| cpus[c]).collect())
        .collect();
    let mut load: BTreeMap<usize, usize> = BTreeMap::new();
    let mut own: Vec<BTreeMap<usize, usize>> = vec![BTreeMap::new(); ports.len()];
    let mut busy_cores: BTreeMap<(usize, usize), BTreeSet<usize>> = BTreeMap::new();
    let mut placed: Vec<(usize, QueuePlacement)> = Vec::new();
    let rounds = ports.iter().map(|p| p.queues).max().unwrap_or(0);
    for queue in 0..rounds {
        for (i, port) in ports.iter().enumerate() {
            let set = &port_cpus[i];
            if queue >= port.queues || set.is_empty() {
                continue;
            }
            let sibling_busy = |c: &Cpu| {
                busy_cores
                    .get(&c.core)
                    .is_some_and(|busy| busy.iter().any(|&b| b != c.cpu))
            };
            let best = set
                .iter()
                .min_by_key(|c| {
                    let mine = own[i].get(&c.cpu).copied().unwrap_or(0);
                    let all = load.get(&c.cpu).copied().unwrap_or(0);
                    let held = holders.get(&c.cpu).copied().unwrap_or(0);
                    let remote = port.numa_node.is_some() && c.node != port.numa_node;
                    (mine, all - mine, held, remote, sibling_busy(c), c.cpu)
                })
                .copied()
                .expect("the set is not empty");
            let mut rules = Vec::new();
            let shared = holders.get(&best.cpu).copied().unwrap_or(0) > 1;
            if operator[i] {
                rules.push(Rule::OperatorSet);
                if shared {
                    rules.push(Rule::Shared);
                }
            } else if shared {
                rules.push(Rule::Shared);
            } else {
                rules.push(Rule::DefaultDisjoint);
            }
            if sibling_busy(&best) {
                rules.push(Rule::SmtSibling);
            }
            if let Some(node) = port.numa_node {
                rules.push(if best.node == Some(node) {
                    Rule::NumaLocal
                } else {
                    Rule::NumaRemote
                });
            }
            if set.len() == 1 {
                rules.push(Rule::Pinned);
            }
            *own[i].entry(best.cpu).or_insert(0) += 1;
            *load.entry(best.cpu).or_insert(0) += 1;
            busy_cores.entry(best.core).or_default().insert(best.cpu);
            placed.push((
                i,
                QueuePlacement {
                    port: port.name.clone(),
                    queue,
                    cpu: best.cpu,
                    rules,
                },
            ));
        }
    }
    // By port, then queue (the sort is stable and each port's queues came in order).
    placed.sort_by_key(|&(i, _)| i);
    let queues = placed.into_iter().map(|(_, q)| q).collect();

    let cpu_nodes = cpus
        .values()
        .filter_map(|c| Some((c.cpu, c.node?)))
        .collect();
    let port_nodes = ports
        .iter()
        .filter_map(|p| Some((p.name.clone(), p.numa_node?)))
        .collect();
    Plan {
        queues,
        warnings,
        port_sets: ports
            .iter()
            .zip(sets)
            .map(|(p, set)| (p.name.clone(), set.into_iter().collect()))
            .collect(),
        cpu_nodes,
        port_nodes,
        shared_from,
    }
}

/// Gives each port in `defaults` (indices into `ports`, all with queues) a set: disjoint
/// from every other set while the free CPUs last. `sets` holds the operator sets on entry.
fn allocate_defaults(
    cpus: &BTreeMap<usize, Cpu>,
    ports: &[PortReq],
    defaults: &[usize],
    sets: &mut [BTreeSet<usize>],
) {
    let taken: BTreeSet<usize> = sets.iter().flatten().copied().collect();
    let free: Vec<Cpu> = cpus
        .values()
        .filter(|c| !taken.contains(&c.cpu))
        .copied()
        .collect();
    // With every CPU in an operator's set, share them all.
    let candidates: Vec<Cpu> = if free.is_empty() {
        cpus.values().copied().collect()
    } else {
        free
    };
    let weights: Vec<usize> = defaults
        .iter()
        .map(|&i| usize::from(ports[i].queues))
        .collect();
    let shares = shares(candidates.len(), &weights);

    let mut holders: BTreeMap<usize, usize> = BTreeMap::new();
    // Per core, which ports hold how many of its threads.
    let mut core_holders: BTreeMap<(usize, usize), BTreeMap<usize, usize>> = BTreeMap::new();
    // Per core, how many threads all ports hold together.
    let mut core_total: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    for (i, set) in sets.iter().enumerate() {
        for &c in set {
            *holders.entry(c).or_insert(0) += 1;
            *core_holders
                .entry(cpus[&c].core)
                .or_default()
                .entry(i)
                .or_insert(0) += 1;
            *core_total.entry(cpus[&c].core).or_insert(0) += 1;
        }
    }
    // How many default ports want each node.
    let mut claims: BTreeMap<usize, usize> = BTreeMap::new();
    for &i in defaults {
        if let Some(node) = ports[i].numa_node {
            *claims.entry(node).or_insert(0) += 1;
        }
    }

    let mut shares = shares;
    let mut got = vec![0usize; defaults.len()];
    // The port furthest below its share (taken / share smallest), earlier on ties: a heap,
    // so that a thousand ports sharing one CPU do not cost a million comparisons.
    let mut turns: BinaryHeap<Reverse<Turn>> = (0..defaults.len())
        .filter(|&k| shares[k] > 0)
        .map(|k| {
            Reverse(Turn {
                got: 0,
                share: shares[k],
                k,
            })
        })
        .collect();
    while let Some(Reverse(Turn { k, .. })) = turns.pop() {
        let i = defaults[k];
        let node = ports[i].numa_node;
        let best = candidates
            .iter()
            .filter(|c| !sets[i].contains(&c.cpu))
            .min_by_key(|c| {
                let claimed = c.node.and_then(|n| claims.get(&n)).copied().unwrap_or(0);
                let node_rank = match node {
                    Some(_) if c.node == node => 0,
                    Some(_) => 1 + claimed,
                    None => claimed,
                };
                let mine = core_holders
                    .get(&c.core)
                    .and_then(|h| h.get(&i))
                    .copied()
                    .unwrap_or(0);
                let others = core_total.get(&c.core).copied().unwrap_or(0) - mine;
                let held = holders.get(&c.cpu).copied().unwrap_or(0);
                (held, node_rank, others, mine, c.cpu)
            })
            .copied();
        let Some(best) = best else {
            // Nothing left that this port does not hold already: its turns end here.
            shares[k] = got[k];
            continue;
        };
        sets[i].insert(best.cpu);
        got[k] += 1;
        if got[k] < shares[k] {
            turns.push(Reverse(Turn {
                got: got[k],
                share: shares[k],
                k,
            }));
        }
        *holders.entry(best.cpu).or_insert(0) += 1;
        *core_holders
            .entry(best.core)
            .or_default()
            .entry(i)
            .or_insert(0) += 1;
        *core_total.entry(best.core).or_insert(0) += 1;
    }
}

/// A default port's place in the queue for its next CPU: ordered by how much of its share it
/// has (`got / share`, compared without division), then by its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Turn {
    got: usize,
    share: usize,
    k: usize,
}

impl Ord for Turn {
    fn cmp(&self, other: &Turn) -> std::cmp::Ordering {
        (self.got * other.share)
            .cmp(&(other.got * self.share))
            .then(self.k.cmp(&other.k))
    }
}

impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Turn) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Divides `n` CPUs among ports in proportion to `weights` (each ≥ 1): every port at least
/// one, largest remainder first, earlier ports on ties. With fewer CPUs than ports, one each
/// (they will share).
fn shares(n: usize, weights: &[usize]) -> Vec<usize> {
    let m = weights.len();
    if n <= m {
        return vec![1; m];
    }
    let total: usize = weights.iter().sum();
    let mut shares: Vec<usize> = weights.iter().map(|&w| (n * w / total).max(1)).collect();
    // How far below its exact share a port is, scaled by `total`.
    let deficit = |k: usize, s: usize| (n * weights[k]) as i128 - (s * total) as i128;
    while shares.iter().sum::<usize>() > n {
        let k = (0..m)
            .filter(|&k| shares[k] > 1)
            .min_by_key(|&k| (deficit(k, shares[k]), std::cmp::Reverse(k)))
            .expect("n > m, so some port has more than one CPU");
        shares[k] -= 1;
    }
    while shares.iter().sum::<usize>() < n {
        let k = (0..m)
            .max_by_key(|&k| (deficit(k, shares[k]), std::cmp::Reverse(k)))
            .expect("there is a port");
        shares[k] += 1;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn port(name: &str, queues: u16) -> PortReq {
        PortReq {
            name: name.into(),
            queues,
            cpus: None,
            numa_node: None,
        }
    }

    fn on_node(name: &str, queues: u16, node: usize) -> PortReq {
        PortReq {
            numa_node: Some(node),
            ..port(name, queues)
        }
    }

    fn with_set(name: &str, queues: u16, cpus: &[usize]) -> PortReq {
        PortReq {
            cpus: Some(cpus.to_vec()),
            ..port(name, queues)
        }
    }

    fn all(topo: &Topology) -> Vec<usize> {
        topo.cpus.iter().map(|c| c.cpu).collect()
    }

    fn cpus_of(plan: &Plan, port: &str) -> Vec<usize> {
        plan.queues
            .iter()
            .filter(|q| q.port == port)
            .map(|q| q.cpu)
            .collect()
    }

    fn set_of<'a>(plan: &'a Plan, port: &str) -> &'a [usize] {
        &plan.port_sets.iter().find(|(n, _)| n == port).unwrap().1
    }

    fn cores(topo: &Topology, cpus: &[usize]) -> BTreeSet<(usize, usize)> {
        cpus.iter()
            .map(|&c| {
                let i = topo.get(c).unwrap();
                (i.package, i.core)
            })
            .collect()
    }

    #[test]
    fn synthetic_numbering_is_linux_like() {
        let t = Topology::synthetic(2, 8, 2);
        assert_eq!(t.cpus.len(), 32);
        let c = |cpu| *t.get(cpu).unwrap();
        assert_eq!(
            c(0),
            CpuInfo {
                cpu: 0,
                core: 0,
                package: 0,
                node: 0
            }
        );
        assert_eq!((c(9).package, c(9).core, c(9).node), (1, 1, 1));
        // CPU 16 is the sibling of CPU 0, CPU 24 of CPU 8.
        assert_eq!((c(16).package, c(16).core), (0, 0));
        assert_eq!((c(24).package, c(24).core), (1, 0));
        assert!(t.cpus.windows(2).all(|w| w[0].cpu + 1 == w[1].cpu));
    }

    /// Seed 000: two NICs, 8 queues each, defaults. Hyper-V gave them overlapping sets.
    #[test]
    fn two_nics_get_disjoint_sets_on_their_own_nodes() {
        let topo = Topology::synthetic(2, 8, 2);
        for (a, b) in [(0, 1), (1, 0)] {
            let ports = [on_node("nic0", 8, a), on_node("nic1", 8, b)];
            let plan = plan(&topo, &all(&topo), &[], &ports);
            assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
            let (s0, s1) = (set_of(&plan, "nic0"), set_of(&plan, "nic1"));
            assert!(s0.iter().all(|c| !s1.contains(c)));
            assert!(s0.iter().all(|&c| topo.get(c).unwrap().node == a));
            assert!(s1.iter().all(|&c| topo.get(c).unwrap().node == b));
            for (name, node) in [("nic0", a), ("nic1", b)] {
                let used = cpus_of(&plan, name);
                assert_eq!(used.len(), 8);
                // One thread per core: 8 queues on 8 distinct cores, thread 0 of each.
                assert_eq!(cores(&topo, &used).len(), 8);
                assert_eq!(used, (node * 8..node * 8 + 8).collect::<Vec<_>>());
            }
            for q in &plan.queues {
                assert_eq!(q.rules, [Rule::DefaultDisjoint, Rule::NumaLocal], "{q:?}");
            }
            let text = plan.explain();
            assert!(text.contains(&format!(
                "nic0/0 -> cpu {}: default disjoint set, one thread per core, NUMA node {a}",
                a * 8
            )));
            assert_eq!(text.lines().count(), 16);
        }
    }

    #[test]
    fn two_nics_without_numa_info_use_distinct_cores() {
        let topo = Topology::synthetic(2, 8, 2);
        let ports = [port("nic0", 8), port("nic1", 8)];
        let plan = plan(&topo, &all(&topo), &[], &ports);
        assert!(plan.warnings.is_empty());
        let (s0, s1) = (set_of(&plan, "nic0"), set_of(&plan, "nic1"));
        assert_eq!((s0.len(), s1.len()), (16, 16));
        assert!(s0.iter().all(|c| !s1.contains(c)));
        let (u0, u1) = (cpus_of(&plan, "nic0"), cpus_of(&plan, "nic1"));
        // Not just disjoint CPUs: disjoint physical cores, one thread per core.
        let (c0, c1) = (cores(&topo, &u0), cores(&topo, &u1));
        assert_eq!((c0.len(), c1.len()), (8, 8));
        assert!(c0.is_disjoint(&c1));
        assert!(plan
            .queues
            .iter()
            .all(|q| q.rules == [Rule::DefaultDisjoint]));
    }

    #[test]
    fn reserved_cpu_0_with_two_nics() {
        let topo = Topology::synthetic(2, 8, 2);
        let ports = [on_node("nic0", 8, 0), on_node("nic1", 8, 1)];
        let plan = plan(&topo, &all(&topo), &[0], &ports);
        assert!(plan.queues.iter().all(|q| q.cpu != 0));
        let used = cpus_of(&plan, "nic0");
        // Cores 1-7 on thread 0, and core 0 through its sibling CPU 16.
        assert_eq!(used, [1, 2, 3, 4, 5, 6, 7, 16]);
        assert_eq!(cores(&topo, &used).len(), 8);
        assert!(plan
            .queues
            .iter()
            .all(|q| !q.rules.contains(&Rule::SmtSibling) && q.rules.contains(&Rule::NumaLocal)));
    }

    #[test]
    fn numa_node_full_spills_remote_after_local_siblings() {
        let topo = Topology::synthetic(2, 2, 2);
        // Node 0 has CPUs 0, 1, 4, 5; one port with 6 queues on node 0 and every CPU.
        let plan = plan(&topo, &all(&topo), &[], &[on_node("p", 6, 0)]);
        assert_eq!(cpus_of(&plan, "p"), [0, 1, 4, 5, 2, 3]);
        let rules: Vec<&Vec<Rule>> = plan.queues.iter().map(|q| &q.rules).collect();
        assert_eq!(*rules[0], [Rule::DefaultDisjoint, Rule::NumaLocal]);
        assert_eq!(
            *rules[2],
            [Rule::DefaultDisjoint, Rule::SmtSibling, Rule::NumaLocal]
        );
        assert_eq!(*rules[4], [Rule::DefaultDisjoint, Rule::NumaRemote]);
        let text = plan.explain();
        assert!(text.contains("p/2 -> cpu 4: default disjoint set, SMT sibling of a busy thread"));
        assert!(text.contains("p/4 -> cpu 2: default disjoint set, one thread per core, remote NUMA node 1 (device on node 0)"));
    }

    #[test]
    fn operator_overlap_is_accepted_and_flagged() {
        let topo = Topology::synthetic(1, 8, 1);
        let ports = [
            with_set("a", 4, &[1, 2, 3, 4]),
            with_set("b", 4, &[3, 4, 5, 6]),
            port("c", 1),
        ];
        let plan = plan(&topo, &all(&topo), &[0], &ports);
        assert_eq!(
            plan.warnings,
            [Warning::OverlappingSets {
                a: "a".into(),
                b: "b".into(),
                cpus: vec![3, 4]
            }]
        );
        assert_eq!(cpus_of(&plan, "a"), [1, 2, 3, 4]);
        // b takes the CPUs nobody else has first.
        assert_eq!(cpus_of(&plan, "b"), [5, 6, 4, 3]);
        assert_eq!(set_of(&plan, "c"), [7]);
        let q = plan
            .queues
            .iter()
            .find(|q| q.port == "b" && q.cpu == 3)
            .unwrap();
        assert_eq!(q.rules, [Rule::OperatorSet, Rule::Shared]);
        let text = plan.explain();
        assert!(text.contains("b/3 -> cpu 3: operator's set, one thread per core, shared with a"));
        assert!(text.contains(
            "c/0 -> cpu 7: default disjoint set, one thread per core, the only CPU of its set"
        ));
        assert!(
            text.contains("warning: ports a and b have overlapping CPU sets: they share CPUs 3-4")
        );
    }

    #[test]
    fn operator_set_loses_reserved_and_workerless_cpus() {
        let topo = Topology::synthetic(1, 4, 1);
        let ports = [with_set("a", 2, &[0, 1, 9]), with_set("b", 1, &[0])];
        let plan = plan(&topo, &[0, 1, 2], &[0], &ports);
        assert_eq!(cpus_of(&plan, "a"), [1, 1]);
        assert_eq!(plan.queues[0].rules, [Rule::OperatorSet, Rule::Pinned]);
        // b's set is only the reserved CPU: it gets a default set from what is left.
        assert_eq!(cpus_of(&plan, "b"), [2]);
        assert_eq!(
            plan.warnings,
            [
                Warning::ReservedInSet {
                    port: "a".into(),
                    cpus: vec![0]
                },
                Warning::NoWorker {
                    port: "a".into(),
                    cpus: vec![9]
                },
                Warning::ReservedInSet {
                    port: "b".into(),
                    cpus: vec![0]
                },
                Warning::EmptySet { port: "b".into() },
            ]
        );
    }

    #[test]
    fn more_ports_than_cpus_share_with_a_warning() {
        let topo = Topology::synthetic(1, 2, 1);
        let ports = [port("a", 1), port("b", 2), port("c", 1)];
        let plan = plan(&topo, &[0, 1], &[], &ports);
        assert_eq!(set_of(&plan, "a"), [0]);
        assert_eq!(set_of(&plan, "b"), [1]);
        assert_eq!(set_of(&plan, "c"), [0]);
        assert_eq!(cpus_of(&plan, "b"), [1, 1]);
        assert_eq!(plan.queues[0].rules, [Rule::Shared, Rule::Pinned]);
        assert_eq!(plan.queues[1].rules, [Rule::DefaultDisjoint, Rule::Pinned]);
        assert_eq!(
            plan.warnings,
            [
                Warning::Shared {
                    port: "a".into(),
                    cpus: vec![0],
                    with: vec!["c".into()]
                },
                Warning::Shared {
                    port: "c".into(),
                    cpus: vec![0],
                    with: vec!["a".into()]
                },
            ]
        );
        assert!(plan
            .explain()
            .contains("a/0 -> cpu 0: shared with c, one thread per core"));
    }

    #[test]
    fn default_port_shares_when_operator_sets_take_every_cpu() {
        let topo = Topology::synthetic(1, 2, 1);
        let ports = [with_set("a", 2, &[0, 1]), port("b", 1)];
        let plan = plan(&topo, &[0, 1], &[], &ports);
        assert_eq!(cpus_of(&plan, "a"), [0, 1]);
        assert_eq!(set_of(&plan, "b"), [0, 1]);
        assert_eq!(plan.queues[2].rules, [Rule::Shared]);
        assert!(matches!(&plan.warnings[..], [Warning::Shared { port, .. }] if port == "b"));
    }

    #[test]
    fn two_cpu_machine_one_cpu_each() {
        // Two cores, or one core with two threads: either way one CPU per port.
        for topo in [Topology::synthetic(1, 2, 1), Topology::synthetic(1, 1, 2)] {
            let plan = plan(&topo, &[0, 1], &[], &[port("a", 1), port("b", 1)]);
            assert!(plan.warnings.is_empty());
            assert_eq!(
                plan.port_sets,
                [("a".to_string(), vec![0]), ("b".to_string(), vec![1])]
            );
            assert_eq!(cpus_of(&plan, "a"), [0]);
            assert_eq!(cpus_of(&plan, "b"), [1]);
        }
        // With one core of two threads, the second port had to use the sibling.
        let plan = plan(
            &Topology::synthetic(1, 1, 2),
            &[0, 1],
            &[],
            &[port("a", 1), port("b", 1)],
        );
        assert_eq!(
            plan.queues[1].rules,
            [Rule::DefaultDisjoint, Rule::SmtSibling, Rule::Pinned]
        );
    }

    #[test]
    fn every_cpu_reserved_means_no_cpu() {
        let topo = Topology::synthetic(1, 2, 1);
        let plan = plan(&topo, &[0], &[0], &[port("a", 2), port("idle", 0)]);
        assert!(plan.queues.is_empty());
        assert_eq!(plan.warnings, [Warning::NoCpu { port: "a".into() }]);
        assert!(plan
            .explain()
            .starts_with("warning: port a: no CPU available"));
    }

    #[test]
    fn unknown_worker_cpu_is_used_and_flagged() {
        let topo = Topology::synthetic(1, 1, 1);
        let plan = plan(&topo, &[0, 7], &[0], &[port("a", 1)]);
        assert_eq!(cpus_of(&plan, "a"), [7]);
        assert_eq!(plan.warnings, [Warning::NotInTopology { cpus: vec![7] }]);
    }

    #[test]
    fn shares_are_proportional() {
        assert_eq!(shares(8, &[1, 1, 2]), [2, 2, 4]);
        assert_eq!(shares(31, &[8, 8]), [16, 15]);
        assert_eq!(shares(5, &[100, 1]), [4, 1]);
        assert_eq!(shares(3, &[1, 1, 1, 1]), [1, 1, 1, 1]);
        assert_eq!(shares(10, &[3, 3, 3]), [4, 3, 3]);
        let plan = plan(
            &Topology::synthetic(1, 8, 1),
            &(0..8).collect::<Vec<_>>(),
            &[],
            &[port("a", 1), port("b", 1), port("c", 2)],
        );
        let sizes: Vec<usize> = plan.port_sets.iter().map(|(_, s)| s.len()).collect();
        assert_eq!(sizes, [2, 2, 4]);
    }

    /// A scratch directory under the system's temporary directory, removed on drop.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!(
                "qswitch-placement-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }

        fn write(&self, path: &str, text: &str) {
            let path = self.0.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn read_sysfs_from_a_fake_tree() {
        let root = Scratch::new("sysfs");
        // CPUs 0-5 and 7 online (6 offline); 2 packages of 2 cores, 2 threads; CPU 7 has no
        // topology files.
        root.write("devices/system/cpu/online", "0-5,7\n");
        let layout = [
            (0, 0, 0),
            (1, 1, 0),
            (2, 0, 1),
            (3, 1, 1),
            (4, 0, 0),
            (5, 1, 0),
        ];
        for (cpu, core, package) in layout {
            let dir = format!("devices/system/cpu/cpu{cpu}/topology");
            root.write(&format!("{dir}/core_id"), &format!("{core}\n"));
            root.write(
                &format!("{dir}/physical_package_id"),
                &format!("{package}\n"),
            );
        }
        root.write("devices/system/cpu/cpu6/topology/core_id", "1\n");
        root.write("devices/system/cpu/cpu7/online", "1\n");
        // Nodes: links for CPUs 0-3, the node's cpulist for the others.
        root.write("devices/system/node/node0/cpulist", "0-1,4-5\n");
        root.write("devices/system/node/node1/cpulist", "2-3,6-7\n");
        root.write("devices/system/node/node2/cpulist", "\n");
        for (cpu, node) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
            std::os::unix::fs::symlink(
                root.0.join(format!("devices/system/node/node{node}")),
                root.0
                    .join(format!("devices/system/cpu/cpu{cpu}/node{node}")),
            )
            .unwrap();
        }
        let topo = Topology::read_sysfs(&root.0).unwrap();
        let got: Vec<(usize, usize, usize, usize)> = topo
            .cpus
            .iter()
            .map(|c| (c.cpu, c.core, c.package, c.node))
            .collect();
        assert_eq!(
            got,
            [
                (0, 0, 0, 0),
                (1, 1, 0, 0),
                (2, 0, 1, 1),
                (3, 1, 1, 1),
                (4, 0, 0, 0),
                (5, 1, 0, 0),
                (7, 7, 0, 1)
            ]
        );
        // No online list: an error.
        let empty = Scratch::new("empty");
        assert!(Topology::read_sysfs(&empty.0).is_err());
        empty.write("devices/system/cpu/online", "garbage\n");
        assert_eq!(
            Topology::read_sysfs(&empty.0).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn read_sysfs_on_this_machine() {
        let topo = Topology::read_sysfs(Path::new("/sys")).unwrap();
        assert!(!topo.cpus.is_empty());
        assert!(topo.cpus.windows(2).all(|w| w[0].cpu < w[1].cpu));
    }

    /// A random machine, worker and reserved sets, and ports.
    fn scenario() -> impl Strategy<Value = (Topology, Vec<usize>, Vec<usize>, Vec<PortReq>)> {
        (1usize..=2, 1usize..=4, 1usize..=2).prop_flat_map(|(p, c, t)| {
            let topo = Topology::synthetic(p, c, t);
            let n = p * c * t;
            let cpu = 0..n + 2;
            let req = (
                0u16..6,
                prop::option::of(prop::collection::vec(cpu.clone(), 1..5)),
                prop::option::of(0usize..3),
            );
            (
                Just(topo),
                prop::collection::vec(cpu.clone(), 0..n + 2),
                prop::collection::vec(cpu, 0..3),
                prop::collection::vec(req, 0..6),
            )
                .prop_map(|(topo, workers, reserved, reqs)| {
                    let ports = reqs
                        .into_iter()
                        .enumerate()
                        .map(|(i, (queues, cpus, numa_node))| PortReq {
                            name: format!("p{i}"),
                            queues,
                            cpus,
                            numa_node,
                        })
                        .collect();
                    (topo, workers, reserved, ports)
                })
        })
    }

    proptest! {
        #[test]
        fn plan_invariants((topo, workers, reserved, ports) in scenario()) {
            let plan = plan(&topo, &workers, &reserved, &ports);
            prop_assert_eq!(&plan, &super::plan(&topo, &workers, &reserved, &ports));
            let avail: BTreeSet<usize> =
                workers.iter().filter(|c| !reserved.contains(c)).copied().collect();
            for q in &plan.queues {
                prop_assert!(!reserved.contains(&q.cpu), "reserved CPU used: {:?}", q);
                prop_assert!(workers.contains(&q.cpu));
                prop_assert!(set_of(&plan, &q.port).contains(&q.cpu));
                prop_assert!(matches!(
                    q.rules[0],
                    Rule::OperatorSet | Rule::DefaultDisjoint | Rule::Shared
                ));
            }
            for (_, set) in &plan.port_sets {
                prop_assert!(set.iter().all(|c| avail.contains(c)));
            }
            for p in &ports {
                let placed: Vec<&QueuePlacement> =
                    plan.queues.iter().filter(|q| q.port == p.name).collect();
                if avail.is_empty() {
                    prop_assert!(placed.is_empty());
                    prop_assert_eq!(
                        p.queues > 0,
                        plan.warnings.contains(&Warning::NoCpu { port: p.name.clone() })
                    );
                    continue;
                }
                let numbers: Vec<u16> = placed.iter().map(|q| q.queue).collect();
                prop_assert_eq!(numbers, (0..p.queues).collect::<Vec<_>>());
                // Round-robin: the port's CPUs carry its queues within one of each other.
                let set = set_of(&plan, &p.name);
                let per_cpu: Vec<usize> = set
                    .iter()
                    .map(|c| placed.iter().filter(|q| q.cpu == *c).count())
                    .collect();
                if p.queues > 0 {
                    let (min, max) = (per_cpu.iter().min().unwrap(), per_cpu.iter().max().unwrap());
                    prop_assert!(max - min <= 1, "{:?} {:?}", set, per_cpu);
                }
            }
            // Default sets are disjoint from every other set while the free CPUs last.
            let operator: Vec<bool> = ports
                .iter()
                .map(|p| p.cpus.iter().flatten().any(|c| avail.contains(c)))
                .collect();
            let op_cpus: BTreeSet<usize> = plan
                .port_sets
                .iter()
                .zip(&operator)
                .filter(|(_, &op)| op)
                .flat_map(|((_, s), _)| s.iter().copied())
                .collect();
            let defaults = ports
                .iter()
                .zip(&operator)
                .filter(|(p, &op)| !op && p.queues > 0)
                .count();
            let free = avail.difference(&op_cpus).count();
            if defaults <= free {
                for (i, (name, set)) in plan.port_sets.iter().enumerate() {
                    if operator[i] {
                        continue;
                    }
                    for (j, (_, other)) in plan.port_sets.iter().enumerate() {
                        if i != j {
                            prop_assert!(
                                set.iter().all(|c| !other.contains(c)),
                                "{} overlaps: {:?}", name, plan.port_sets
                            );
                        }
                    }
                }
                let shared = plan.warnings.iter().any(|w| matches!(w, Warning::Shared { .. }));
                prop_assert!(!shared, "{:?}", plan.warnings);
            }
        }
    }
}
