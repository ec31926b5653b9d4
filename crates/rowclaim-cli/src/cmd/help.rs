//! What `--help` shows besides the flags: examples under the top level and the main commands,
//! the exit codes under the top level's `--help` only (not under every command's `-h`), and the
//! flags of a table's claim order and filter hidden where nothing is claimed.

use clap::CommandFactory;

use super::Cli;
use crate::exit;

/// The command line with its help text as shown: [`Cli`] plus examples and the exit codes.
pub fn command() -> clap::Command {
    let top = Cli::command()
        .after_help(format!("{TOP}\n\n{SEE_EXITS}\n{DATABASE}"))
        .after_long_help(format!("{TOP}\n\n{}\n{DATABASE}", exit::help_table()));
    let top = EXAMPLES.iter().fold(top, |top, (name, examples)| {
        top.mut_subcommand(*name, |c| {
            c.after_help(format!("Examples:\n{examples}\n\n{SEE_EXITS}"))
        })
    });
    // Settling by token takes the rows the token holds: which rows a claim would pick (its
    // order and filter) does not apply. Hidden, and refused if given (see `settle.rs`).
    ["complete", "fail", "release", "extend"]
        .into_iter()
        .fold(top, |top, name| {
            top.mut_subcommand(name, |c| {
                c.mut_arg("order_by", |a| a.hide(true))
                    .mut_arg("filter", |a| a.hide(true))
            })
        })
}

const SEE_EXITS: &str = "Exit codes: see `rowclaim --help`.";

const DATABASE: &str = "The database comes from --database, else $DATABASE_URL (also read from \
                        ./.env), else sqlite://rowclaim.db here.";

const TOP: &str = "\
Examples:
  rowclaim demo                                        # see it work, no server needed
  export DATABASE_URL=postgres://app@localhost/app
  rowclaim work --table emails --owner-column owner --lease-column lease_until -- ./send.sh
  rowclaim init && rowclaim enqueue --queue mail '{\"to\":\"ada@example.com\"}'
  rowclaim work --queue mail --concurrency 8 -- ./send-email.sh
  rowclaim stats                                       # jobs per queue and status
  rowclaim COMMAND -h                                  # a command's flags and examples";

/// Each main command's examples (its `after_help`).
const EXAMPLES: &[(&str, &str)] = &[
    (
        "work",
        "  rowclaim work --table emails --owner-column owner --lease-column lease_until -- ./send.sh
  rowclaim work --queue mail --concurrency 8 --timeout 5m -- ./send-email.sh
  rowclaim work --queue mail --until-empty --json -- sh -c 'jq .to'",
    ),
    (
        "claim",
        "  rowclaim claim --table emails --owner-column owner --lease-column lease_until --batch 10
  rowclaim claim --queue mail --lease 5m",
    ),
    (
        "complete",
        "  rowclaim complete --table emails --owner-column owner --token TOKEN
  rowclaim complete --table emails --owner-column owner --token TOKEN --id 3,4",
    ),
    (
        "fail",
        "  rowclaim fail --table emails --owner-column owner --token TOKEN --id 7",
    ),
    (
        "release",
        "  rowclaim release --table emails --owner-column owner --token TOKEN",
    ),
    (
        "extend",
        "  rowclaim extend --table emails --owner-column owner --lease-column lease_until \\
      --token TOKEN --lease 10m",
    ),
    (
        "stats",
        "  rowclaim stats                                       # the managed queue
  rowclaim stats --table emails --owner-column owner --lease-column lease_until",
    ),
    (
        "check",
        "  rowclaim check --table emails --owner-column owner --lease-column lease_until
  rowclaim check --queue mail",
    ),
    ("init", "  rowclaim init"),
    (
        "workers",
        "  rowclaim workers
  rowclaim workers --state gone --json",
    ),
    (
        "enqueue",
        "  rowclaim enqueue --queue mail '{\"to\":\"ada@example.com\"}'
  rowclaim enqueue --queue mail --delay 5m --unique-key welcome:ada '{\"to\":\"ada@example.com\"}'
  rowclaim enqueue --queue mail < jobs.jsonl           # one payload per line; prints each id
  rowclaim enqueue --kind receipt --after 41,42 '{}'    # runs once jobs 41 and 42 completed",
    ),
    (
        "jobs",
        "  rowclaim jobs list --queue mail --status dead
  rowclaim jobs show 42
  rowclaim jobs retry 42
  rowclaim jobs retry --queue mail --status dead      # every dead job of mail
  rowclaim jobs delete --search test --older-than 1d
  rowclaim jobs prune --older-than 7d",
    ),
    (
        "queue",
        "  rowclaim queue pause mail
  rowclaim queue resume mail
  rowclaim queue limit mail --concurrency 10 --rate 100/1m
  rowclaim queue list",
    ),
    (
        "schedule",
        "  rowclaim schedule run                                # the schedules of ./rowclaim.toml
  rowclaim schedule list
  rowclaim schedule forget nightly-report",
    ),
    (
        "source",
        "  rowclaim source list
  rowclaim source replace --table emails --owner-column owner --lease-column lease_until
  rowclaim source forget emails",
    ),
    (
        "dashboard",
        "  rowclaim dashboard
  rowclaim dashboard --listen 127.0.0.1:9000 --read-only",
    ),
    (
        "demo",
        "  rowclaim demo
  rowclaim demo --workers 8 --strategy optimistic --keep demo.db",
    ),
    (
        "completions",
        "  mkdir -p ~/.local/share/bash-completion/completions
  rowclaim completions bash > ~/.local/share/bash-completion/completions/rowclaim",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Every example line that runs rowclaim parses as written (comments, redirections and
    /// `&& …` cut off; single quotes kept together).
    #[test]
    fn examples_parse() {
        let cmd = command();
        cmd.clone().debug_assert();
        let texts = EXAMPLES.iter().map(|(_, e)| *e).chain([TOP]);
        let joined: Vec<String> = texts.map(|t| t.replace("\\\n", " ")).collect();
        for line in joined.iter().flat_map(|t| t.lines()) {
            let line = line.trim();
            let line = line.split(" #").next().unwrap_or_default();
            let line = line.split(" <").next().unwrap_or_default();
            let line = line.split(" && ").next().unwrap_or_default();
            let line = line.split(" > ").next().unwrap_or_default();
            if !line.starts_with("rowclaim ") || line.contains("COMMAND") {
                continue;
            }
            let words = split(line);
            let parsed = cmd.clone().try_get_matches_from(&words);
            assert!(parsed.is_ok(), "{line}: {}", parsed.unwrap_err());
        }
    }

    fn split(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut quoted = false;
        for c in line.chars() {
            match c {
                '\'' => quoted = !quoted,
                ' ' if !quoted => {
                    if !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                }
                c => word.push(c),
            }
        }
        if !word.is_empty() {
            words.push(word);
        }
        words
    }
}
