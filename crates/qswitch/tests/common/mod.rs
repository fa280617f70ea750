//! The shared test helpers (`qswitch-test-support`), plus what only this package's tests
//! know: the path of the binary cargo built for them.

#![allow(unused_imports)] // each test file uses some of them

pub use qswitch_test_support::*;

/// The qswitch binary under test.
#[allow(dead_code)] // not every test file runs the binary itself
pub const QSWITCH: &str = env!("CARGO_BIN_EXE_qswitch");
