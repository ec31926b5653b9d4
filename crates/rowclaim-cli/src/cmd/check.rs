//! `rowclaim check`: what claims on a source would meet on the live database (the library's
//! `Db::check`), for a person or, with `--json`, a script; the exit code says whether anything
//! makes claims slow (7) or unsafe (8).

use clap::Args;
use rowclaim::{CheckReport, Db, Severity};

use super::source_args::{SourceArgs, Target};
use crate::error::CliError;
use crate::exit;

#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// Print the report as one JSON object: table, database, server, asked, strategy, auto,
    /// auto_reason, worst, and findings [{name, severity, message, fix}].
    #[arg(long)]
    json: bool,
}

/// Report lines are wrapped here; a fix is printed whole, so that it can be copied.
const WIDTH: usize = 100;

pub async fn run(url: &str, a: CheckArgs) -> Result<(), CliError> {
    let target = a.source.target()?;
    let db = Db::connect(url).await?;
    let report = match target {
        Target::Table(source) => db.check(*source, a.source.strategy).await?,
        Target::Queues(queues) => db.queue().check(&queues).await?,
    };
    if a.json {
        let mut value = serde_json::to_value(&report)
            .map_err(|e| CliError::io("writing the report")(e.into()))?;
        if let Some(fields) = value.as_object_mut() {
            fields.insert("worst".into(), serde_json::json!(report.worst()));
        }
        let text = serde_json::to_string_pretty(&value)
            .map_err(|e| CliError::io("writing the report")(e.into()))?;
        println!("{text}");
    } else {
        print!("{}", human(&report));
    }
    verdict(&report)
}

/// The report as a person reads it: one block per finding, the worst marked in capitals.
fn human(r: &CheckReport) -> String {
    let mut out = format!(
        "{} on {} ({}), strategy {}\n\n",
        r.table, r.server, r.database, r.strategy
    );
    let name_width = r
        .findings
        .iter()
        .map(|f| f.topic.name().len())
        .max()
        .unwrap_or(0);
    for f in &r.findings {
        let tag = match f.severity {
            Severity::Warning => "WARNING".to_owned(),
            Severity::Error => "ERROR".to_owned(),
            other => other.to_string(),
        };
        let lead = format!("  {tag:<8} {:<name_width$}  ", f.topic.name());
        out.push_str(&wrap(&lead, &f.message));
        if let Some(fix) = &f.fix {
            out.push_str(&format!("{}fix: {fix}\n", " ".repeat(lead.len())));
        }
    }
    out.push('\n');
    out.push_str(&summary(r));
    out.push('\n');
    out
}

/// `text` after `lead`, wrapped at [`WIDTH`] under its first column.
fn wrap(lead: &str, text: &str) -> String {
    let indent = " ".repeat(lead.len());
    let mut out = String::new();
    let mut line = lead.to_owned();
    for word in text.split(' ') {
        if line.len() > indent.len() && line.len() + 1 + word.len() > WIDTH {
            out.push_str(line.trim_end());
            out.push('\n');
            line = indent.clone();
        } else if line.len() > indent.len() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// `1 error, 2 warnings: …` or `nothing found that makes claims slow or unsafe`.
fn summary(r: &CheckReport) -> String {
    let count = |s: Severity, one: &str, many: &str| match r.count(s) {
        0 => None,
        1 => Some(format!("1 {one}")),
        n => Some(format!("{n} {many}")),
    };
    let counts: Vec<String> = [
        count(Severity::Error, "error", "errors"),
        count(Severity::Warning, "warning", "warnings"),
        count(Severity::Advice, "piece of advice", "pieces of advice"),
    ]
    .into_iter()
    .flatten()
    .collect();
    match r.worst() {
        Severity::Error => format!(
            "{}: claims would fail or could lose exclusivity",
            counts.join(", ")
        ),
        Severity::Warning => format!("{}: claims would be slow", counts.join(", ")),
        Severity::Advice => format!(
            "{}; nothing that makes claims slow or unsafe",
            counts.join(", ")
        ),
        _ => "nothing that makes claims slow or unsafe".to_owned(),
    }
}

/// The exit: 0 unless a finding makes claims slow (7) or unsafe (8).
fn verdict(r: &CheckReport) -> Result<(), CliError> {
    let exit = match r.worst() {
        Severity::Error => exit::CHECK_UNSAFE,
        Severity::Warning => exit::CHECK_SLOW,
        _ => return Ok(()),
    };
    let mut what: Vec<&str> = r
        .findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .map(|f| f.topic.name())
        .collect();
    what.dedup();
    Err(CliError::CheckFound {
        exit,
        summary: format!("check found {} ({})", summary(r), what.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_messages_wrap_under_their_column() {
        let text = "word ".repeat(40);
        let out = super::wrap("  ok  x  ", text.trim());
        assert!(out.lines().count() > 1, "{out}");
        assert!(out.lines().all(|l| l.len() <= super::WIDTH), "{out}");
        assert!(
            out.lines().skip(1).all(|l| l.starts_with("         word")),
            "{out}"
        );
    }
}
