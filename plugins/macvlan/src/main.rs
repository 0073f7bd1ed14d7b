//! plexus-macvlan: see the library for the plugin's steps.

plexus_plugin::binary_role!(Delegate);

fn main() -> std::process::ExitCode {
    plexus_plugin::run(plexus_macvlan::ABOUT, &plexus_macvlan::Macvlan)
}
