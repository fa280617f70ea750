//! Delegation to the IPAM plugin (SPEC.md section 4): looked up in `CNI_PATH`, run with the
//! plugin's own environment (`CNI_COMMAND` and the attachment overridable, for GC) and the
//! whole network config on stdin, its stderr passed through.
//!
//! Debian 12's reference plugins (1.1.1) speak up to spec 1.0.0. ADD, DEL and CHECK of a
//! 1.1.0 config go to the IPAM plugin as `cniVersion` 1.0.0 (the commands and the IPAM
//! result are the same in both; a plugin that speaks 1.1.0 speaks 1.0.0 too), and only if it
//! refuses that with code 1 as 1.1.0: one process start per call with the reference plugins,
//! not a refused one first (ADD latency). STATUS and GC (1.1.0 only) are sent to it only when
//! its VERSION lists 1.1.0, and GC then releases stale attachments with DEL.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::conf::{Input, Version};
use crate::error::{CniError, Code, Result};

/// Overrides of the environment for one delegated call.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub command: &'a str,
    /// `(CNI_CONTAINERID, CNI_IFNAME)`; `None`: the plugin's own.
    pub attachment: Option<(&'a str, &'a str)>,
}

/// The IPAM plugin's executable.
fn find(kind: &str) -> Result<PathBuf> {
    if kind.is_empty() || kind.contains('/') {
        return Err(crate::error::invalid_config(format!(
            "ipam.type {kind:?} is not a plugin name"
        )));
    }
    let path = std::env::var("CNI_PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(kind))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CniError::new(
                Code::InvalidConfig,
                "IPAM plugin not found",
                format!("no {kind:?} in CNI_PATH={path:?} (install containernetworking-plugins or fix ipam.type)"),
            )
        })
}

/// Runs the IPAM plugin with `stdin`; its stdout, or its error result as ours.
fn exec(kind: &str, call: Call<'_>, stdin: &[u8]) -> Result<Vec<u8>> {
    let exe = find(kind)?;
    let mut cmd = Command::new(&exe);
    cmd.env("CNI_COMMAND", call.command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some((container, ifname)) = call.attachment {
        cmd.env("CNI_CONTAINERID", container)
            .env("CNI_IFNAME", ifname)
            .env_remove("CNI_NETNS");
    }
    let mut child = cmd.spawn().map_err(|e| {
        CniError::new(
            Code::Io,
            "cannot run the IPAM plugin",
            format!("{}: {e}", exe.display()),
        )
    })?;
    // A plugin that exits without reading its stdin is answered by its exit status.
    let _ = child.stdin.take().expect("piped").write_all(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| CniError::new(Code::Io, "cannot run the IPAM plugin", e.to_string()))?;
    if out.status.success() {
        return Ok(out.stdout);
    }
    let err: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let code = err["code"].as_u64();
    Err(CniError {
        code: match code {
            Some(1) => Code::IncompatibleVersion,
            Some(11) => Code::TryAgainLater,
            _ => Code::Failed,
        },
        msg: format!(
            "IPAM plugin {kind} {} failed{}",
            call.command,
            code.map(|c| format!(" (code {c})")).unwrap_or_default()
        ),
        details: err["msg"]
            .as_str()
            .map(|m| match err["details"].as_str() {
                Some(d) if !d.is_empty() => format!("{m}: {d}"),
                _ => m.to_string(),
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&out.stdout).trim().to_string()),
    })
}

/// `input`'s config with `cniVersion` replaced, in `prevResult` too (CHECK, DEL).
fn with_version(input: &Input, version: &str) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&input.raw).expect("parsed before");
    v["cniVersion"] = Value::from(version);
    if let Some(prev) = v.get_mut("prevResult").filter(|p| p.is_object()) {
        prev["cniVersion"] = Value::from(version);
    }
    serde_json::to_vec(&v).expect("serializes")
}

/// ADD, DEL or CHECK on the IPAM plugin; ADD's result as JSON (`Null` for the others).
pub fn run(input: &Input, call: Call<'_>) -> Result<Value> {
    let Some(ipam) = &input.conf.ipam else {
        return Ok(Value::Null);
    };
    let out = if input.version == Version::V1_1_0 {
        match exec(&ipam.kind, call, &with_version(input, "1.0.0")) {
            Err(e) if e.code == Code::IncompatibleVersion => exec(&ipam.kind, call, &input.raw)?,
            r => r?,
        }
    } else {
        exec(&ipam.kind, call, &input.raw)?
    };
    if call.command != "ADD" {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&out).map_err(|e| {
        CniError::new(
            Code::Failed,
            format!("unreadable result from IPAM plugin {}", ipam.kind),
            e.to_string(),
        )
    })
}

/// Whether the IPAM plugin's VERSION lists 1.1.0 (STATUS and GC).
pub fn speaks_1_1(input: &Input) -> bool {
    let Some(ipam) = &input.conf.ipam else {
        return false;
    };
    let call = Call {
        command: "VERSION",
        attachment: None,
    };
    exec(&ipam.kind, call, br#"{"cniVersion":"1.0.0"}"#)
        .ok()
        .and_then(|o| serde_json::from_slice::<Value>(&o).ok())
        .and_then(|v| {
            v["supportedVersions"]
                .as_array()
                .map(|a| a.iter().any(|x| x == "1.1.0"))
        })
        .unwrap_or(false)
}

/// STATUS or GC on an IPAM plugin that speaks 1.1.0; nothing for one that does not.
pub fn forward(input: &Input, command: &str) -> Result<()> {
    let Some(ipam) = &input.conf.ipam else {
        return Ok(());
    };
    if !speaks_1_1(input) {
        return Ok(());
    }
    let call = Call {
        command,
        attachment: None,
    };
    exec(&ipam.kind, call, &input.raw).map(drop)
}
