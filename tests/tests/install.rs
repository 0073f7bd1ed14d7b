//! scripts/install.sh: installs plexus's binaries (and only files of its own names) into a CNI
//! bin dir under DESTDIR, and --uninstall removes exactly what it installed. Uses the binaries
//! cargo already built (PLEXUS_BIN) instead of a release build.

use std::path::Path;
use std::process::Command;

use plexus_tests::plugin_bin;

fn install(destdir: &Path, extra: &[&str]) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install.sh");
    let out = Command::new("bash")
        .arg(script)
        .args(["--bin-dir", "/opt/cni/bin"])
        .args(extra)
        .env("DESTDIR", destdir)
        .env("PLEXUS_BIN", plugin_bin("plexus").parent().unwrap())
        .output()
        .unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn install_writes_only_plexus_binaries_and_uninstall_removes_exactly_them() {
    let dest = tempfile::tempdir().unwrap();
    let bin = dest.path().join("opt/cni/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("macvlan"), "the reference plugin").unwrap();
    let (ok, out) = install(dest.path(), &[]);
    assert!(ok, "{out}");
    for b in ["plexus", "plexus-macvlan", "plexus-host-device", "plexus-ipam", "plexusctl", "plexus-daemon"] {
        assert!(out.contains(&format!("installed {}", bin.join(b).display())), "{out}");
        let m = std::fs::metadata(bin.join(b)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(m.permissions().mode() & 0o777, 0o755);
    }
    assert_eq!(std::fs::read_to_string(bin.join("macvlan")).unwrap(), "the reference plugin");
    // Again: idempotent.
    assert!(install(dest.path(), &[]).0);
    let (ok, out) = install(dest.path(), &["--uninstall"]);
    assert!(ok, "{out}");
    let left: Vec<String> =
        std::fs::read_dir(&bin).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(left, ["macvlan"], "only the foreign file stays");
    let (ok, out) = install(dest.path(), &["--uninstall"]);
    assert!(ok && out.contains("nothing installed"), "{out}");
}
