//! Security group rules the firewall's tests and benches share.

/// The 50-rule egress group of issue 31's acceptance: 49 TCP rules (ports 1000 to 1048),
/// then the UDP rule to port 53 that the frames match: only the last rule matches. TOML
/// inline tables, one a line, each followed by a comma.
pub fn fifty_rules() -> String {
    let mut rules = String::new();
    for i in 0..49 {
        rules.push_str(&format!(
            "{{ direction = \"egress\", protocol = \"tcp\", ports = {} }},\n",
            1000 + i
        ));
    }
    rules.push_str(r#"{ direction = "egress", protocol = "udp", ports = 53 },"#);
    rules
}
