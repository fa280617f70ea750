//! `qswitch bench SCENARIO`.

/// Arguments of `qswitch bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Scenario to run.
    pub scenario: String,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("unknown scenario '{}'", args.scenario)
}
