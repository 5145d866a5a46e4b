//! The host CPU's name, for what depends on the machine: the planner's cached profiles (a
//! home directory shared between machines must not hand one machine's timings to another)
//! and `doctor`'s report.

/// The CPU's model name as the OS reports it (`/proc/cpuinfo`'s `model name` on Linux), or
/// the architecture (`x86_64`, `aarch64`) where it reports none.
///
/// ```
/// assert!(!kiln_core::cpu_name().is_empty());
/// ```
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| model_name(&info))
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The first `model name` line's value in a `/proc/cpuinfo` text.
fn model_name(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split(':').nth(1))
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::model_name;

    #[test]
    fn the_model_name_line_names_the_cpu_and_its_absence_names_none() {
        let info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\nflags\t: fpu\n";
        assert_eq!(model_name(info).as_deref(), Some("AMD EPYC 9B14"));
        assert_eq!(model_name("processor\t: 0\nBogoMIPS\t: 50.00\n"), None);
        assert_eq!(model_name("model name\t:  \n"), None);
    }
}
