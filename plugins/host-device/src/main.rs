//! plexus-host-device: see the library for the plugin's steps.

plexus_plugin::binary_role!(Delegate);

fn main() -> std::process::ExitCode {
    plexus_plugin::run(plexus_host_device::ABOUT, &plexus_host_device::HostDevice)
}
