//! [`Run`]: the one result type of a benchmark run, whatever the scenario measures.
//!
//! Every scenario interleaves its contenders (A B, B A, ...) and records, per run, who ran
//! ([`Run::contender`]), in which round and at which position, the run's own metrics (`M`:
//! Gbit/s and CPU for iperf3, Mpps for gen ports, Mpps and loss per frame size for PVP,
//! transactions/s for request/response) and its per-second samples (`S`). The metrics are
//! flattened into the run's JSON object, so `OUT/SCENARIO.json` reads as one flat object per
//! run; [`Run`] dereferences to `M` so code reads `run.gbps`, not `run.metrics.gbps`.

use std::ops::{Deref, DerefMut};

use serde::Serialize;

/// One run of one contender.
#[derive(Debug, Clone, Serialize)]
pub struct Run<M, S> {
    pub contender: String,
    /// 1-based round.
    pub round: u32,
    /// 1-based position in the interleaved order of all runs.
    pub seq: usize,
    /// What the scenario measured over the whole run.
    #[serde(flatten)]
    pub metrics: M,
    /// One per second of traffic.
    pub samples: Vec<S>,
}

impl<M, S> Deref for Run<M, S> {
    type Target = M;

    fn deref(&self) -> &M {
        &self.metrics
    }
}

impl<M, S> DerefMut for Run<M, S> {
    fn deref_mut(&mut self) -> &mut M {
        &mut self.metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Serialize)]
    struct Rate {
        rate: f64,
    }

    #[test]
    fn metrics_are_flattened_into_the_run() {
        let run = Run {
            contender: "qswitch".into(),
            round: 1,
            seq: 2,
            metrics: Rate { rate: 3.5 },
            samples: vec![1u32, 2],
        };
        assert_eq!(run.rate, 3.5);
        assert_eq!(
            serde_json::to_string(&run).unwrap(),
            r#"{"contender":"qswitch","round":1,"seq":2,"rate":3.5,"samples":[1,2]}"#
        );
    }
}
