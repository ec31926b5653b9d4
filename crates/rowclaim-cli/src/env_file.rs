//! The `.env` file of the current directory, read before the flags (so that DATABASE_URL and the
//! like may come from it). A line it cannot read is named by its number and its key, never its
//! value: the value may be a URL with a password.

use std::path::Path;

/// Loads `./.env` into the environment (the environment wins); a missing file is no error.
/// `Err` is the message to print.
pub fn load() -> Result<(), String> {
    let path = Path::new(".env");
    match dotenvy::from_path(path) {
        Ok(()) => Ok(()),
        Err(e) if e.not_found() => Ok(()),
        Err(dotenvy::Error::LineParse(entry, index)) => {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            Err(format!(
                ".env in the current directory: {}",
                line_error(&text, &entry, index)
            ))
        }
        Err(e) => Err(format!(".env in the current directory: {e}")),
    }
}

/// Where `entry` (as dotenvy gave it: a line, a value, or several lines of a quoted value)
/// fails at `index` (a byte position in it), said by line number, column and key.
fn line_error(text: &str, entry: &str, index: usize) -> String {
    let start = entry_start(text, entry.trim_end());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let first_line = text[..start].matches('\n').count() + 1;
    let line_text = text[line_start..].lines().next().unwrap_or_default();
    let key = line_text
        .split('=')
        .next()
        .unwrap_or_default()
        .trim()
        .trim_start_matches("export ")
        .trim();
    let key = if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        format!(" ({key}=…)")
    } else {
        String::new()
    };
    let unclosed = entry.trim_end().contains('\n')
        || (index >= entry.trim_end().len() && entry.contains(['"', '\'']));
    if unclosed {
        return format!(
            "line {first_line}{key}: a quote opened there is never closed; close it (the value \
             is not shown: it may hold a password)"
        );
    }
    let pos = (start + index).min(text.len());
    let column = text[line_start..pos].chars().count() + 1;
    format!(
        "line {first_line}{key}, column {column}: not KEY=VALUE; quote a value that holds \
         spaces, # or quotes (the value is not shown: it may hold a password)"
    )
}

/// Where `entry` is in `text`: its first occurrence outside a comment line (0 if none).
fn entry_start(text: &str, entry: &str) -> usize {
    text.match_indices(entry)
        .map(|(at, _)| at)
        .find(|&at| {
            let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
            !text[line_start..].trim_start().starts_with('#')
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::line_error;

    #[test]
    fn lines_are_numbered_and_values_not_shown() {
        let text = "A=1\n# note postgres://u:pw@h/d x y\nB=postgres://u:pw@h/d x y\n";
        let said = line_error(text, "postgres://u:pw@h/d x y", 20);
        assert!(said.starts_with("line 3 (B=…), column 23:"), "{said}");
        assert!(!said.contains("pw"), "{said}");
        let text = "A=1\nDATABASE_URL=\"postgres://u:pw@h/db\n";
        let said = line_error(text, "DATABASE_URL=\"postgres://u:pw@h/db\n", 35);
        assert!(
            said.starts_with("line 2 (DATABASE_URL=…): a quote"),
            "{said}"
        );
        assert!(!said.contains("pw"), "{said}");
    }
}
