//! The library's layers, checked from its source (DESIGN.md, "Shape of the code: layers"):
//!
//! (a) no import cycle among the library's modules;
//! (b) no module imports from a layer above its own;
//! (c) nothing below the managed queue names the queue in code.
//!
//! The source files under `src/` are read as text: comments, doc comments and string literals
//! are skipped, `use` trees (nested braces too) and paths in code (`crate::…`, `super::…`,
//! `self::…`, a child module's name, a module imported by `use`) are followed to the module file
//! that holds what they name. A failure lists every violation at once, sorted: a to-do list.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::Path;

/// THE LAYERS, bottom to top: keep this table true when files move. A module may import from
/// its own layer and from any layer below it; the layers below [`QUEUE_LAYER`] may not even name
/// the queue.
///
/// Each entry is a module path from the crate root (`backend`, or `backend::sql` for a finer
/// rule) and covers that module and everything under it: `backend` is `src/backend.rs` or
/// `src/backend/mod.rs` and every file below `src/backend/`. The longest entry that matches
/// decides. An entry that names no file (yet) is skipped; a module file that no entry covers
/// is an error, so that a new module gets its layer here. `lib.rs` is in no layer: it is the
/// crate's face, and its `pub use` lists only say where each public name lives.
const LAYERS: &[Layer] = &[
    // 1. Plain values: row ids and bound values, a source's mapping, errors and their kinds,
    //    the strategies and locking modes, what reports hold (row counts, findings), how long
    //    to wait after a failure.
    Layer {
        name: "values",
        modules: &[
            "value", "id", "mapping", "error", "strategy", "locking", "report", "wait", "redact",
            "shape",
        ],
    },
    // 2. Drivers: one module per database, the SQL of each strategy for that dialect.
    Layer {
        name: "drivers",
        modules: &["backend"],
    },
    // 3. The claim core: claims rows of a Source with a Strategy; knows no queue.
    Layer {
        name: "claim core",
        modules: &["claim", "source", "registry", "db", "check", "journal"],
    },
    // 4. The managed queue: jobs, enqueue, limits, schedules, pause, over the claim core.
    Layer {
        name: "managed queue",
        modules: &["queue"],
    },
    // 5. The worker runtime: claim loop, dispatch, supervision, shutdown, settling; and the
    //    metrics a worker records.
    Layer {
        name: "runtime",
        modules: &["worker", "metrics"],
    },
];

/// The layer of the managed queue: no layer below it names the queue (an identifier or path
/// segment containing `queue`, in any case), though comments and strings may.
const QUEUE_LAYER: &str = "managed queue";

/// One layer: its name and the modules it covers.
struct Layer {
    name: &'static str,
    modules: &'static [&'static str],
}

// ------------------------------------------------------------------------------- the tests

/// The library as it is must keep its layers (CI's own step runs this: `cargo test -p rowclaim
/// --test layers`, in .ci/run).
#[test]
fn the_library_keeps_its_layers() {
    let report = check(&library_sources(), LAYERS, QUEUE_LAYER);
    for note in &report.notes {
        eprintln!("note: {note}");
    }
    assert!(report.is_clean(), "\n{report}");
}

/// The checker reads every file of the real library (delimiters balance once comments and
/// literals are skipped) and finds its modules and imports: a checker blind to the real code
/// would pass it whatever it holds. Runs while the check above is ignored, too.
#[test]
fn the_checker_reads_the_library() {
    let sources = library_sources();
    let report = check(&sources, LAYERS, QUEUE_LAYER);
    assert!(
        report.unreadable.is_empty(),
        "files the checker cannot read:\n{}",
        report.unreadable.join("\n")
    );
    assert!(
        report.modules > 10 && report.imports > 50,
        "the checker found only {} modules and {} imports between them in {} files",
        report.modules,
        report.imports,
        sources.len()
    );
}

/// The checker itself, on a little crate that breaks each rule (with comments, doc comments,
/// strings, raw strings, char literals and lifetimes that must not count), and then on the same
/// crate mended, which must pass.
#[test]
fn the_checker_catches_each_rule() {
    const FAKE_LAYERS: &[Layer] = &[
        Layer {
            name: "low",
            modules: &["low", "later"],
        },
        Layer {
            name: "mid",
            modules: &["mid"],
        },
        Layer {
            name: "top",
            modules: &["queue"],
        },
    ];
    let mut files: BTreeMap<String, String> = [
        (
            "lib.rs",
            "mod low;\nmod mid;\nmod queue;\nmod stray;\n\
             pub use low::Plain;\npub use queue::{Job, inner::Deep};\n",
        ),
        (
            "low.rs",
            r##"//! Docs may say crate::queue::Job and crate::mid::run.
use crate::{Job, Plain};
// use crate::mid::Commented;
/* a /* nested */ crate::mid::Blocked */
pub struct Plain;
pub fn thing<'a>(s: &'a str) -> (char, char, &'a str) {
    let _ = r#"crate::mid::Raw "queue" "#;
    ('{', '"', "crate::mid::Quoted \" queue")
}
pub fn count(queued_jobs: usize) -> usize { queued_jobs }
"##,
        ),
        (
            // A parent may use its child, and (mid/child.rs) a child its parent.
            "mid/mod.rs",
            "mod child;\nmod other;\n\
             use crate::low::{thing, nested::{Deep as _}};\n\
             pub fn run(store: &QueueStore) -> u32 { crate::queue::go(); child::back(); LIMITED }\n",
        ),
        (
            "mid/child.rs",
            "use super::*;\n\
             pub fn back() { super::super::low::thing(\"x\"); }\n\
             pub fn next() { super::other::x(); }\n",
        ),
        (
            "mid/other.rs",
            "use super::child::{self, back};\n\
             pub fn x() { back(); child::next(); }\n",
        ),
        (
            "queue.rs",
            "pub struct Job;\n\
             pub fn go() { crate::mid::child::back(); }\n",
        ),
        ("stray.rs", "pub fn alone() {}\n"),
    ]
    .into_iter()
    .map(|(p, t)| (p.to_owned(), t.to_owned()))
    .collect();

    let report = check(&files, FAKE_LAYERS, "top");
    assert_eq!(
        report.cycles,
        ["low -> queue -> mid::child -> low: 4 modules in one cycle \
          (low, mid::child, mid::other, queue); \
          what is left of it without its imports from a higher layer (b):\n    \
          mid::child -> mid::other -> mid::child: 2 modules, tied by:\n      \
          src/mid/child.rs:3: super::other::x  [mid::child -> mid::other]\n      \
          src/mid/other.rs:1: use super::child::{self, back}  [mid::other -> mid::child]\n      \
          src/mid/other.rs:2: child::next  [mid::other -> mid::child]"],
        "\n{report}"
    );
    assert_eq!(
        report.upward,
        [
            "src/low.rs:2: use crate::Job  [layer 1 low imports layer 3 top: queue]",
            "src/mid/mod.rs:4: crate::queue::go  [layer 2 mid imports layer 3 top: queue]",
        ],
        "\n{report}"
    );
    assert_eq!(
        report.queue_names,
        [
            "src/low.rs:10: queued_jobs",
            "src/mid/mod.rs:4: QueueStore, queue",
        ],
        "\n{report}"
    );
    assert_eq!(
        report.no_layer,
        ["src/stray.rs (module stray) is in no layer: add it to LAYERS"],
        "\n{report}"
    );
    assert!(report.unreadable.is_empty(), "\n{report}");
    assert_eq!(
        report.notes,
        ["LAYERS names `later`, which has no file (yet): skipped"]
    );
    let text = report.to_string();
    for part in [
        "(a) 1 import cycle",
        "(b) 2 imports from a higher layer",
        "(c) 2 lines naming the queue below the top layer",
        "1 module in no layer",
    ] {
        assert!(text.contains(part), "{part:?} missing from:\n{text}");
    }

    // Mended: no upward import, no queue named below it, no loop, every module in a layer.
    let mut mend = |file: &str, from: &str, to: &str| {
        let text = files.get_mut(file).expect("a file of the fake crate");
        assert!(text.contains(from), "{file} has no {from:?}");
        *text = text.replace(from, to);
    };
    mend("low.rs", "use crate::{Job, Plain};", "use crate::Plain;");
    mend("low.rs", "queued_jobs", "waiting");
    mend("mid/mod.rs", "&QueueStore", "&Store");
    mend("mid/mod.rs", "crate::queue::go();", "");
    mend("mid/child.rs", "super::other::x();", "");
    files.remove("stray.rs");
    let report = check(&files, FAKE_LAYERS, "top");
    assert!(report.is_clean(), "\n{report}");
    assert_eq!((report.modules, report.imports), (5, 5), "\n{report}");
}

/// What the lexer keeps: identifiers, lifetimes, `::` and punctuation; never what is inside a
/// comment or a literal.
#[test]
fn the_lexer_skips_comments_and_literals() {
    let text = r###"a /* b /* c */ d */ e // f
        "g \" h" r#"i "j" "# br"k" b'l' '\'' '\u{1F600}' 'm' 'n: loop {} $crate::o r#p"###;
    let tokens: Vec<String> = lex(text)
        .expect("lexes")
        .into_iter()
        .map(|t| match t.tok {
            Tok::Ident(s) => s,
            Tok::Lifetime(s) => format!("'{s}"),
            Tok::PathSep => "::".to_owned(),
            Tok::Punct(c) => c.to_string(),
        })
        .collect();
    assert_eq!(
        tokens,
        ["a", "e", "'n", ":", "loop", "{", "}", "crate", "::", "o", "p"]
    );
    // Lines are counted inside comments and literals too (a string continued with `\`).
    let lines: Vec<(String, usize)> = lex("a\n/* \n */ \"x\\\ny\" r\"\n\" '\\n'\nb")
        .expect("lexes")
        .into_iter()
        .map(|t| (format!("{:?}", t.tok), t.line))
        .collect();
    assert_eq!(
        lines,
        [
            ("Ident(\"a\")".to_owned(), 1),
            ("Ident(\"b\")".to_owned(), 6)
        ]
    );
    assert!(lex("fn f() { ( }").is_err(), "unbalanced delimiters");
    assert!(lex("\"open").is_err(), "unterminated string");
}

// ----------------------------------------------------------------------------- the sources

/// Every `.rs` file under the library's `src/`, by its path there (`backend/sql.rs`).
fn library_sources() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&src).expect("under src");
                let rel = rel.to_string_lossy().replace('\\', "/");
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                files.insert(rel, text);
            }
        }
    }
    files
}

/// A module's path from the crate root: `["backend", "sql"]`; the root (`lib.rs`) is empty.
type Module = Vec<String>;

/// The module a file under `src/` is: `foo.rs` and `foo/mod.rs` are both `foo`.
fn module_of_file(rel: &str) -> Module {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_owned)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod")) {
        parts.pop();
    }
    if parts == ["lib"] || parts == ["main"] {
        parts.clear();
    }
    parts
}

fn shown(m: &[String]) -> String {
    if m.is_empty() {
        "the crate root".to_owned()
    } else {
        m.join("::")
    }
}

// ------------------------------------------------------------------------------ the check

/// What the check found; each list sorted.
#[derive(Debug, Default)]
struct Report {
    /// (a) one entry per group of modules tied in a loop: a shortest loop through it, its
    /// members, and the imports that tie what is left of it without (b)'s.
    cycles: Vec<String>,
    /// (b) imports from a higher layer, with where they are.
    upward: Vec<String>,
    /// (c) the lines that name the queue below its layer, with the names.
    queue_names: Vec<String>,
    /// Module files that no entry of the layer table covers.
    no_layer: Vec<String>,
    /// Files that could not be read as Rust (unbalanced delimiters once comments and literals
    /// are skipped): the check cannot vouch for them.
    unreadable: Vec<String>,
    /// The name of the layer below which nothing names the queue.
    queue_layer: String,
    /// Not failures: layer entries that name no file yet.
    notes: Vec<String>,
    /// How many modules and distinct module-to-module imports were seen.
    modules: usize,
    imports: usize,
}

impl Report {
    fn is_clean(&self) -> bool {
        self.cycles.is_empty()
            && self.upward.is_empty()
            && self.queue_names.is_empty()
            && self.no_layer.is_empty()
            && self.unreadable.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let sections = [
            (
                plural(
                    self.unreadable.len(),
                    "file the checker cannot read",
                    "files the checker cannot read",
                ),
                &self.unreadable,
            ),
            (
                plural(
                    self.no_layer.len(),
                    "module in no layer",
                    "modules in no layer",
                ),
                &self.no_layer,
            ),
            (
                format!(
                    "(a) {} among the library's modules",
                    plural(self.cycles.len(), "import cycle", "import cycles")
                ),
                &self.cycles,
            ),
            (
                format!(
                    "(b) {} (a module may use its own layer and those below it)",
                    plural(
                        self.upward.len(),
                        "import from a higher layer",
                        "imports from a higher layer"
                    )
                ),
                &self.upward,
            ),
            (
                format!(
                    "(c) {} below the {} layer (in code, not comments or strings)",
                    plural(
                        self.queue_names.len(),
                        "line naming the queue",
                        "lines naming the queue"
                    ),
                    self.queue_layer
                ),
                &self.queue_names,
            ),
        ];
        writeln!(
            f,
            "the library's layers (tests/layers.rs; the table is LAYERS at its top):"
        )?;
        for (title, lines) in sections {
            if lines.is_empty() {
                continue;
            }
            writeln!(f, "\n{title}:")?;
            for line in lines {
                writeln!(f, "  {line}")?;
            }
        }
        Ok(())
    }
}

/// One place a module refers to another.
#[derive(Clone, Debug)]
struct Import {
    from: Module,
    to: Module,
    file: String,
    line: usize,
    /// The path as the code has it (a `use` tree's leaf spelled out whole).
    written: String,
}

/// Checks `sources` (path under `src/` → text) against `layers`.
fn check(sources: &BTreeMap<String, String>, layers: &[Layer], queue_layer: &str) -> Report {
    let mut report = Report {
        queue_layer: queue_layer.to_owned(),
        ..Report::default()
    };
    let mut files = Vec::new();
    for (rel, text) in sources {
        match lex(text) {
            Ok(tokens) => files.push((rel.as_str(), module_of_file(rel), tokens)),
            Err(why) => report.unreadable.push(format!("src/{rel}: {why}")),
        }
    }
    let mut crate_ = Crate {
        modules: files.iter().map(|(_, m, _)| m.clone()).collect(),
        root_names: BTreeMap::new(),
    };
    crate_.modules.insert(Module::new());
    // Where each name that lib.rs hands on lives (`pub use queue::{Job, …}`), so that
    // `crate::Job` counts as an import of the queue, not of the crate's face.
    if let Some((_, _, tokens)) = files.iter().find(|(_, m, _)| m.is_empty()) {
        crate_.root_names = crate_.root_names(tokens);
    }
    report.modules = crate_.modules.len() - 1;

    let queue_at = layers
        .iter()
        .position(|l| l.name == queue_layer)
        .expect("the queue layer is in the table");
    for layer in layers {
        for entry in layer.modules {
            let path: Module = entry.split("::").map(str::to_owned).collect();
            if !crate_.modules.iter().any(|m| m.starts_with(&path)) {
                report.notes.push(format!(
                    "LAYERS names `{entry}`, which has no file (yet): skipped"
                ));
            }
        }
    }

    let mut imports = Vec::new();
    let mut upward = Vec::new();
    let mut names: BTreeMap<String, BTreeMap<usize, BTreeSet<String>>> = BTreeMap::new();
    for (rel, module, tokens) in &files {
        // lib.rs is the crate's face: its `pub use` lists are followed above, not counted.
        if module.is_empty() {
            continue;
        }
        // A module in no layer is still a node of the graph of (a).
        let layer = layer_of(layers, module);
        if layer.is_none() {
            report.no_layer.push(format!(
                "src/{rel} (module {}) is in no layer: add it to LAYERS",
                shown(module)
            ));
        }
        for import in crate_.imports(rel, module, tokens) {
            // A module sees its ancestors' items (`use super::*`) as a matter of course.
            if import.from.starts_with(&import.to) {
                continue;
            }
            if let (Some(layer), Some(to_layer)) = (layer, layer_of(layers, &import.to)) {
                if to_layer > layer {
                    let why = format!(
                        "layer {} {} imports layer {} {}: {}",
                        layer + 1,
                        layers[layer].name,
                        to_layer + 1,
                        layers[to_layer].name,
                        shown(&import.to)
                    );
                    upward.push((
                        format!("src/{rel}"),
                        import.line,
                        import.written.clone(),
                        why,
                    ));
                }
            }
            imports.push(import);
        }
        if layer.is_some_and(|l| l < queue_at) {
            for t in tokens {
                if let Tok::Ident(s) | Tok::Lifetime(s) = &t.tok {
                    if s.to_ascii_lowercase().contains("queue") {
                        names
                            .entry(format!("src/{rel}"))
                            .or_default()
                            .entry(t.line)
                            .or_default()
                            .insert(s.clone());
                    }
                }
            }
        }
    }
    report.upward = by_place(upward.into_iter());
    report.queue_names = names
        .into_iter()
        .flat_map(|(file, by_line)| {
            by_line.into_iter().map(move |(line, idents)| {
                let idents: Vec<String> = idents.into_iter().collect();
                format!("{file}:{line}: {}", idents.join(", "))
            })
        })
        .collect();
    report.imports = imports
        .iter()
        .map(|i| (&i.from, &i.to))
        .collect::<BTreeSet<_>>()
        .len();
    report.cycles = cycles(&imports, layers);
    report
}

/// Places as lines `file:line: what  [why]`, sorted by file and line: the paths of one line
/// with the same `why` as one (`use crate::check::{Finding, Topic}`).
fn by_place(items: impl Iterator<Item = (String, usize, String, String)>) -> Vec<String> {
    let mut lines: BTreeMap<(String, usize, String), Vec<String>> = BTreeMap::new();
    for (file, line, written, why) in items {
        let at = lines.entry((file, line, why)).or_default();
        if !at.contains(&written) {
            at.push(written);
        }
    }
    lines
        .into_iter()
        .map(|((file, line, why), written)| format!("{file}:{line}: {}  [{why}]", merged(&written)))
        .collect()
}

/// Paths with one head as one: `use a::b`, `use a::b::C`, `use a::b::D` → `use a::b::{self, C, D}`.
fn merged(paths: &[String]) -> String {
    let split: Vec<Vec<&str>> = paths.iter().map(|p| p.split("::").collect()).collect();
    let common = split
        .iter()
        .map(|p| p.iter().zip(&split[0]).take_while(|(a, b)| a == b).count())
        .min()
        .unwrap_or(0);
    if paths.len() < 2 || common == 0 {
        return paths.join(", ");
    }
    let tails: Vec<String> = split
        .iter()
        .map(|p| match &p[common..] {
            [] => "self".to_owned(),
            rest => rest.join("::"),
        })
        .collect();
    format!(
        "{}::{{{}}}",
        split[0][..common].join("::"),
        tails.join(", ")
    )
}

/// The layer (index into `layers`) of module `m`: the longest entry that is a prefix of it.
fn layer_of(layers: &[Layer], m: &[String]) -> Option<usize> {
    layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.modules.iter().map(move |e| (i, *e)))
        .filter(|(_, entry)| {
            let path: Vec<&str> = entry.split("::").collect();
            m.len() >= path.len() && m.iter().zip(&path).all(|(a, b)| a == b)
        })
        .max_by_key(|(_, entry)| entry.split("::").count())
        .map(|(i, _)| i)
}

/// (a): every group of modules that import each other in a loop (a shortest loop through it,
/// and its members), sorted. Every loop has an import that goes up a layer or stays in one; the
/// ones up a layer are (b)'s, so each group says what is left of it without them: the loops
/// within one layer, and the imports that tie each.
fn cycles(imports: &[Import], layers: &[Layer]) -> Vec<String> {
    let up = |i: &Import| {
        matches!(
            (layer_of(layers, &i.from), layer_of(layers, &i.to)),
            (Some(from), Some(to)) if from < to
        )
    };
    let all: Vec<&Import> = imports.iter().collect();
    let mut found = Vec::new();
    for (members, path) in loops(&all) {
        let inside: Vec<&Import> = all
            .iter()
            .copied()
            .filter(|i| members.contains(&i.from) && members.contains(&i.to))
            .collect();
        let names: Vec<String> = members.iter().map(|m| shown(m)).collect();
        let mut text = format!(
            "{path}: {} modules in one cycle ({})",
            members.len(),
            names.join(", ")
        );
        let ties = |within: &BTreeSet<Module>| {
            by_place(
                inside
                    .iter()
                    .filter(|i| within.contains(&i.from) && within.contains(&i.to))
                    .map(|i| {
                        let why = format!("{} -> {}", shown(&i.from), shown(&i.to));
                        (format!("src/{}", i.file), i.line, i.written.clone(), why)
                    }),
            )
        };
        if !inside.iter().any(|i| up(i)) {
            text.push_str(", tied by:");
            for tie in ties(&members) {
                text.push_str(&format!("\n      {tie}"));
            }
        } else {
            let flat: Vec<&Import> = inside.iter().copied().filter(|i| !up(i)).collect();
            let mut left = loops(&flat);
            left.sort_by(|a, b| a.1.cmp(&b.1));
            if left.is_empty() {
                text.push_str(
                    "; its imports from a higher layer (b) alone tie it: it goes with them",
                );
            } else {
                text.push_str("; what is left of it without its imports from a higher layer (b):");
            }
            for (within, path) in left {
                text.push_str(&format!("\n    {path}: {} modules, tied by:", within.len()));
                for tie in ties(&within) {
                    text.push_str(&format!("\n      {tie}"));
                }
            }
        }
        found.push(text);
    }
    found.sort();
    found
}

/// The groups of modules that `imports` tie into loops (strongly connected, two modules or
/// more), each with a shortest loop through its first module, `a -> b -> a`.
fn loops(imports: &[&Import]) -> Vec<(BTreeSet<Module>, String)> {
    let mut graph: BTreeMap<&Module, BTreeSet<&Module>> = BTreeMap::new();
    for i in imports {
        graph.entry(&i.from).or_default().insert(&i.to);
        graph.entry(&i.to).or_default();
    }
    let mut found = Vec::new();
    for group in strongly_connected(&graph) {
        if group.len() < 2 {
            continue;
        }
        let start = group[0];
        let members: BTreeSet<&Module> = group.iter().copied().collect();
        // A shortest loop from `start` back to it, by breadth-first search inside the group.
        let mut before: BTreeMap<&Module, &Module> = BTreeMap::new();
        let mut todo = VecDeque::from([start]);
        let mut last = None;
        'search: while let Some(m) = todo.pop_front() {
            for &next in &graph[m] {
                if !members.contains(next) {
                    continue;
                }
                if next == start {
                    last = Some(m);
                    break 'search;
                }
                if !before.contains_key(next) {
                    before.insert(next, m);
                    todo.push_back(next);
                }
            }
        }
        let mut path = vec![start];
        let mut at = last.expect("a strongly connected group has a loop");
        while at != start {
            path.push(at);
            at = before[at];
        }
        path[1..].reverse();
        path.push(start);
        let path: Vec<String> = path.iter().map(|m| shown(m)).collect();
        found.push((members.into_iter().cloned().collect(), path.join(" -> ")));
    }
    found
}

/// Tarjan's strongly connected components, each sorted.
fn strongly_connected<'a>(
    graph: &BTreeMap<&'a Module, BTreeSet<&'a Module>>,
) -> Vec<Vec<&'a Module>> {
    struct Walk<'g, 'a> {
        graph: &'g BTreeMap<&'a Module, BTreeSet<&'a Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        groups: Vec<Vec<&'a Module>>,
    }
    impl<'a> Walk<'_, 'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for &w in &self.graph[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.push(w);
                    if w == v {
                        break;
                    }
                }
                group.sort();
                self.groups.push(group);
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for &v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.groups
}

// ------------------------------------------------------------------------ paths to modules

/// The crate's module files, and where lib.rs says each of its re-exported names lives.
struct Crate {
    modules: BTreeSet<Module>,
    /// `Job` → `["queue", "Job"]`, from lib.rs's `use` lists.
    root_names: BTreeMap<String, Vec<String>>,
}

/// One leaf of a `use` tree: its whole path (`["crate", "backend", "sql", "Binder"]`), the name
/// it binds (`None` for a glob or `as _`), and its line.
struct UseLeaf {
    path: Vec<String>,
    binds: Option<String>,
    glob: bool,
    line: usize,
}

impl UseLeaf {
    fn written(&self) -> String {
        let mut s = format!("use {}", self.path.join("::"));
        if self.glob {
            s.push_str("::*");
        }
        s
    }
}

/// Where a path is read: the file's module and the inline modules (`mod tests { … }`) around
/// the path within the file.
struct Scope<'a> {
    module: &'a [String],
    inline: Vec<String>,
}

impl Crate {
    fn root_names(&self, tokens: &[Token]) -> BTreeMap<String, Vec<String>> {
        let mut names = BTreeMap::new();
        let root = Scope {
            module: &[],
            inline: Vec::new(),
        };
        let mut i = 0;
        while i < tokens.len() {
            if tokens[i].tok == Tok::Ident("use".into()) {
                let (leaves, next) = use_leaves(tokens, i + 1);
                for leaf in leaves {
                    let (Some(name), false) = (&leaf.binds, leaf.glob) else {
                        continue;
                    };
                    if let Some(path) = self.absolute(&root, &leaf.path, &BTreeMap::new()) {
                        names.insert(name.clone(), path);
                    }
                }
                i = next;
            } else {
                i += 1;
            }
        }
        names
    }

    /// Every place the file `rel` (module `module`) names another module of the crate.
    fn imports(&self, rel: &str, module: &[String], tokens: &[Token]) -> Vec<Import> {
        let mut found = Vec::new();
        let mut scope = Scope {
            module,
            inline: Vec::new(),
        };
        // Modules brought in by `use` (`use super::sql;`), by the name they bind.
        let mut aliases: BTreeMap<String, Vec<String>> = BTreeMap::new();
        // The brace depth at which each inline module opened.
        let mut inline_at: Vec<usize> = Vec::new();
        let mut depth = 0;
        let mut i = 0;
        let mut push = |to: Module, line: usize, written: String| {
            found.push(Import {
                from: module.to_vec(),
                to,
                file: rel.to_owned(),
                line,
                written,
            })
        };
        while i < tokens.len() {
            let tok = &tokens[i].tok;
            match tok {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if inline_at.last() == Some(&depth) {
                        inline_at.pop();
                        scope.inline.pop();
                    }
                }
                Tok::Ident(kw) if kw == "mod" => {
                    if let (Some(Tok::Ident(name)), Some(Tok::Punct('{'))) = (
                        tokens.get(i + 1).map(|t| &t.tok),
                        tokens.get(i + 2).map(|t| &t.tok),
                    ) {
                        scope.inline.push(name.clone());
                        inline_at.push(depth);
                        depth += 1;
                        i += 3;
                        continue;
                    }
                }
                Tok::Ident(kw) if kw == "use" => {
                    let (leaves, next) = use_leaves(tokens, i + 1);
                    for leaf in &leaves {
                        let Some(path) = self.absolute(&scope, &leaf.path, &aliases) else {
                            continue;
                        };
                        if let (Some(name), false) = (&leaf.binds, leaf.glob) {
                            if self.modules.contains(&path) {
                                aliases.insert(name.clone(), path.clone());
                            }
                        }
                        push(self.module_holding(&path), leaf.line, leaf.written());
                    }
                    i = next;
                    continue;
                }
                _ => {}
            }
            // A path in code: `crate::a::b`, `super::x`, `child::y`, not the tail of a longer
            // path (`std::sync::x`) and not a bare name.
            let starts = i == 0 || tokens[i - 1].tok != Tok::PathSep;
            if let (true, Tok::Ident(_)) = (starts, tok) {
                let mut path = Vec::new();
                let (mut j, mut end) = (i, i);
                while let Some(Tok::Ident(seg)) = tokens.get(j).map(|t| &t.tok) {
                    path.push(seg.clone());
                    end = j;
                    if tokens.get(j + 1).map(|t| &t.tok) != Some(&Tok::PathSep) {
                        break;
                    }
                    j += 2;
                }
                if path.len() >= 2 {
                    if let Some(abs) = self.absolute(&scope, &path, &aliases) {
                        push(self.module_holding(&abs), tokens[i].line, path.join("::"));
                    }
                    i = end + 1;
                    continue;
                }
            }
            i += 1;
        }
        found
    }

    /// `path` as read in `scope`, from the crate root; `None` for a path outside the crate
    /// (`std::…`, `sqlx::…`, a local name).
    fn absolute(
        &self,
        scope: &Scope<'_>,
        path: &[String],
        aliases: &BTreeMap<String, Vec<String>>,
    ) -> Option<Vec<String>> {
        let here = || -> Vec<String> {
            let mut h = scope.module.to_vec();
            h.extend(scope.inline.iter().cloned());
            h
        };
        let first = path.first()?.as_str();
        let mut abs = match first {
            "crate" => Vec::new(),
            "self" => here(),
            "super" => {
                let mut h = here();
                let ups = path.iter().take_while(|s| *s == "super").count();
                for _ in 0..ups {
                    h.pop()?;
                }
                h.extend(path[ups..].iter().cloned());
                return Some(h);
            }
            _ => {
                if let Some(target) = aliases.get(first) {
                    target.clone()
                } else {
                    // A child module of the file's module, named without `self::` (only
                    // outside an inline module, where the file's children are in scope).
                    let mut child = scope.module.to_vec();
                    child.push(first.to_owned());
                    if !scope.inline.is_empty() || !self.modules.contains(&child) {
                        return None;
                    }
                    child
                }
            }
        };
        abs.extend(path[1..].iter().cloned());
        Some(abs)
    }

    /// The module file that holds what `abs` names: its longest prefix that is a module file;
    /// a name at the crate root is followed to where lib.rs's `use` takes it from.
    fn module_holding(&self, abs: &[String]) -> Module {
        let mut abs = abs.to_vec();
        for _ in 0..4 {
            let k = (0..=abs.len())
                .rev()
                .find(|&k| self.modules.contains(&abs[..k]))
                .unwrap_or(0);
            match (k, abs.first().and_then(|n| self.root_names.get(n))) {
                (0, Some(target)) => {
                    let mut next = target.clone();
                    next.extend(abs.drain(1..));
                    abs = next;
                }
                _ => return abs[..k].to_vec(),
            }
        }
        Module::new()
    }
}

/// The leaves of the `use` tree that starts at `tokens[i]` (just after `use`), and the index
/// just after its `;`.
fn use_leaves(tokens: &[Token], i: usize) -> (Vec<UseLeaf>, usize) {
    fn tree(tokens: &[Token], mut i: usize, prefix: &[String], out: &mut Vec<UseLeaf>) -> usize {
        let mut path = prefix.to_vec();
        if tokens.get(i).map(|t| &t.tok) == Some(&Tok::PathSep) {
            // `use ::sqlx::…`: an outside crate.
            path.push("::".to_owned());
            i += 1;
        }
        loop {
            let Some(t) = tokens.get(i) else { return i };
            match &t.tok {
                Tok::Ident(seg) => {
                    path.push(seg.clone());
                    i += 1;
                    match tokens.get(i).map(|t| &t.tok) {
                        Some(Tok::PathSep) => i += 1,
                        Some(Tok::Ident(kw)) if kw == "as" => {
                            let alias = match tokens.get(i + 1).map(|t| &t.tok) {
                                Some(Tok::Ident(a)) => Some(a.clone()),
                                _ => None,
                            };
                            out.push(leaf(path, alias, false, t.line));
                            return i + 2;
                        }
                        _ => {
                            let binds = path.last().cloned();
                            out.push(leaf(path, binds, false, t.line));
                            return i;
                        }
                    }
                }
                Tok::Punct('*') => {
                    out.push(leaf(path, None, true, t.line));
                    return i + 1;
                }
                Tok::Punct('{') => {
                    i += 1;
                    loop {
                        match tokens.get(i).map(|t| &t.tok) {
                            None => return i,
                            Some(Tok::Punct('}')) => return i + 1,
                            Some(Tok::Punct(',')) => i += 1,
                            Some(_) => {
                                let next = tree(tokens, i, &path, out);
                                // Never stall on something unexpected.
                                i = next.max(i + 1);
                            }
                        }
                    }
                }
                _ => return i,
            }
        }
    }
    /// `a::b::self` is `a::b`, binding `b`.
    fn leaf(mut path: Vec<String>, binds: Option<String>, glob: bool, line: usize) -> UseLeaf {
        let mut binds = binds.filter(|b| b != "_");
        if path.len() > 1 && path.last().is_some_and(|s| s == "self") {
            path.pop();
            if binds.as_deref() == Some("self") {
                binds = path.last().cloned();
            }
        }
        UseLeaf {
            path,
            binds,
            glob,
            line,
        }
    }
    let mut leaves = Vec::new();
    let mut i = tree(tokens, i, &[], &mut leaves);
    while i < tokens.len() && tokens[i].tok != Tok::Punct(';') {
        i += 1;
    }
    (leaves, i + 1)
}

// ------------------------------------------------------------------------------- the lexer

/// A token of Rust code. Comments, doc comments, and string, char and number literals make
/// none.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// An identifier or keyword; `r#type` is `type`, `$crate` is `crate`.
    Ident(String),
    /// A lifetime or label, without its `'`.
    Lifetime(String),
    /// `::`
    PathSep,
    Punct(char),
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    line: usize,
}

/// The tokens of `text`, or why it cannot be read (an unterminated comment or literal, or
/// delimiters that do not balance).
fn lex(text: &str) -> Result<Vec<Token>, String> {
    let c: Vec<char> = text.chars().collect();
    let at = |k: usize| c.get(k).copied().unwrap_or('\0');
    let is_start = |ch: char| ch == '_' || ch.is_alphabetic();
    let is_cont = |ch: char| ch == '_' || ch.is_alphanumeric();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Skips a quoted literal whose opening quote is just before `i`; returns the index after
    // its closing quote.
    let quoted = |mut i: usize, quote: char, line: &mut usize| -> Result<usize, String> {
        let from = *line;
        loop {
            match c.get(i) {
                None => return Err(format!("line {from}: unterminated literal")),
                Some('\\') => {
                    // An escape; `\` at a line's end continues the string on the next.
                    if c.get(i + 1) == Some(&'\n') {
                        *line += 1;
                    }
                    i += 2
                }
                Some(&ch) if ch == quote => return Ok(i + 1),
                Some('\n') => {
                    *line += 1;
                    i += 1
                }
                Some(_) => i += 1,
            }
        }
    };
    while i < c.len() {
        let ch = c[i];
        match ch {
            '\n' => {
                line += 1;
                i += 1;
            }
            _ if ch.is_whitespace() => i += 1,
            '/' if at(i + 1) == '/' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '*' => {
                let from = line;
                let mut nested = 1;
                i += 2;
                while nested > 0 {
                    match (c.get(i), at(i + 1)) {
                        (None, _) => return Err(format!("line {from}: unterminated comment")),
                        (Some('/'), '*') => {
                            nested += 1;
                            i += 2;
                        }
                        (Some('*'), '/') => {
                            nested -= 1;
                            i += 2;
                        }
                        (Some(&ch), _) => {
                            if ch == '\n' {
                                line += 1;
                            }
                            i += 1;
                        }
                    }
                }
            }
            '"' => i = quoted(i + 1, '"', &mut line)?,
            '\'' => {
                if at(i + 1) == '\\' {
                    // An escaped char: '\n', '\'', '\u{1F600}'.
                    i = quoted(i + 3, '\'', &mut line)?;
                } else if at(i + 2) == '\'' {
                    i += 3;
                } else {
                    let mut j = i + 1;
                    while j < c.len() && is_cont(c[j]) {
                        j += 1;
                    }
                    let name: String = c[i + 1..j].iter().collect();
                    tokens.push(Token {
                        tok: if name.is_empty() {
                            Tok::Punct('\'')
                        } else {
                            Tok::Lifetime(name)
                        },
                        line,
                    });
                    i = j.max(i + 1);
                }
            }
            ':' if at(i + 1) == ':' => {
                tokens.push(Token {
                    tok: Tok::PathSep,
                    line,
                });
                i += 2;
            }
            '$' if c[i + 1..].starts_with(&['c', 'r', 'a', 't', 'e']) && !is_cont(at(i + 6)) => {
                tokens.push(Token {
                    tok: Tok::Ident("crate".into()),
                    line,
                });
                i += 6;
            }
            _ if ch.is_ascii_digit() => {
                while i < c.len() && is_cont(c[i]) {
                    i += 1;
                }
            }
            _ if is_start(ch) => {
                let mut j = i;
                while j < c.len() && is_cont(c[j]) {
                    j += 1;
                }
                let word: String = c[i..j].iter().collect();
                let next = at(j);
                match word.as_str() {
                    // Raw strings: r"…", r#"…"#, br##"…"##, cr"…".
                    "r" | "br" | "cr"
                        if next == '"' || (next == '#' && matches!(at(j + 1), '"' | '#')) =>
                    {
                        let from = line;
                        let mut hashes = 0;
                        while at(j) == '#' {
                            hashes += 1;
                            j += 1;
                        }
                        if at(j) != '"' {
                            return Err(format!("line {from}: a raw string without its quote"));
                        }
                        j += 1;
                        loop {
                            match c.get(j) {
                                None => {
                                    return Err(format!("line {from}: unterminated raw string"))
                                }
                                Some('"') if (1..=hashes).all(|h| at(j + h) == '#') => {
                                    j += 1 + hashes;
                                    break;
                                }
                                Some(&ch) => {
                                    if ch == '\n' {
                                        line += 1;
                                    }
                                    j += 1;
                                }
                            }
                        }
                        i = j;
                    }
                    // A raw identifier: r#type.
                    "r" if next == '#' && is_start(at(j + 1)) => {
                        let mut k = j + 1;
                        while k < c.len() && is_cont(c[k]) {
                            k += 1;
                        }
                        tokens.push(Token {
                            tok: Tok::Ident(c[j + 1..k].iter().collect()),
                            line,
                        });
                        i = k;
                    }
                    // Byte and C strings, byte chars.
                    "b" | "c" if next == '"' => i = quoted(j + 1, '"', &mut line)?,
                    "b" if next == '\'' => i = quoted(j + 1, '\'', &mut line)?,
                    _ => {
                        tokens.push(Token {
                            tok: Tok::Ident(word),
                            line,
                        });
                        i = j;
                    }
                }
            }
            _ => {
                tokens.push(Token {
                    tok: Tok::Punct(ch),
                    line,
                });
                i += 1;
            }
        }
    }
    // Delimiters must balance: a literal or comment read wrongly shows up here.
    let mut open: Vec<(char, usize)> = Vec::new();
    for t in &tokens {
        match t.tok {
            Tok::Punct(o @ ('(' | '[' | '{')) => open.push((o, t.line)),
            Tok::Punct(close @ (')' | ']' | '}')) => {
                let want = match close {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                match open.pop() {
                    Some((o, _)) if o == want => {}
                    Some((o, l)) => {
                        return Err(format!(
                            "line {}: `{close}` closes the `{o}` of line {l}",
                            t.line
                        ))
                    }
                    None => return Err(format!("line {}: `{close}` closes nothing", t.line)),
                }
            }
            _ => {}
        }
    }
    match open.pop() {
        Some((o, l)) => Err(format!("line {l}: `{o}` is never closed")),
        None => Ok(tokens),
    }
}
