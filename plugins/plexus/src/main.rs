//! plexus: the Multus-compatible meta-plugin (see the library for what each verb does).

fn main() -> std::process::ExitCode {
    plexus::shim::run()
}
