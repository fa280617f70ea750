//! The Debian package: `packaging/build-deb.sh` (which builds the packaged binary, profile
//! `dist` without the `lab` feature; `tests/run.sh` builds it before the tests), then the .deb's control fields
//! (`dpkg-deb -I`), its file list and modes (`dpkg-deb -c`), and its contents unpacked into a
//! temporary root (`dpkg-deb -x`, the host is not touched): the binary runs, the default
//! config passes `run --check`, the man page renders, the completions are there.
//!
//! The packaged binary is the daemon and the CLI only: no `bench`, `demo` or `load`, no
//! `apt-get`, no DPDK C source and no debug sections ([`check_no_lab`]).
//!
//! Needs `cargo deb` (`cargo install cargo-deb`) and `dpkg-deb`; skips (fails under
//! `QSWITCH_REQUIRE_PRIVILEGED=1`) without them.

use std::path::{Path, PathBuf};
use std::process::Command;

use qswitch_test_support::skip;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn have(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn deb_builds_installs_into_a_temp_root_and_runs() {
    if !skip::require(have("cargo", &["deb", "--version"]), "needs cargo-deb")
        || !skip::require(have("dpkg-deb", &["--version"]), "needs dpkg-deb")
    {
        return;
    }
    let root = root();
    // The script builds the packaged binaries (profile `dist`, qswitch without the `lab`
    // feature) into target/dist; tests/run.sh builds them before the tests, so this is quick
    // there.
    let built = run(&mut Command::new(root.join("packaging/build-deb.sh")));
    let deb = PathBuf::from(
        built
            .lines()
            .last()
            .expect("cargo deb prints the .deb path")
            .trim(),
    );
    assert!(deb.is_file(), "{}", deb.display());

    let info = run(Command::new("dpkg-deb").arg("-I").arg(&deb));
    for field in [
        "Package: qswitch",
        "Section: net",
        "Architecture: amd64",
        "iproute2",
        "libc6",
    ] {
        assert!(info.contains(field), "no {field:?} in\n{info}");
    }
    let ctl = run(Command::new("dpkg-deb").arg("-f").arg(&deb).arg("Depends"));
    assert!(ctl.contains("iproute2") && ctl.contains("libc6"), "{ctl}");

    let list = run(Command::new("dpkg-deb").arg("-c").arg(&deb));
    let mode_of = |path: &str| {
        list.lines()
            .find(|l| l.ends_with(&format!(".{path}")))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("{path} not in the package:\n{list}"))
            .to_string()
    };
    assert_eq!(mode_of("/usr/bin/qswitch"), "-rwxr-xr-x");
    assert_eq!(mode_of("/usr/lib/cni/qswitch-cni"), "-rwxr-xr-x");
    for f in [
        "/etc/qswitch/qswitch.toml",
        "/usr/share/man/man1/qswitch.1.gz",
        "/usr/share/bash-completion/completions/qswitch",
        "/usr/share/zsh/vendor-completions/_qswitch",
        "/usr/share/fish/vendor_completions.d/qswitch.fish",
        "/usr/share/doc/qswitch/libvirt.md",
        "/usr/share/doc/qswitch/kubernetes.md",
    ] {
        assert_eq!(mode_of(f), "-rw-r--r--", "{f}");
    }
    assert!(
        list.lines()
            .any(|l| l.ends_with("/systemd/system/qswitch.service")),
        "no unit in\n{list}"
    );
    let conffiles = run(Command::new("dpkg-deb")
        .arg("-I")
        .arg(&deb)
        .arg("conffiles"));
    assert_eq!(conffiles.trim(), "/etc/qswitch/qswitch.toml");
    let postinst = run(Command::new("dpkg-deb").arg("-I").arg(&deb).arg("postinst"));
    assert!(postinst.contains("useradd --system"), "{postinst}");
    assert!(
        !postinst.contains("systemctl start") && !postinst.contains("deb-systemd-invoke start"),
        "the package must not start the service:\n{postinst}"
    );

    let dir = std::env::temp_dir().join(format!("qswitch-deb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let result = std::panic::catch_unwind(|| check_unpacked(&deb, &dir));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn check_unpacked(deb: &Path, dir: &Path) {
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dir));
    let qswitch = dir.join("usr/bin/qswitch");
    check_no_lab(&qswitch);
    let version = run(Command::new(&qswitch).arg("--version"));
    assert!(version.starts_with("qswitch "), "{version}");
    // The CNI plugin answers VERSION as the spec says.
    let mut cni = Command::new(dir.join("usr/lib/cni/qswitch-cni"));
    cni.env("CNI_COMMAND", "VERSION");
    let versions = run(&mut cni);
    assert!(
        versions.contains(r#""supportedVersions":["0.3.0""#),
        "{versions}"
    );
    let checked = run(Command::new(&qswitch)
        .args(["run", "--check", "--config"])
        .arg(dir.join("etc/qswitch/qswitch.toml")));
    assert!(checked.contains(": ok"), "{checked}");
    // An invalid config exits 2.
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[switch]\nworkers = \"oops\"\n").unwrap();
    let out = Command::new(&qswitch)
        .args(["run", "--check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    let man = dir.join("usr/share/man/man1/qswitch.1.gz");
    let page = if have("man", &["--version"]) {
        run(Command::new("man")
            .arg("-l")
            .arg(&man)
            .env("MANPAGER", "cat")
            .env("PAGER", "cat"))
    } else {
        run(Command::new("sh")
            .arg("-c")
            .arg(format!("zcat {}", man.display())))
    };
    assert!(page.contains("qswitch"), "{page}");
    assert!(page.contains("run"), "subcommands in the man page:\n{page}");

    let bash =
        std::fs::read_to_string(dir.join("usr/share/bash-completion/completions/qswitch")).unwrap();
    assert!(
        bash.contains("complete -F") && bash.contains("qswitch"),
        "{bash}"
    );
    let zsh =
        std::fs::read_to_string(dir.join("usr/share/zsh/vendor-completions/_qswitch")).unwrap();
    assert!(zsh.starts_with("#compdef qswitch"), "{zsh}");
    let fish =
        std::fs::read_to_string(dir.join("usr/share/fish/vendor_completions.d/qswitch.fish"))
            .unwrap();
    assert!(fish.contains("complete -c qswitch"), "{fish}");
}

/// The lab stays out of the package: its subcommands are unknown, and neither its tool
/// installation, nor its DPDK C source, nor debug sections are in the binary.
fn check_no_lab(qswitch: &Path) {
    for sub in ["bench", "demo", "load"] {
        let out = Command::new(qswitch)
            .args([sub, "--help"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "qswitch {sub}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("unrecognized subcommand"),
            "qswitch {sub}: {err}"
        );
    }
    let bytes = std::fs::read(qswitch).unwrap();
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    assert!(!has(b"apt-get"), "the packaged binary mentions apt-get");
    assert!(
        !has(b"#include <rte_"),
        "the packaged binary holds DPDK C source"
    );
    let debug: Vec<String> = elf_section_names(&bytes)
        .into_iter()
        .filter(|n| n.starts_with(".debug_") || n.starts_with(".zdebug_"))
        .collect();
    assert!(
        debug.is_empty(),
        "debug sections in the packaged binary: {debug:?}"
    );
    eprintln!(
        "packaged binary: {} bytes, sections {:?}",
        bytes.len(),
        elf_section_names(&bytes)
    );
}

/// The section names of a 64-bit little-endian ELF file (what `readelf -S` lists).
fn elf_section_names(elf: &[u8]) -> Vec<String> {
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap());
    let u32_at = |o: usize| u32::from_le_bytes(elf[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap()) as usize;
    assert_eq!(
        &elf[..6],
        b"\x7fELF\x02\x01",
        "not a 64-bit little-endian ELF file"
    );
    let (shoff, shentsize, shnum, shstrndx) = (
        u64_at(0x28),
        usize::from(u16_at(0x3a)),
        u16_at(0x3c),
        u16_at(0x3e),
    );
    let header = |i: u16| shoff + usize::from(i) * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18);
    (0..shnum)
        .map(|i| {
            let start = strtab + u32_at(header(i)) as usize;
            let len = elf[start..].iter().position(|&b| b == 0).unwrap();
            String::from_utf8_lossy(&elf[start..start + len]).into_owned()
        })
        .collect()
}
