//! The allocation rule, as a pure function.
//!
//! Ports compete for one uplink of capacity C. Port i has demand d_i, guarantee min_i (0 if
//! none), limit max_i (unbounded if none) and weight w_i ≥ 1. It gets
//!
//! ```text
//!   a_i = min(d_i, max_i, max(min_i, w_i · L))
//! ```
//!
//! where L is the largest level with Σ a_i ≤ C (water-filling). Guarantees are floors, the
//! weights share what the floors leave, limits and demands cap. Every a_i is non-decreasing
//! in L, so Σ a_i(L) is a piecewise linear non-decreasing function whose breakpoints are
//! min_i / w_i (a port starts to rise above its floor) and min(d_i, max_i) / w_i (it reaches
//! its cap); [`allocate`] walks them in order and solves for L on the segment that crosses C.
//!
//! If even the floors do not fit (Σ min(min_i, d_i, max_i) > C, which admission control
//! prevents), every floor is scaled down by the same factor.

/// One port's input to [`allocate`], in bits/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Claim {
    pub demand: f64,
    /// Guarantee; 0 for none.
    pub min: f64,
    /// Limit; `f64::INFINITY` for none.
    pub max: f64,
    /// Weight, > 0.
    pub weight: f64,
}

/// Fills `out[i]` with the allocation of `claims[i]` for capacity `capacity`, and returns
/// the level L (`f64::INFINITY` when every port gets its cap). `out` must be as long as
/// `claims`. `scratch` is reused between calls to avoid allocating.
pub fn allocate(
    capacity: f64,
    claims: &[Claim],
    out: &mut [f64],
    scratch: &mut Vec<(f64, f64)>,
) -> f64 {
    let cap = |c: &Claim| c.demand.min(c.max).max(0.0);
    let floor = |c: &Claim| c.min.min(cap(c)).max(0.0);
    let capacity = capacity.max(0.0);
    let total_cap: f64 = claims.iter().map(cap).sum();
    if total_cap <= capacity {
        for (o, c) in out.iter_mut().zip(claims) {
            *o = cap(c);
        }
        return f64::INFINITY;
    }
    let total_floor: f64 = claims.iter().map(floor).sum();
    if total_floor >= capacity {
        let k = if total_floor > 0.0 {
            capacity / total_floor
        } else {
            0.0
        };
        for (o, c) in out.iter_mut().zip(claims) {
            *o = floor(c) * k;
        }
        return 0.0;
    }
    // Breakpoints: (level, change of slope).
    scratch.clear();
    for c in claims {
        let w = c.weight;
        if w <= 0.0 || !w.is_finite() {
            continue;
        }
        let (lo, hi) = (floor(c) / w, cap(c) / w);
        if hi > lo {
            scratch.push((lo, w));
            scratch.push((hi, -w));
        }
    }
    scratch.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut level, mut sum, mut slope) = (0.0f64, total_floor, 0.0f64);
    let mut found = None;
    for &(bp, dw) in scratch.iter() {
        let at = sum + slope * (bp - level);
        if at >= capacity && slope > 0.0 {
            found = Some(level + (capacity - sum) / slope);
            break;
        }
        level = bp;
        sum = at;
        slope += dw;
    }
    // Not found only through rounding (total_cap > capacity says the crossing exists).
    let l = found.unwrap_or(level);
    let mut total = 0.0;
    for (o, c) in out.iter_mut().zip(claims) {
        *o = cap(c).min(floor(c).max(c.weight * l));
        total += *o;
    }
    // Rounding must never make the sum exceed the capacity.
    if total > capacity && total > 0.0 {
        let k = capacity / total;
        for o in out.iter_mut() {
            *o *= k;
        }
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const INF: f64 = f64::INFINITY;

    fn claim(demand: f64, min: f64, max: f64, weight: f64) -> Claim {
        Claim {
            demand,
            min,
            max,
            weight,
        }
    }

    fn run(c: f64, claims: &[Claim]) -> Vec<f64> {
        let mut out = vec![0.0; claims.len()];
        allocate(c, claims, &mut out, &mut Vec::new());
        out
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() < 1e-6 * (1.0 + y.abs()))
    }

    /// The seed-001 steps, in Mbit/s: six greedy ports on 1000.
    #[test]
    fn seed001_steps() {
        let greedy = |min: f64, max: f64| claim(1e9, min, max, 1.0);
        let step = |h: (f64, f64), vm12: f64, rest: f64| {
            let mut v = vec![greedy(h.0, h.1), greedy(h.0, h.1)];
            v.extend([greedy(vm12, INF), greedy(vm12, INF)]);
            v.extend([greedy(rest, INF), greedy(rest, INF)]);
            run(1000.0, &v)
        };
        let x = 1000.0 / 6.0;
        assert!(close(&step((0.0, INF), 0.0, 0.0), &[x; 6]));
        let s2 = [100.0, 100.0, 200.0, 200.0, 200.0, 200.0];
        assert!(close(&step((0.0, 100.0), 0.0, 0.0), &s2));
        assert!(close(&step((0.0, 100.0), 100.0, 0.0), &s2));
        assert!(close(&step((0.0, 100.0), 200.0, 0.0), &s2));
        assert!(close(
            &step((0.0, 100.0), 300.0, 0.0),
            &[100.0, 100.0, 300.0, 300.0, 100.0, 100.0]
        ));
        assert!(close(
            &step((0.0, 100.0), 400.0, 0.0),
            &[50.0, 50.0, 400.0, 400.0, 50.0, 50.0]
        ));
        assert!(close(&step((150.0, INF), 150.0, 150.0), &[x; 6]));
    }

    #[test]
    fn weights_share_spare_capacity() {
        let out = run(
            700.0,
            &[
                claim(INF, 0.0, INF, 1.0),
                claim(INF, 0.0, INF, 2.0),
                claim(INF, 0.0, INF, 4.0),
            ],
        );
        assert!(close(&out, &[100.0, 200.0, 400.0]), "{out:?}");
        // A port that wants little leaves the rest to the others, still 1:2.
        let out = run(
            700.0,
            &[
                claim(INF, 0.0, INF, 1.0),
                claim(INF, 0.0, INF, 2.0),
                claim(10.0, 0.0, INF, 4.0),
            ],
        );
        assert!(close(&out, &[230.0, 460.0, 10.0]), "{out:?}");
    }

    #[test]
    fn demand_caps_guarantee_and_oversubscribed_floors_scale() {
        let out = run(
            100.0,
            &[claim(10.0, 50.0, INF, 1.0), claim(INF, 0.0, INF, 1.0)],
        );
        assert!(close(&out, &[10.0, 90.0]), "{out:?}");
        let out = run(
            100.0,
            &[claim(INF, 100.0, INF, 1.0), claim(INF, 100.0, INF, 1.0)],
        );
        assert!(close(&out, &[50.0, 50.0]), "{out:?}");
        assert!(close(&run(100.0, &[]), &[]));
    }

    fn claims() -> impl Strategy<Value = Vec<Claim>> {
        let one = (
            0.0f64..2000.0,
            prop_oneof![Just(0.0), 0.0f64..400.0],
            prop_oneof![Just(INF), 1.0f64..1500.0],
            1u32..8,
        )
            .prop_map(|(d, min, max, w)| claim(d, min.min(max), max, f64::from(w)));
        proptest::collection::vec(one, 0..10)
    }

    proptest! {
        #[test]
        fn properties(cs in claims(), c in 1.0f64..3000.0, bump in 0usize..10, more in 1.0f64..500.0) {
            let out = run(c, &cs);
            let total: f64 = out.iter().sum();
            let eps = 1e-6 * (1.0 + c);
            // Never above the capacity.
            prop_assert!(total <= c + eps, "sum {total} > {c}");
            let floors: f64 = cs.iter().map(|x| x.min.min(x.demand).min(x.max)).sum();
            for (a, x) in out.iter().zip(&cs) {
                // Caps: demand and limit.
                prop_assert!(*a <= x.demand + eps && *a <= x.max + eps);
                prop_assert!(*a >= -eps);
                // Floors: the guarantee (capped by demand) whenever the floors fit.
                if floors <= c {
                    prop_assert!(*a + eps >= x.min.min(x.demand).min(x.max), "{a} under floor of {x:?}");
                }
            }
            // Work conservation: all of the capacity, or everything asked for.
            let caps: f64 = cs.iter().map(|x| x.demand.min(x.max)).sum();
            prop_assert!((total - c.min(caps)).abs() <= 1e-6 * (1.0 + c), "total {total}, c {c}, caps {caps}");
            // Monotonic: more capacity takes nothing from anyone.
            let out2 = run(c + more, &cs);
            for (a, b) in out.iter().zip(&out2) {
                prop_assert!(b + eps >= *a);
            }
            // Monotonic: more demand of one port never lowers its allocation.
            if !cs.is_empty() {
                let i = bump % cs.len();
                let mut cs3 = cs.clone();
                cs3[i].demand += more;
                let out3 = run(c, &cs3);
                prop_assert!(out3[i] + eps >= out[i]);
            }
            // No starvation: a port gets at least its weighted share of the level.
            let mut sc = Vec::new();
            let mut o = vec![0.0; cs.len()];
            let l = allocate(c, &cs, &mut o, &mut sc);
            if floors <= c && l.is_finite() {
                for (a, x) in o.iter().zip(&cs) {
                    let want = x.demand.min(x.max).min(x.weight * l);
                    prop_assert!(*a + eps >= want);
                }
            }
        }
    }
}
