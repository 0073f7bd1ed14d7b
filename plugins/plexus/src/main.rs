//! plexus: the Multus-compatible meta-plugin (see the library for what each verb does).

plexus_plugin::binary_role!(Meta);

fn main() -> std::process::ExitCode {
    plexus::shim::run()
}
