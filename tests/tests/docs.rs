//! The docs name files that exist: every path in backquotes in README.md, BENCHMARKS.md,
//! SECURITY.md and docs/*.md that starts with one of the repository's top-level directories
//! (`crates/ipam/src/store/file.rs`, `plugins/{macvlan,host-device}/src/tests.rs`) is there, and
//! docs/CONTRIBUTING.md's tables of test files and harness modules name every one. A moved,
//! renamed or new file whose docs were not fixed fails here. No root needed.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `a/{b,c}/d` as `a/b/d` and `a/c/d` (one level of braces, as the docs write them).
fn expand(path: &str) -> Vec<String> {
    match (path.find('{'), path.find('}')) {
        (Some(open), Some(close)) if open < close => path[open + 1..close]
            .split(',')
            .flat_map(|alt| expand(&format!("{}{alt}{}", &path[..open], &path[close + 1..])))
            .collect(),
        _ => vec![path.to_string()],
    }
}

/// The repository paths a Markdown text names in backquotes: those starting with a top-level
/// directory, without a `:line` suffix; placeholders (`<target>`, `*`, `$VAR`) are not paths.
fn named_paths(text: &str, top: &[String]) -> Vec<String> {
    // Fenced code blocks are commands and output, not references.
    let mut fenced = false;
    let prose: String = text
        .lines()
        .filter(|l| {
            let fence = l.trim_start().starts_with("```");
            fenced ^= fence;
            !fenced && !fence
        })
        .collect::<Vec<_>>()
        .join("\n");
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| !t.contains(char::is_whitespace))
        .filter(|t| top.iter().any(|d| t.starts_with(&format!("{d}/"))))
        .filter(|t| !t.contains(['<', '*', '$']) && !t.contains("..."))
        .map(|t| t.split(':').next().unwrap().trim_end_matches(['.', ',', ';', ')']).to_string())
        .flat_map(|t| expand(&t))
        .collect()
}

fn top_dirs(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "target" && n != ".git")
        .collect()
}

fn docs(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        ["README.md", "BENCHMARKS.md", "SECURITY.md"].iter().map(|f| root.join(f)).filter(|p| p.exists()).collect();
    files.extend(
        std::fs::read_dir(root.join("docs"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    files.sort();
    files
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let root = repo();
    let top = top_dirs(&root);
    let mut checked = 0;
    let mut missing = Vec::new();
    for doc in docs(&root) {
        let text = std::fs::read_to_string(&doc).unwrap();
        for path in named_paths(&text, &top) {
            checked += 1;
            if !root.join(&path).exists() {
                missing.push(format!("{}: {path}", doc.strip_prefix(&root).unwrap().display()));
            }
        }
    }
    assert!(checked > 100, "only {checked} paths found in the docs: the scan is broken");
    assert!(missing.is_empty(), "paths named in the docs that do not exist:\n{}", missing.join("\n"));
}

#[test]
fn paths_are_found_in_backquotes_with_braces_expanded_and_placeholders_and_code_blocks_left_out() {
    let top = vec!["plugins".to_string(), "fuzz".to_string()];
    let text = "see `plugins/{macvlan,host-device}/src/tests.rs`, `plugins/plexus/src/lib.rs:42`, \
                `fuzz/regressions/<target>/`, `lib.rs` and `cargo nextest run`\n```sh\necho `fuzz/inside-a-block`\n```\n";
    assert_eq!(
        named_paths(text, &top),
        ["plugins/macvlan/src/tests.rs", "plugins/host-device/src/tests.rs", "plugins/plexus/src/lib.rs"]
    );
}

/// The first column's backquoted names of the Markdown table under the header line `header`.
fn table_names(text: &str, header: &str) -> Vec<String> {
    let rows = text.lines().skip_while(|l| l.trim() != header).skip(2).take_while(|l| l.starts_with('|'));
    rows.flat_map(|row| {
        let first = row.split('|').nth(1).unwrap_or_default();
        first.split('`').skip(1).step_by(2).map(str::to_string).collect::<Vec<_>>()
    })
    .collect()
}

fn rust_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs"))
        .collect();
    names.sort();
    names
}

#[test]
fn contributing_names_every_test_file_and_every_harness_module() {
    let root = repo();
    let text = std::fs::read_to_string(root.join("docs/CONTRIBUTING.md")).unwrap();
    for (dir, header) in [("tests/tests", "| file | covers |"), ("tests/src", "| module | what it gives a test |")] {
        let named = table_names(&text, header);
        assert!(!named.is_empty(), "no table under {header:?} in docs/CONTRIBUTING.md");
        let left_out: Vec<String> = rust_files(&root.join(dir)).into_iter().filter(|f| !named.contains(f)).collect();
        assert!(left_out.is_empty(), "{dir}: not in docs/CONTRIBUTING.md's table {header:?}: {left_out:?}");
    }
}

#[test]
fn readmes_layout_names_every_workspace_member_and_top_level_directory() {
    let root = repo();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = readme.split("\n## Layout\n").nth(1).expect("README.md has a Layout section");
    let block = section.split("```").nth(1).expect("the Layout section has a code block");
    let named: Vec<&str> = block.split_whitespace().collect();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest.split("members = [").nth(1).unwrap().split(']').next().unwrap();
    let members = members.split(',').map(|m| m.trim().trim_matches('"').to_string()).filter(|m| !m.is_empty());
    let mut wanted: Vec<String> = members.map(|m| if m.contains('/') { m } else { format!("{m}/") }).collect();
    wanted.extend(top_dirs(&root).into_iter().filter(|d| !d.starts_with('.')).map(|d| format!("{d}/")));
    // plugins/ and crates/ are named by their members.
    wanted.retain(|w| w != "plugins/" && w != "crates/");
    let left_out: Vec<&String> = wanted.iter().filter(|w| !named.contains(&w.as_str())).collect();
    assert!(left_out.is_empty(), "README.md's Layout leaves out {left_out:?}");
}
