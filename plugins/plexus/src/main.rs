//! plexus: the Multus-compatible meta-plugin (see the library for what each verb does).

fn main() -> std::process::ExitCode {
    plexus_cni::plugin::run(plexus::ABOUT, &plexus::Meta::thin())
}
