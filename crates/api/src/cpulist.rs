//! CPU lists: `"0-3"`, `"2-14:2"` (first-last:stride, like Hyper-V's BaseProcessorNumber /
//! MaxProcessorNumber), `"1,3"`, and any comma-separated mix of them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Largest CPU number accepted (a sanity bound, not a limit of any machine we run on).
pub const MAX_CPU: usize = 4095;

/// A sorted, de-duplicated, non-empty set of CPU numbers. In TOML and JSON it is its string
/// form (`"0-3,6"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CpuList(Vec<usize>);

/// Why a CPU list did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuListError {
    #[error("empty CPU list")]
    Empty,
    #[error("bad CPU list item '{0}': expected N, N-M or N-M:S")]
    Syntax(String),
    #[error("bad CPU range '{0}': the first CPU is above the last")]
    Reversed(String),
    #[error("bad CPU range '{0}': the stride must be at least 1")]
    ZeroStride(String),
    #[error("CPU {0} is above the largest supported CPU number {MAX_CPU}")]
    TooLarge(usize),
}

impl CpuList {
    /// The CPUs, ascending.
    pub fn cpus(&self) -> &[usize] {
        &self.0
    }

    /// The list of one CPU (at most [`MAX_CPU`]).
    pub fn single(cpu: usize) -> CpuList {
        CpuList(vec![cpu.min(MAX_CPU)])
    }

    /// Builds a list from CPU numbers (sorted and de-duplicated); `None` when empty.
    pub fn from_cpus(cpus: impl IntoIterator<Item = usize>) -> Option<CpuList> {
        let mut v: Vec<usize> = cpus.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        (!v.is_empty()).then_some(CpuList(v))
    }
}

fn number(s: &str, item: &str) -> Result<usize, CpuListError> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpuListError::Syntax(item.to_string()));
    }
    let n: usize = s
        .parse()
        .map_err(|_| CpuListError::Syntax(item.to_string()))?;
    if n > MAX_CPU {
        return Err(CpuListError::TooLarge(n));
    }
    Ok(n)
}

impl FromStr for CpuList {
    type Err = CpuListError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().is_empty() {
            return Err(CpuListError::Empty);
        }
        let mut cpus = Vec::new();
        for item in s.split(',') {
            let item = item.trim();
            let (range, stride) = match item.split_once(':') {
                Some((r, st)) => (r, number(st, item)?),
                None => (item, 1),
            };
            let (first, last) = match range.split_once('-') {
                Some((a, b)) => (number(a, item)?, number(b, item)?),
                None if stride == 1 && !item.contains(':') => {
                    let n = number(range, item)?;
                    (n, n)
                }
                None => return Err(CpuListError::Syntax(item.to_string())),
            };
            if stride == 0 {
                return Err(CpuListError::ZeroStride(item.to_string()));
            }
            if first > last {
                return Err(CpuListError::Reversed(item.to_string()));
            }
            cpus.extend((first..=last).step_by(stride));
        }
        CpuList::from_cpus(cpus).ok_or(CpuListError::Empty)
    }
}

impl TryFrom<String> for CpuList {
    type Error = CpuListError;
    fn try_from(s: String) -> Result<Self, CpuListError> {
        s.parse()
    }
}

impl From<CpuList> for String {
    fn from(l: CpuList) -> String {
        l.to_string()
    }
}

impl fmt::Display for CpuList {
    /// Compact form: runs of consecutive CPUs as ranges, e.g. `0-3,6`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        let mut first = true;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end = self.0[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Vec<usize>, CpuListError> {
        s.parse::<CpuList>().map(|l| l.cpus().to_vec())
    }

    #[test]
    fn forms() {
        assert_eq!(parse("0-3").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(parse("2-14:2").unwrap(), vec![2, 4, 6, 8, 10, 12, 14]);
        assert_eq!(parse("1,3").unwrap(), vec![1, 3]);
        assert_eq!(parse("5").unwrap(), vec![5]);
        assert_eq!(parse(" 3 , 1-2 ,2").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse("0-7:3").unwrap(), vec![0, 3, 6]);
    }

    #[test]
    fn errors() {
        assert_eq!(parse(""), Err(CpuListError::Empty));
        assert!(matches!(parse("a-b"), Err(CpuListError::Syntax(_))));
        assert!(matches!(parse("1-"), Err(CpuListError::Syntax(_))));
        assert!(matches!(parse("1,,2"), Err(CpuListError::Syntax(_))));
        assert!(matches!(parse("-1"), Err(CpuListError::Syntax(_))));
        assert!(matches!(parse("3:2"), Err(CpuListError::Syntax(_))));
        assert_eq!(parse("3-1"), Err(CpuListError::Reversed("3-1".into())));
        assert_eq!(
            parse("0-3:0"),
            Err(CpuListError::ZeroStride("0-3:0".into()))
        );
        assert_eq!(parse("99999"), Err(CpuListError::TooLarge(99999)));
    }

    #[test]
    fn display_round_trips() {
        for s in ["0-3,6", "1,3", "0", "2,4,6-8"] {
            assert_eq!(s.parse::<CpuList>().unwrap().to_string(), s);
        }
    }
}
