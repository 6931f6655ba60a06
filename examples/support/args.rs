//! The examples' command lines: `--help` prints the usage and exits 0; an unknown argument, a
//! flag without its value or a value that does not parse prints the usage and exits 2.

#![allow(dead_code)]

use std::collections::HashMap;
use std::str::FromStr;

/// A parsed command line.
pub(crate) struct Args {
    usage: &'static str,
    values: HashMap<&'static str, String>,
    switches: Vec<&'static str>,
    positional: Vec<String>,
}

/// Parses this process's arguments: `valued` flags take the next argument as their value,
/// `switches` stand alone, and at most `max_positional` other arguments are allowed.
pub(crate) fn parse(
    usage: &'static str,
    valued: &[&'static str],
    switches: &[&'static str],
    max_positional: usize,
) -> Args {
    let mut a = Args {
        usage,
        values: HashMap::new(),
        switches: Vec::new(),
        positional: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            println!("{usage}");
            std::process::exit(0);
        }
        if let Some(&flag) = valued.iter().find(|&&f| f == arg) {
            match it.next() {
                Some(v) => {
                    a.values.insert(flag, v);
                }
                None => a.fail(&format!("{flag} needs a value")),
            }
        } else if let Some(&flag) = switches.iter().find(|&&f| f == arg) {
            a.switches.push(flag);
        } else if !arg.starts_with('-') && a.positional.len() < max_positional {
            a.positional.push(arg);
        } else {
            a.fail(&format!("unknown argument {arg:?}"));
        }
    }
    a
}

impl Args {
    /// Prints `msg` and the usage, and exits 2.
    pub(crate) fn fail(&self, msg: &str) -> ! {
        eprintln!("{msg}\n\n{}", self.usage);
        std::process::exit(2)
    }

    /// The value of a valued flag.
    pub(crate) fn get(&self, flag: &str) -> Option<&str> {
        self.values.get(flag).map(String::as_str)
    }

    /// The value of a valued flag, parsed, or `default` when absent.
    pub(crate) fn num<T: FromStr>(&self, flag: &str, default: T) -> T {
        match self.get(flag) {
            None => default,
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| self.fail(&format!("{flag}: {v:?} is not a valid value"))),
        }
    }

    /// True if the switch was given.
    pub(crate) fn has(&self, switch: &str) -> bool {
        self.switches.contains(&switch)
    }

    /// The `i`th positional argument, parsed, or `default` when absent.
    pub(crate) fn pos<T: FromStr>(&self, i: usize, default: T) -> T {
        match self.positional.get(i) {
            None => default,
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| self.fail(&format!("{v:?} is not a valid value"))),
        }
    }

    /// The `i`th positional argument as given.
    pub(crate) fn pos_str(&self, i: usize) -> Option<&str> {
        self.positional.get(i).map(String::as_str)
    }
}
