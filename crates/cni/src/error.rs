//! The CNI error result: a code from the spec's table, a one-line message and details, as JSON
//! on stdout, and a non-zero exit.

use serde::Serialize;

/// The spec's well-known error codes (SPEC.md, "Error") and the plugin's own (100+).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// 1: the config's `cniVersion` is not one the plugin speaks.
    IncompatibleVersion = 1,
    /// 3: the container (its network namespace) does not exist.
    UnknownContainer = 3,
    /// 4: a required environment variable is missing or invalid.
    InvalidEnv = 4,
    /// 5: stdin could not be read, a helper could not be run.
    Io = 5,
    /// 6: stdin is not JSON.
    Decode = 6,
    /// 7: a key of the network config is missing, of the wrong type or out of range.
    InvalidConfig = 7,
    /// 11: the daemon is not reachable; the runtime should retry.
    TryAgainLater = 11,
    /// 50 (STATUS): the plugin cannot serve ADD now.
    Unavailable = 50,
    /// 100: the interface the runtime asked for already exists in the container.
    AlreadyExists = 100,
    /// 101: CHECK found the attachment not as ADD left it.
    CheckFailed = 101,
    /// 102: the daemon refused the port, or a link could not be set up.
    Failed = 102,
}

/// A failed command: what the plugin prints and exits with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{msg}: {details}")]
pub struct CniError {
    pub code: Code,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: Code, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The error result in `version`'s format (the same in every version).
    pub fn to_json(&self, version: &str) -> String {
        #[derive(Serialize)]
        struct Out<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            details: &'a str,
        }
        serde_json::to_string(&Out {
            cni_version: version,
            code: self.code as u32,
            msg: &self.msg,
            details: &self.details,
        })
        .expect("strings serialize")
    }
}

pub type Result<T, E = CniError> = std::result::Result<T, E>;

/// Shorthands for the common codes.
pub fn invalid_config(details: impl Into<String>) -> CniError {
    CniError::new(Code::InvalidConfig, "invalid network config", details)
}

pub fn invalid_env(details: impl Into<String>) -> CniError {
    CniError::new(Code::InvalidEnv, "invalid environment", details)
}

pub fn failed(msg: impl Into<String>, details: impl Into<String>) -> CniError {
    CniError::new(Code::Failed, msg, details)
}
