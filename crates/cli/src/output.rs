//! What a benchmark suite produces: tables (printed aligned, written as CSV and inside one JSON
//! file), line plots (written as SVG) and notes, plus the progress bar long runs show on stderr.

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Map, Value, json};

use crate::svg::Plot;

/// One cell of a table.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Text(String),
    Int(u64),
    /// A measured value, printed with a few significant digits.
    Num(f64),
    /// No value (a model not available, a size not run).
    Missing,
}

impl Cell {
    fn json(&self) -> Value {
        match self {
            Cell::Text(s) => Value::String(s.clone()),
            Cell::Int(n) => json!(n),
            Cell::Num(x) if x.is_finite() => json!(x),
            Cell::Num(_) | Cell::Missing => Value::Null,
        }
    }

    fn csv(&self) -> String {
        match self {
            Cell::Text(s) if s.contains([',', '"', '\n']) => format!("\"{}\"", s.replace('"', "\"\"")),
            Cell::Text(s) => s.clone(),
            Cell::Int(n) => n.to_string(),
            Cell::Num(x) => format!("{x}"),
            Cell::Missing => String::new(),
        }
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cell::Text(s) => f.write_str(s),
            Cell::Int(n) => write!(f, "{n}"),
            Cell::Num(x) => f.write_str(&sig(*x)),
            Cell::Missing => f.write_str("-"),
        }
    }
}

/// `x` with three significant digits (plain notation between 1e-4 and 1e6).
pub fn sig(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    if x == 0.0 {
        return "0".into();
    }
    let a = x.abs();
    if !(1e-4..1e6).contains(&a) {
        return format!("{x:.2e}");
    }
    let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
    format!("{x:.decimals$}")
}

impl From<&str> for Cell {
    fn from(s: &str) -> Cell {
        Cell::Text(s.to_string())
    }
}

impl From<String> for Cell {
    fn from(s: String) -> Cell {
        Cell::Text(s)
    }
}

impl From<f64> for Cell {
    fn from(x: f64) -> Cell {
        Cell::Num(x)
    }
}

impl From<usize> for Cell {
    fn from(n: usize) -> Cell {
        Cell::Int(n as u64)
    }
}

impl From<u64> for Cell {
    fn from(n: u64) -> Cell {
        Cell::Int(n)
    }
}

impl From<Option<f64>> for Cell {
    fn from(x: Option<f64>) -> Cell {
        x.map_or(Cell::Missing, Cell::Num)
    }
}

/// A table with a file-name slug, a title and named columns.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    pub slug: String,
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    pub fn new(slug: &str, title: &str, columns: &[&str]) -> Table {
        Table {
            slug: slug.to_string(),
            title: title.to_string(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (padded with `Missing` or cut to the number of columns).
    pub fn push(&mut self, mut row: Vec<Cell>) {
        row.resize(self.columns.len(), Cell::Missing);
        self.rows.push(row);
    }

    /// The table as CSV: a header line, then one line per row.
    pub fn csv(&self) -> String {
        let mut out = String::new();
        let header: Vec<String> = self.columns.iter().map(|c| Cell::Text(c.clone()).csv()).collect();
        out.push_str(&header.join(","));
        out.push('\n');
        for row in &self.rows {
            let cells: Vec<String> = row.iter().map(Cell::csv).collect();
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }

    /// The rows as JSON objects keyed by column name.
    pub fn json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|row| {
                let obj: Map<String, Value> = self.columns.iter().cloned().zip(row.iter().map(Cell::json)).collect();
                Value::Object(obj)
            })
            .collect();
        json!({ "title": self.title, "columns": self.columns, "rows": rows })
    }
}

impl fmt::Display for Table {
    /// A Markdown table under its title (aligned, so it reads in a terminal too).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text: Vec<Vec<String>> = self.rows.iter().map(|r| r.iter().map(|c| c.to_string()).collect()).collect();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| text.iter().map(|r| r[i].len()).chain([self.columns[i].len(), 3]).max().unwrap_or(3))
            .collect();
        writeln!(f, "## {}\n", self.title)?;
        let line = |cells: Vec<&str>| {
            let mut s = String::from("|");
            for (i, c) in cells.iter().enumerate() {
                // Left-align the first column (names), right-align the numbers.
                if i == 0 {
                    let _ = write!(s, " {c:<w$} |", w = widths[i]);
                } else {
                    let _ = write!(s, " {c:>w$} |", w = widths[i]);
                }
            }
            s
        };
        writeln!(f, "{}", line(self.columns.iter().map(String::as_str).collect()))?;
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        writeln!(f, "{}", line(rule.iter().map(String::as_str).collect()))?;
        for row in &text {
            writeln!(f, "{}", line(row.iter().map(String::as_str).collect()))?;
        }
        Ok(())
    }
}

/// Everything a suite produced.
#[derive(Clone, Debug, Default)]
pub struct SuiteOutput {
    pub suite: String,
    /// Facts about the run (device, repeats, sizes) printed above the tables and kept in the JSON.
    pub meta: Vec<(String, String)>,
    pub tables: Vec<Table>,
    pub plots: Vec<(String, Plot)>,
    /// Lines printed after the tables (targets met or missed, caveats).
    pub notes: Vec<String>,
}

impl SuiteOutput {
    pub fn new(suite: &str) -> SuiteOutput {
        SuiteOutput { suite: suite.to_string(), ..SuiteOutput::default() }
    }

    pub fn meta(&mut self, key: &str, value: impl ToString) {
        self.meta.push((key.to_string(), value.to_string()));
    }

    /// The whole output as one JSON document.
    pub fn json(&self) -> Value {
        let meta: Map<String, Value> = self.meta.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        let tables: Map<String, Value> = self.tables.iter().map(|t| (t.slug.clone(), t.json())).collect();
        json!({ "suite": self.suite, "meta": meta, "tables": tables, "notes": self.notes })
    }

    /// Writes `<suite>_<table>.csv` for each table, `<suite>.json`, and `<suite>_<plot>.svg` for
    /// each plot into `dir` (created if needed); returns the paths written.
    pub fn write(&self, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut written = Vec::new();
        let mut put = |name: String, text: String| -> anyhow::Result<()> {
            let path = dir.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            written.push(path);
            Ok(())
        };
        for t in &self.tables {
            put(format!("{}_{}.csv", self.suite, t.slug), t.csv())?;
        }
        put(format!("{}.json", self.suite), serde_json::to_string_pretty(&self.json())? + "\n")?;
        for (slug, plot) in &self.plots {
            put(format!("{}_{slug}.svg", self.suite), plot.svg())?;
        }
        Ok(written)
    }
}

impl fmt::Display for SuiteOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "# kiln bench {}\n", self.suite)?;
        for (k, v) in &self.meta {
            writeln!(f, "{k}: {v}")?;
        }
        for t in &self.tables {
            writeln!(f)?;
            write!(f, "{t}")?;
        }
        if !self.notes.is_empty() {
            writeln!(f)?;
            for n in &self.notes {
                writeln!(f, "{n}")?;
            }
        }
        Ok(())
    }
}

/// A progress bar on stderr with `len` steps (drawn only when stderr is a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(what.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn significant_digits() {
        assert_eq!(sig(0.123456), "0.123");
        assert_eq!(sig(12.3456), "12.3");
        assert_eq!(sig(1234.4), "1234");
        assert_eq!(sig(0.0), "0");
        assert_eq!(sig(2.5e-7), "2.50e-7");
    }

    #[test]
    fn table_renders_csv_json_and_text() {
        let mut t = Table::new("t", "A table", &["name", "ms", "n"]);
        t.push(vec!["a,b".into(), 1.5.into(), 3usize.into()]);
        t.push(vec!["c".into()]);
        assert_eq!(t.csv(), "name,ms,n\n\"a,b\",1.5,3\nc,,\n");
        let j = t.json();
        assert_eq!(j["rows"][0]["ms"], json!(1.5));
        assert_eq!(j["rows"][1]["n"], Value::Null);
        let text = t.to_string();
        assert!(text.contains("| a,b  | 1.50 |   3 |"), "{text}");
    }
}
