//! The firewall in the switch: which ports it filters, driven single-threaded on a
//! [`Switch::manual`] switch through inject ports (see `common`).

mod common;

use common::Sim;
use qswitch_api::config::Config;
use qswitch_api::PortConfig;
use qswitch_dp::Options;

/// A config's `[[security_group]]` tables and `[firewall]` as switch options, and its ports.
fn options(toml: &str) -> (Options, Vec<PortConfig>) {
    let c = Config::from_toml(toml).expect("config");
    let options = Options {
        firewall: c.firewall,
        security_groups: c.security_groups.clone(),
        ..Options::default()
    };
    (options, c.ports)
}

const GROUPS: &str = r#"
[switch]
workers = "0"

[[security_group]]
name = "web"
rules = [{ direction = "ingress", protocol = "tcp", ports = "80" }, { direction = "egress" }]

[[port]]
name = "vm"
type = "gen"
security_groups = ["web"]

[[port]]
name = "out"
type = "gen"
"#;

#[test]
fn the_switch_holds_the_firewall_and_knows_its_filtered_ports() {
    let (options, ports) = options(GROUPS);
    let sim = Sim::with(1, options);
    let fw = sim.sw.firewall().clone();
    assert!(!fw.active(), "no port with groups yet: no table");
    sim.sw.add_inject_port_config(&ports[0]).unwrap();
    sim.sw.add_inject_port_config(&ports[1]).unwrap();
    assert!(fw.filtered(0), "vm has groups");
    assert!(!fw.filtered(1), "out has none");
    assert!(fw.active());
    assert_eq!(
        fw.rules()
            .name(fw.rules().ports[0].as_ref().unwrap().ingress[0].id),
        "web/0"
    );
    sim.sw.del_port("vm").unwrap();
    assert!(!fw.filtered(0), "a removed port is not filtered");
}

#[test]
fn a_switch_without_groups_has_an_empty_firewall() {
    let sim = Sim::new(1);
    sim.sw.add_inject_port("a", None).unwrap();
    let fw = sim.sw.firewall();
    assert!(!fw.filtered(0));
    assert!(!fw.active(), "no table is allocated");
    assert!(fw.rules().ports.iter().all(Option::is_none));
}
