//! The exit codes of `rowclaim`, written down once.
//!
//! [`TABLE`] is the only list: the top level's `--help` prints it ([`help_table`]), the README's
//! "Exit codes" section is the same table in Markdown (a test below compares the two, so that
//! changing one and not the other fails), and [`crate::error::CliError::exit_code`] says which error exits with
//! which. Scripts depend on these numbers: never renumber one, only add.

/// One exit code: its number, a short name, and what it means to whoever runs `rowclaim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    pub code: u8,
    pub name: &'static str,
    /// One sentence; `backticks` mark commands and flags (they are dropped in `--help`).
    pub meaning: &'static str,
}

impl From<Exit> for std::process::ExitCode {
    fn from(e: Exit) -> Self {
        std::process::ExitCode::from(e.code)
    }
}

pub const OK: Exit = Exit {
    code: 0,
    name: "ok",
    meaning: "success",
};

pub const NOTHING_CLAIMED: Exit = Exit {
    code: 1,
    name: "nothing claimed",
    meaning: "`claim`: nothing was claimable; `jobs show`: no such job; \
              `jobs retry/cancel/delete`: no job was changed (or a job given by id was not); \
              `queue pause/resume`: the queue was paused already, or not paused; \
              `schedule forget`: no such schedule",
};

pub const BAD_INPUT: Exit = Exit {
    code: 2,
    name: "bad input",
    meaning: "usage, an invalid identifier, a missing table or column, an id column that is not \
              unique, a missing privilege, rowclaim's own tables not set up (run `rowclaim \
              init`), a strategy the server or table cannot do, a zero lease or one over 7 days, \
              a port in use, a bad config file or a missing one named by `--config`",
};

pub const LEASE_LOST: Exit = Exit {
    code: 3,
    name: "lease lost",
    meaning: "the token no longer holds the rows; nothing was changed",
};

pub const FAILURE: Exit = Exit {
    code: 4,
    name: "failure",
    meaning: "a database error (an unreachable server is named: `cannot connect to PostgreSQL at \
              127.0.0.1:5432: Connection refused`), the `work` command could not be started, \
              `work --give-up-after` ran out, or a `bench` run failed its own check",
};

pub const INCOMPLETE: Exit = Exit {
    code: 5,
    name: "incomplete",
    meaning: "`work --until-empty` finished, but some rows it took ended failed or dead, or were \
              lost or given up and not finished since (rows given up during an outage that \
              another claim then finished are counted in the summary, not here)",
};

pub const OUTCOME_UNKNOWN: Exit = Exit {
    code: 6,
    name: "outcome unknown",
    meaning: "the connection broke while a commit was under way (`enqueue`, `complete`, …); \
              check before doing it again",
};

pub const CHECK_SLOW: Exit = Exit {
    code: 7,
    name: "slow",
    meaning: "`check` found something that makes claims slow (a claim without a fitting index, a \
              default isolation that makes claims fail and retry), and nothing worse",
};

pub const CHECK_UNSAFE: Exit = Exit {
    code: 8,
    name: "unsafe",
    meaning: "`check` found something that makes claims fail or lose exclusivity (a \
              statement-based binary log, a standby or read-only server, missing privileges, a \
              strategy the server or table cannot do, a mapping that differs from the recorded \
              one)",
};

pub const INTERRUPTED: Exit = Exit {
    code: 130,
    name: "interrupted",
    meaning: "`work` was stopped by a second signal: running commands were stopped and their \
              rows given back",
};

/// Every exit code, in order.
pub const TABLE: [Exit; 10] = [
    OK,
    NOTHING_CLAIMED,
    BAD_INPUT,
    LEASE_LOST,
    FAILURE,
    INCOMPLETE,
    OUTCOME_UNKNOWN,
    CHECK_SLOW,
    CHECK_UNSAFE,
    INTERRUPTED,
];

/// Help lines are wrapped here (clap's own limit is 100 columns).
const HELP_WIDTH: usize = 96;

/// `Exit codes:` and one entry per code, `  2    bad input: usage, …`, wrapped under its text.
pub fn help_table() -> String {
    let mut out = String::from("Exit codes:\n");
    for e in TABLE {
        let text = format!("{}: {}", e.name, e.meaning.replace('`', ""));
        let lead = format!("  {:<5}", e.code);
        let mut line = lead.clone();
        for word in text.split(' ') {
            if line.len() > lead.len() && line.len() + 1 + word.len() > HELP_WIDTH {
                out.push_str(line.trim_end());
                out.push('\n');
                line = " ".repeat(lead.len());
            } else if line.len() > lead.len() {
                line.push(' ');
            }
            line.push_str(word);
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The README's "Exit codes" table: the same entries in Markdown.
#[cfg(test)]
fn readme_table() -> String {
    let mut out = String::from("| code | name | meaning |\n|---|---|---|\n");
    for e in TABLE {
        out.push_str(&format!("| {} | {} | {} |\n", e.code, e.name, e.meaning));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The README's section, from its heading to the next one, holds exactly [`readme_table`]
    /// (and nothing else but blank lines). Fix the README or [`TABLE`], whichever is wrong.
    #[test]
    fn readme_lists_the_same_exit_codes() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
        let readme = std::fs::read_to_string(path).expect("README.md at the workspace root");
        let start = readme
            .find("\n## Exit codes\n")
            .expect("the README has a section \"## Exit codes\"");
        let section = &readme[start + "\n## Exit codes\n".len()..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        assert_eq!(
            section.trim(),
            readme_table().trim(),
            "README.md's exit codes differ from src/exit.rs's TABLE"
        );
    }

    #[test]
    fn codes_are_distinct_and_in_order() {
        let codes: Vec<u8> = TABLE.iter().map(|e| e.code).collect();
        let mut sorted = codes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(codes, sorted);
    }

    /// The top level's `--help` lists every code, within the width; a command's `-h` and
    /// `--help` do not repeat the table, but say where it is.
    #[test]
    fn help_names_every_code_within_the_width() {
        let help = crate::cmd::help::command().render_long_help().to_string();
        for e in TABLE {
            assert!(
                help.contains(&format!("\n  {:<5}{}:", e.code, e.name)),
                "{help}"
            );
        }
        let table = help_table();
        assert!(table.lines().all(|l| l.len() <= HELP_WIDTH + 4), "{table}");
        assert!(!table.contains('`'), "{table}");
        let short = crate::cmd::help::command().render_help().to_string();
        assert!(!short.contains("130  interrupted"), "{short}");
        let mut cmd = crate::cmd::help::command();
        for name in ["work", "claim", "complete", "jobs"] {
            let sub = cmd.find_subcommand_mut(name).expect("a command");
            for help in [sub.render_help(), sub.render_long_help()] {
                let help = help.to_string();
                assert!(!help.contains("130  interrupted"), "{name}: {help}");
                assert!(help.contains("Examples:"), "{name}: {help}");
                assert!(help.contains("rowclaim --help"), "{name}: {help}");
            }
        }
    }
}
