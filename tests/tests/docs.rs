//! The docs name files that exist: every path in backquotes in README.md, BENCHMARKS.md,
//! SECURITY.md and docs/*.md that starts with one of the repository's top-level directories
//! (`crates/ipam/src/store/file.rs`, `plugins/{macvlan,host-device}/src/tests.rs`) is there, and
//! docs/CONTRIBUTING.md's tables of test files and harness modules name every one. A moved,
//! renamed or new file whose docs were not fixed fails here. So does what docs/ARCHITECTURE.md
//! states that the code can check: each crate's plexus dependencies, every module and library
//! error type, every value held process-wide; and README states no test count. No root needed.

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

/// The workspace's members (`Cargo.toml`'s `members`), as directories.
fn members(root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let line = text.lines().find(|l| l.starts_with("members")).expect("members in Cargo.toml");
    line.split('"').skip(1).step_by(2).map(str::to_string).collect()
}

/// A member's package name and the plexus crates its `[dependencies]` name (not dev or build).
fn package_and_deps(root: &Path, member: &str) -> (String, std::collections::BTreeSet<String>) {
    let text = std::fs::read_to_string(root.join(member).join("Cargo.toml")).unwrap();
    let name = text.lines().find_map(|l| l.strip_prefix("name = ")).unwrap().trim_matches('"').to_string();
    let mut section = "";
    let mut deps = std::collections::BTreeSet::new();
    for l in text.lines() {
        if l.starts_with('[') {
            section = l.trim();
        } else if section == "[dependencies]" && l.starts_with("plexus") {
            deps.insert(l.split(['.', ' ', '=']).next().unwrap().to_string());
        }
    }
    (name, deps)
}

/// The backquoted words of a Markdown table cell.
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

#[test]
fn the_crate_table_names_each_crates_plexus_dependencies_as_its_cargo_toml_has_them() {
    let root = repo();
    let text = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let header = "| directory | package (lib name) | owns | plexus dependencies |";
    let rows: Vec<&str> =
        text.lines().skip_while(|l| l.trim() != header).skip(2).take_while(|l| l.starts_with('|')).collect();
    let cargo: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        members(&root).iter().map(|m| package_and_deps(&root, m)).collect();
    assert!(cargo.len() > 10, "the workspace's members were not read");
    let mut seen = Vec::new();
    for row in rows {
        let cells: Vec<&str> = row.split('|').collect();
        let package = quoted(cells[2]).into_iter().next().expect("a package name");
        let named: std::collections::BTreeSet<String> =
            quoted(cells[4]).into_iter().filter(|d| cargo.contains_key(d)).collect();
        let has = cargo.get(&package).unwrap_or_else(|| panic!("{package}: in the table, not in the workspace"));
        assert_eq!(&named, has, "docs/ARCHITECTURE.md's row of {package}: its plexus dependencies");
        seen.push(package);
    }
    let left_out: Vec<&String> = cargo.keys().filter(|p| !seen.contains(p)).collect();
    assert!(left_out.is_empty(), "not in docs/ARCHITECTURE.md's crate table: {left_out:?}");
}

#[test]
fn architecture_names_every_module_of_every_crate_and_every_library_error_type() {
    let root = repo();
    let text = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let named = |word: &str| text.contains(&format!("`{word}`")) || text.contains(&format!("/{word}`"));
    let mut left_out = Vec::new();
    for member in members(&root).iter().filter(|m| m.starts_with("crates/") || m.starts_with("plugins/")) {
        for file in rust_files(&root.join(member).join("src")) {
            if !["lib.rs", "main.rs", "tests.rs"].contains(&file.as_str()) && !named(&file) {
                left_out.push(format!("{member}/src/{file}"));
            }
            let source = std::fs::read_to_string(root.join(member).join("src").join(&file)).unwrap();
            let mut derives_error = false;
            for l in source.lines() {
                if l.starts_with("#[derive(") {
                    derives_error = l.contains("thiserror::Error");
                } else if let Some(rest) = l.strip_prefix("pub enum ").filter(|_| derives_error) {
                    let name = rest.split([' ', '<', '{']).next().unwrap();
                    if !named(name) {
                        left_out.push(format!("the error type {name} ({member}/src/{file})"));
                    }
                }
            }
        }
    }
    assert!(left_out.is_empty(), "docs/ARCHITECTURE.md does not name: {left_out:#?}");
}

#[test]
fn readme_states_no_count_of_tests_that_a_new_test_would_make_wrong() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let counts: Vec<&str> = readme
        .split([',', '.', '(', ')'])
        .filter(|s| {
            let words: Vec<&str> = s.split_whitespace().collect();
            words.windows(2).any(|w| w[0].chars().all(|c| c.is_ascii_digit()) && w[1] == "tests")
        })
        .collect();
    assert!(counts.is_empty(), "README.md counts tests: {counts:?}");
}

fn rust_files_beneath(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "tests") {
            rust_files_beneath(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") && path.file_name().is_some_and(|n| n != "tests.rs") {
            out.push(path);
        }
    }
}

/// The names of the process-wide (or thread-wide) values `source` declares outside its tests: a
/// `static` whose type can change (a lock, a once-cell, an atomic, a cell) or any `thread_local!`.
fn process_state(source: &str) -> Vec<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or_default();
    let mut in_thread_local = false;
    let mut names = Vec::new();
    for line in code.lines().map(str::trim) {
        in_thread_local |= line.starts_with("thread_local!");
        let Some(rest) = line.strip_prefix("pub static ").or_else(|| line.strip_prefix("static ")) else { continue };
        let Some((name, ty)) = rest.split_once(':') else { continue };
        let changes = ["OnceLock", "Mutex", "RwLock", "Atomic", "Cell", "LazyLock"].iter().any(|t| ty.contains(t));
        if changes || in_thread_local {
            names.push(name.trim().to_string());
        }
        in_thread_local = false;
    }
    names
}

#[test]
fn process_wide_state_is_only_what_architecture_names_as_such() {
    let root = repo();
    let text = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap();
    let mut files = Vec::new();
    for member in members(&root).iter().filter(|m| m.starts_with("crates/") || m.starts_with("plugins/")) {
        rust_files_beneath(&root.join(member).join("src"), &mut files);
    }
    let mut found = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        for name in process_state(&source) {
            found.push((name, file.strip_prefix(&root).unwrap().display().to_string()));
        }
    }
    assert!(found.iter().any(|(n, _)| n == "OWN"), "the scan finds the one it must: {found:?}");
    let unnamed: Vec<_> = found.iter().filter(|(n, _)| !text.contains(&format!("`{n}`"))).collect();
    assert!(unnamed.is_empty(), "process-wide state docs/ARCHITECTURE.md does not name (and justify): {unnamed:?}");
}

#[test]
fn process_state_is_found_in_statics_that_change_and_thread_locals_not_in_constants_or_tests() {
    let source = "static A: AtomicBool = AtomicBool::new(false);\nstatic B: [u8; 2] = [0; 2];\n\
                  pub static C: std::sync::OnceLock<u8> = OnceLock::new();\nthread_local! {\n    /// doc\n    \
                  static D: u8 = 0;\n}\n#[cfg(test)]\nmod tests { static E: Mutex<u8> = Mutex::new(0); }";
    assert_eq!(process_state(source), ["A", "C", "D"]);
}
