//! plexus-ipam: see the library for the plugin's steps.

plexus_plugin::binary_role!(Delegate);

fn main() -> std::process::ExitCode {
    plexus_plugin::run(plexus_ipam_plugin::ABOUT, &plexus_ipam_plugin::Ipam)
}
