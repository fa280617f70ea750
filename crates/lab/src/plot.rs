//! Dependency-free SVG plots for the benchmark results: a line chart (per-second series, with
//! vertical markers for step boundaries) and a grouped bar chart (with optional min–max
//! whiskers). Every chart is [`WIDTH`]×[`HEIGHT`] px; [`stack`] puts several under each other.
//!
//! Non-finite values (NaN, ±inf) are dropped from line series and drawn as 0 in bar charts,
//! so the output never contains `NaN`. Text is XML-escaped.

use std::fmt::Write;

/// Width of one chart, px.
pub const WIDTH: f64 = 800.0;
/// Height of one chart, px.
pub const HEIGHT: f64 = 450.0;
// The plot area; the legend sits right of it.
const LEFT: f64 = 72.0;
const RIGHT: f64 = 610.0;
const TOP: f64 = 44.0;
const BOTTOM: f64 = HEIGHT - 56.0;
/// Distinct colours (Tableau 10), used in order.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#9c755f", "#76b7b2", "#edc948",
    "#ff9da7", "#bab0ac",
];

/// One line of a [`line_chart`].
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart: one polyline (with dots) per series, `markers` as labelled dashed vertical
/// lines at their x (e.g. where a step of a scenario begins).
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    markers: &[(f64, String)],
) -> String {
    let finite = |&&(x, y): &&(f64, f64)| x.is_finite() && y.is_finite();
    let pts: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().filter(finite).copied())
        .collect();
    let xs = pts
        .iter()
        .map(|p| p.0)
        .chain(markers.iter().map(|m| m.0).filter(|x| x.is_finite()));
    let xa = Axis::new(
        xs.clone().fold(f64::INFINITY, f64::min),
        xs.fold(f64::NEG_INFINITY, f64::max),
    );
    let ya = Axis::new(
        pts.iter().map(|p| p.1).fold(0.0, f64::min),
        pts.iter().map(|p| p.1).fold(0.0, f64::max),
    );
    let mut s = open(title);
    axes(&mut s, Some(&xa), &ya, x_label, y_label);
    for (x, label) in markers.iter().filter(|m| m.0.is_finite()) {
        let px = xa.map(*x, LEFT, RIGHT);
        let _ = write!(
            s,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{BOTTOM}" stroke="#666" stroke-dasharray="5,4"/>"##
        );
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{}" font-size="11" fill="#444">{}</text>"##,
            px + 3.0,
            TOP + 12.0,
            esc(label)
        );
    }
    for (i, ser) in series.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let xy: Vec<String> = ser
            .points
            .iter()
            .filter(finite)
            .map(|&(x, y)| {
                format!(
                    "{:.1},{:.1}",
                    xa.map(x, LEFT, RIGHT),
                    ya.map(y, BOTTOM, TOP)
                )
            })
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            xy.join(" ")
        );
        for p in &xy {
            let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(s, r#"<circle cx="{x}" cy="{y}" r="2.5" fill="{c}"/>"#);
        }
    }
    legend(&mut s, series.iter().map(|x| x.name.as_str()));
    close(s)
}

/// A grouped bar chart: `groups` are (group label, bars as (name, value)); bars with the same
/// name share a colour across groups.
#[allow(dead_code)] // the plain form, for scenarios without repeated runs
pub fn bar_chart(title: &str, y_label: &str, groups: &[(String, Vec<(String, f64)>)]) -> String {
    bar_chart_with_ranges(title, y_label, groups, &[])
}

/// [`bar_chart`] with whiskers: `ranges[g][b]` is the (low, high) of bar `b` in group `g`
/// (e.g. min and max over runs); bars without an entry get no whisker.
pub fn bar_chart_with_ranges(
    title: &str,
    y_label: &str,
    groups: &[(String, Vec<(String, f64)>)],
    ranges: &[Vec<(f64, f64)>],
) -> String {
    let fin = |v: f64| if v.is_finite() { v } else { 0.0 };
    let mut names: Vec<&str> = Vec::new();
    for (_, bars) in groups {
        for (n, _) in bars {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
    }
    let vals = groups.iter().flat_map(|g| g.1.iter().map(|b| fin(b.1)));
    let whisk = ranges
        .iter()
        .flatten()
        .flat_map(|&(lo, hi)| [fin(lo), fin(hi)]);
    let all: Vec<f64> = vals.chain(whisk).collect();
    let ya = Axis::new(
        all.iter().copied().fold(0.0, f64::min),
        all.iter().copied().fold(0.0, f64::max) * 1.08,
    );
    let mut s = open(title);
    axes(&mut s, None, &ya, "", y_label);
    let slot = (RIGHT - LEFT) / groups.len().max(1) as f64;
    for (g, (label, bars)) in groups.iter().enumerate() {
        let bw = (slot * 0.7 / bars.len().max(1) as f64).min(90.0);
        let x0 = LEFT + slot * (g as f64 + 0.5) - bw * bars.len() as f64 / 2.0;
        for (b, (name, v)) in bars.iter().enumerate() {
            let (v, x) = (fin(*v), x0 + bw * b as f64);
            let c = PALETTE[names.iter().position(|n| n == name).unwrap_or(0) % PALETTE.len()];
            let (y1, y2) = (
                ya.map(v.max(0.0), BOTTOM, TOP),
                ya.map(v.min(0.0), BOTTOM, TOP),
            );
            let _ = write!(
                s,
                r#"<rect x="{:.1}" y="{y1:.1}" width="{:.1}" height="{:.1}" fill="{c}"/>"#,
                x + 2.0,
                bw - 4.0,
                y2 - y1
            );
            let mut top = y1;
            if let Some(&(lo, hi)) = ranges.get(g).and_then(|r| r.get(b)) {
                let (cx, ylo, yhi) = (
                    x + bw / 2.0,
                    ya.map(fin(lo), BOTTOM, TOP),
                    ya.map(fin(hi), BOTTOM, TOP),
                );
                let _ = write!(
                    s,
                    r##"<path d="M{cx:.1},{ylo:.1}V{yhi:.1}M{:.1},{ylo:.1}h12M{:.1},{yhi:.1}h12" stroke="#222" stroke-width="1.5" fill="none"/>"##,
                    cx - 6.0,
                    cx - 6.0
                );
                top = top.min(yhi);
            }
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">{}</text>"#,
                x + bw / 2.0,
                top - 5.0,
                num(v, 2)
            );
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            LEFT + slot * (g as f64 + 0.5),
            BOTTOM + 20.0,
            esc(label)
        );
    }
    legend(&mut s, names.into_iter());
    close(s)
}

/// Charts from this module stacked top to bottom into one SVG.
pub fn stack(charts: &[String]) -> String {
    let h = HEIGHT * charts.len() as f64;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{h}" viewBox="0 0 {WIDTH} {h}">"#
    );
    for (i, c) in charts.iter().enumerate() {
        s.push_str(&c.replacen("<svg ", &format!(r#"<svg y="{}" "#, HEIGHT * i as f64), 1));
    }
    s + "</svg>\n"
}

/// An axis: the data range widened to whole tick steps, and the ticks.
struct Axis {
    lo: f64,
    hi: f64,
    step: f64,
}

impl Axis {
    /// Roughly 5 "nice" ticks (1, 2, 2.5 or 5 × 10^k apart) covering `lo..=hi`.
    fn new(lo: f64, hi: f64) -> Axis {
        let (lo, hi) = if lo.is_finite() && hi.is_finite() {
            (lo, hi)
        } else {
            (0.0, 1.0)
        };
        let span = if hi - lo > 1e-12 {
            hi - lo
        } else {
            lo.abs().max(1.0)
        };
        let hi = lo + span;
        let raw = span / 5.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .into_iter()
            .find(|&m| m * mag >= raw * 0.999)
            .unwrap_or(10.0)
            * mag;
        // The slack (1% of a step) keeps 5.0017 (an iperf3 interval end) from adding a tick.
        let lo = (lo / step + 0.01).floor() * step;
        let hi = ((hi / step - 0.01).ceil() * step).max(lo + step);
        Axis { lo, hi, step }
    }
    fn ticks(&self) -> Vec<f64> {
        let n = ((self.hi - self.lo) / self.step).round() as usize;
        (0..=n).map(|i| self.lo + self.step * i as f64).collect()
    }
    /// Decimals that tell the ticks apart.
    fn decimals(&self) -> usize {
        let d = (-self.step.log10().floor()).max(0.0) as usize;
        if (self.step / 10f64.powi(-(d as i32)) - 2.5).abs() < 1e-9 {
            d + 1
        } else {
            d
        }
    }
    /// `v` mapped linearly from `lo..hi` to `a..b` (pixels).
    fn map(&self, v: f64, a: f64, b: f64) -> f64 {
        a + (v - self.lo) / (self.hi - self.lo) * (b - a)
    }
}

fn open(title: &str) -> String {
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12"><rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/><text x="{}" y="26" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"##,
        WIDTH / 2.0,
        esc(title)
    )
}

fn close(s: String) -> String {
    s + "</svg>\n"
}

/// Grid, ticks and labels; `x` is `None` for a categorical axis (bar charts).
fn axes(s: &mut String, x: Option<&Axis>, y: &Axis, x_label: &str, y_label: &str) {
    for t in y.ticks() {
        let py = y.map(t, BOTTOM, TOP);
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" y1="{py:.1}" x2="{RIGHT}" y2="{py:.1}" stroke="#e4e4e4"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT - 6.0,
            py + 4.0,
            num(t, y.decimals())
        );
    }
    if let Some(x) = x {
        for t in x.ticks() {
            let px = x.map(t, LEFT, RIGHT);
            let _ = write!(
                s,
                r##"<line x1="{px:.1}" y1="{BOTTOM}" x2="{px:.1}" y2="{}" stroke="#333"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
                BOTTOM + 5.0,
                BOTTOM + 19.0,
                num(t, x.decimals())
            );
        }
    }
    let _ = write!(
        s,
        r##"<path d="M{LEFT},{TOP}V{BOTTOM}H{RIGHT}" stroke="#333" fill="none"/><text x="{}" y="{}" text-anchor="middle">{}</text>"##,
        (LEFT + RIGHT) / 2.0,
        HEIGHT - 14.0,
        esc(x_label)
    );
    let cy = (TOP + BOTTOM) / 2.0;
    let _ = write!(
        s,
        r#"<text x="18" y="{cy}" text-anchor="middle" transform="rotate(-90 18 {cy})">{}</text>"#,
        esc(y_label)
    );
}

fn legend<'a>(s: &mut String, names: impl Iterator<Item = &'a str>) {
    for (i, n) in names.enumerate() {
        let y = TOP + 4.0 + 20.0 * i as f64;
        let c = PALETTE[i % PALETTE.len()];
        let _ = write!(
            s,
            r#"<rect x="{}" y="{y}" width="14" height="14" fill="{c}"/><text x="{}" y="{}">{}</text>"#,
            RIGHT + 16.0,
            RIGHT + 36.0,
            y + 11.5,
            esc(n)
        );
    }
}

/// `v` with `decimals` decimals; non-finite values print as 0.
fn num(v: f64, decimals: usize) -> String {
    let v = if v.is_finite() { v } else { 0.0 };
    let s = format!("{v:.decimals$}");
    if s.trim_start_matches(['-', '0', '.']).is_empty() {
        format!("{:.decimals$}", 0.0)
    } else {
        s
    }
}

/// XML-escapes text and attribute values.
fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts with `<svg`, ends with `</svg>`, and every tag is closed in order.
    fn assert_well_formed(svg: &str) {
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        let mut open: Vec<&str> = Vec::new();
        for tag in svg
            .split('<')
            .skip(1)
            .map(|t| &t[..t.find('>').expect("unclosed <")])
        {
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name), "mismatched </{name}>");
            } else if !tag.ends_with('/') {
                open.push(tag.split_whitespace().next().unwrap());
            }
        }
        assert!(open.is_empty(), "unclosed: {open:?}");
    }

    fn series(name: &str, ys: &[f64]) -> Series {
        Series {
            name: name.into(),
            points: ys
                .iter()
                .enumerate()
                .map(|(i, &y)| (i as f64 + 1.0, y))
                .collect(),
        }
    }

    #[test]
    fn plot_line_chart_is_well_formed() {
        let s = [
            series("qswitch #1", &[9.5, 10.1, 10.3]),
            series("linux-bridge #1", &[14.0, 15.2, 14.9]),
        ];
        let svg = line_chart("t", "s", "Gbit/s", &s, &[(2.0, "step 2".into())]);
        assert_well_formed(&svg);
        for name in ["qswitch #1", "linux-bridge #1", "step 2", "Gbit/s"] {
            assert!(svg.contains(name), "{name}");
        }
        assert_eq!(svg.matches("<polyline").count(), 2);
    }

    #[test]
    fn plot_ignores_non_finite_and_empty_input() {
        let s = [
            series("a", &[f64::NAN, 1.0, f64::INFINITY]),
            series("empty", &[]),
        ];
        assert_well_formed(&line_chart("t", "x", "y", &s, &[(f64::NAN, "m".into())]));
        assert_well_formed(&line_chart("nothing", "x", "y", &[], &[]));
        assert_well_formed(&bar_chart(
            "t",
            "y",
            &[("g".into(), vec![("a".into(), f64::NAN)])],
        ));
        assert_well_formed(&bar_chart("t", "y", &[]));
    }

    #[test]
    fn plot_bar_chart_with_whiskers() {
        let groups = vec![(
            "1 stream".to_string(),
            vec![
                ("qswitch".to_string(), 10.2),
                ("linux-bridge".to_string(), 14.8),
            ],
        )];
        let svg = bar_chart_with_ranges("t", "Gbit/s", &groups, &[vec![(9.5, 11.1), (14.1, 16.0)]]);
        assert_well_formed(&svg);
        for name in ["qswitch", "linux-bridge", "1 stream", "10.20", "14.80"] {
            assert!(svg.contains(name), "{name}");
        }
        assert_eq!(
            svg.matches("<path d=\"M").count(),
            3,
            "two whiskers and the axes"
        );
    }

    #[test]
    fn plot_escapes_text_and_stacks() {
        let svg = bar_chart(
            "a<b & \"c\"",
            "y",
            &[("g".into(), vec![("x>y".into(), 1.0)])],
        );
        assert!(svg.contains("a&lt;b &amp; &quot;c&quot;") && svg.contains("x&gt;y"));
        let both = stack(&[svg.clone(), svg]);
        assert_well_formed(&both);
        assert!(both.contains(r#"<svg y="450" "#));
    }

    #[test]
    fn plot_axis_ticks_are_nice() {
        let a = Axis::new(0.0, 9.7);
        assert_eq!(a.ticks(), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(a.decimals(), 0);
        let b = Axis::new(0.0, 0.23);
        assert_eq!(b.step, 0.05);
        assert_eq!(b.decimals(), 2);
        assert_eq!(Axis::new(0.0, 0.0).ticks().len(), 6);
        assert_eq!(
            Axis::new(1.0, 5.0017).ticks(),
            vec![1.0, 2.0, 3.0, 4.0, 5.0]
        );
        assert_eq!(num(-0.0001, 2), "0.00");
    }
}
