//! Line plots as hand-written SVG: axes (linear or log), ticks, one polyline with markers per
//! series, and a legend. Small enough that a plotting crate is not worth its build time.

use std::fmt::Write as _;

/// One named curve.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A plot of several curves over shared axes.
#[derive(Clone, Debug, PartialEq)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<Series>,
}

const W: f64 = 720.0;
const H: f64 = 440.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 56.0;
const COLORS: [&str; 8] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/// A value on an axis: `log10` on log axes.
fn axis_value(v: f64, log: bool) -> Option<f64> {
    if !v.is_finite() {
        return None;
    }
    if log { (v > 0.0).then(|| v.log10()) } else { Some(v) }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Tick positions (in axis units) for the range `[lo, hi]`.
fn ticks(lo: f64, hi: f64, log: bool) -> Vec<f64> {
    if log {
        let (a, b) = (lo.floor() as i32, hi.ceil() as i32);
        return (a..=b).map(f64::from).filter(|t| *t >= lo - 1e-9 && *t <= hi + 1e-9).collect();
    }
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * mag).find(|s| span / s <= 6.0).unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(t);
        t += step;
    }
    out
}

/// A tick's text: round numbers without trailing zeros (`10`, `0.25`), powers of ten on log axes
/// (`1000`, `0.01`, `1e-5`).
fn tick_label(t: f64, log: bool) -> String {
    if log {
        let e = t.round() as i32;
        return match e {
            0..=5 => format!("{}", 10i64.pow(e as u32)),
            -3..=-1 => format!("{}", 10f64.powi(e)),
            _ => format!("1e{e}"),
        };
    }
    if (t - t.round()).abs() < 1e-9 { format!("{}", t.round() as i64) } else { format!("{}", (t * 1e6).round() / 1e6) }
}

impl Plot {
    /// The plot as a standalone SVG document.
    pub fn svg(&self) -> String {
        let points: Vec<(f64, f64)> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter_map(|&(x, y)| Some((axis_value(x, self.log_x)?, axis_value(y, self.log_y)?)))
            .collect();
        let range = |vals: Vec<f64>, log: bool| {
            let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = vals.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if !lo.is_finite() {
                return (0.0, 1.0);
            }
            let (lo, hi) = if log { (lo.floor(), hi.ceil()) } else { (lo.min(0.0), hi) };
            if hi - lo < 1e-12 { (lo - 0.5, hi + 0.5) } else { (lo, hi) }
        };
        let (x0, x1) = range(points.iter().map(|p| p.0).collect(), self.log_x);
        let (y0, y1) = range(points.iter().map(|p| p.1).collect(), self.log_y);
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
        let sy = |y: f64| TOP + ph - (y - y0) / (y1 - y0) * ph;

        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            LEFT + pw / 2.0,
            escape(&self.title)
        );
        for t in ticks(x0, x1, self.log_x) {
            let x = sx(t);
            let _ =
                writeln!(s, r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e5e5e5"/>"##, TOP + ph);
            let _ = writeln!(
                s,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                TOP + ph + 16.0,
                escape(&tick_label(t, self.log_x))
            );
        }
        for t in ticks(y0, y1, self.log_y) {
            let y = sy(t);
            let _ =
                writeln!(s, r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/>"##, LEFT + pw);
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                LEFT - 6.0,
                y + 4.0,
                escape(&tick_label(t, self.log_y))
            );
        }
        let _ = writeln!(s, r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}{}</text>"#,
            LEFT + pw / 2.0,
            H - 14.0,
            escape(&self.x_label),
            if self.log_x { " (log)" } else { "" }
        );
        let _ = writeln!(
            s,
            r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}{}</text>"#,
            TOP + ph / 2.0,
            escape(&self.y_label),
            if self.log_y { " (log)" } else { "" }
        );
        for (i, series) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let pts: Vec<(f64, f64)> = series
                .points
                .iter()
                .filter_map(|&(x, y)| Some((sx(axis_value(x, self.log_x)?), sy(axis_value(y, self.log_y)?))))
                .collect();
            let path: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            if pts.len() > 1 {
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
                    path.join(" ")
                );
            }
            for (x, y) in &pts {
                let _ = writeln!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{color}"/>"#);
            }
            let ly = TOP + 10.0 + 18.0 * i as f64;
            let lx = LEFT + pw + 12.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/>"#,
                lx + 18.0
            );
            let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, lx + 24.0, ly + 4.0, escape(&series.name));
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_a_curve_per_series_and_skips_nonpositive_log_points() {
        let plot = Plot {
            title: "t <1>".into(),
            x_label: "n".into(),
            y_label: "ms".into(),
            log_x: true,
            log_y: true,
            series: vec![
                Series { name: "a".into(), points: vec![(1.0, 0.5), (10.0, 5.0), (100.0, 0.0)] },
                Series { name: "b".into(), points: vec![(1.0, 1.0), (100.0, 2.0)] },
            ],
        };
        let svg = plot.svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(svg.contains("t &lt;1&gt;"));
    }

    #[test]
    fn tick_labels_are_plain() {
        assert_eq!(tick_label(20.0, false), "20");
        assert_eq!(tick_label(0.25, false), "0.25");
        assert_eq!(tick_label(3.0, true), "1000");
        assert_eq!(tick_label(-2.0, true), "0.01");
        assert_eq!(tick_label(-5.0, true), "1e-5");
    }

    #[test]
    fn linear_ticks_are_round() {
        assert_eq!(ticks(0.0, 10.0, false), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(-0.2, 2.1, true), vec![0.0, 1.0, 2.0]);
    }
}
