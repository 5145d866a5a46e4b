//! Device names on the command line and in configs.
//!
//! `cpu` and `cpu:N` name Burn's Flex CPU device (several `cpu:N` are several replicas on
//! the same cores, which is how data parallelism is tested without accelerators); `cuda:N`
//! and `wgpu` need the corresponding kiln feature.

use burn::tensor::Device;
use std::fmt;
use std::str::FromStr;

/// A device named by the user, before it is turned into a Burn [`Device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// The Flex CPU backend; the index only tells replicas apart.
    Cpu(usize),
    /// CUDA device `N` (feature `cuda`).
    Cuda(usize),
    /// The default WebGPU adapter (feature `wgpu`).
    Wgpu,
}

/// Why a device name could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceSpecError {
    /// The text is not a device name kiln knows.
    #[error("unknown device `{0}`: expected cpu, cpu:N, cuda:N or wgpu")]
    Unknown(String),
    /// The name is valid but kiln was built without the backend.
    #[error("device `{spec}` needs kiln built with `--features {feature}`")]
    FeatureMissing {
        /// The requested device.
        spec: String,
        /// The cargo feature that enables it.
        feature: &'static str,
    },
    /// The backend is built in, but this machine has no such device.
    #[error("device `{spec}` is not available: {reason}")]
    Unavailable {
        /// The requested device.
        spec: String,
        /// What the machine has instead, and how to get the device.
        reason: String,
    },
}

/// How to get a CUDA device when none is found.
pub const CUDA_FIX: &str = "CUDA finds no GPU: is the NVIDIA driver installed, so that \
    libcuda.so.1 loads? `nvidia-smi` lists what the driver sees";

/// How to get a wgpu adapter when none is found.
pub const WGPU_FIX: &str = "no Vulkan, Metal, DX12 or GL adapter: install a GPU driver, or Mesa's \
    software Vulkan driver for a CPU adapter (Debian: apt-get install mesa-vulkan-drivers \
    libvulkan1)";

#[cfg_attr(not(any(feature = "cuda", feature = "wgpu-bare")), allow(dead_code))]
/// What a machine with `available` devices of `kind` offers instead of a missing one; `fix`
/// says how to get one when there is none.
fn what_there_is(kind: &str, available: usize, fix: &str) -> String {
    match available {
        0 => format!("this machine has no {kind} device ({fix})"),
        1 => format!("this machine has one {kind} device, {kind}:0"),
        n => format!(
            "this machine has {n} {kind} devices, {kind}:0 to {kind}:{}",
            n - 1
        ),
    }
}

impl DeviceSpec {
    /// Parses a comma-separated list such as `cpu:0,cpu:1`.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, DeviceSpecError> {
        text.split(',').map(|part| part.trim().parse()).collect()
    }

    /// Parses a comma-separated list and opens every device: each entry's name as given
    /// (trimmed), its spec and its Burn device — what a run's planner and replicas take.
    ///
    /// # Errors
    /// The first entry that does not parse or cannot be opened.
    pub fn open_list(text: &str) -> Result<Vec<(String, Self, Device)>, DeviceSpecError> {
        let open = |name: &str| -> Result<_, DeviceSpecError> {
            let spec: Self = name.parse()?;
            let device = spec.device()?;
            Ok((name.to_string(), spec, device))
        };
        text.split(',').map(|name| open(name.trim())).collect()
    }

    /// The Burn device (without autodiff).
    pub fn device(&self) -> Result<Device, DeviceSpecError> {
        match *self {
            DeviceSpec::Cpu(_) => Ok(Device::flex()),
            DeviceSpec::Cuda(_index) => {
                #[cfg(feature = "cuda")]
                {
                    // Burn opens a device lazily and panics (on its device thread, then on
                    // ours) when the index is past what CUDA reports or no driver loads;
                    // enumerating first asks CUDA without opening anything.
                    let available = Device::enumerate(burn::tensor::DeviceType::Cuda)
                        .into_iter()
                        .count();
                    if _index >= available {
                        return Err(DeviceSpecError::Unavailable {
                            spec: self.to_string(),
                            reason: what_there_is("cuda", available, CUDA_FIX),
                        });
                    }
                    Ok(Device::cuda(_index))
                }
                #[cfg(not(feature = "cuda"))]
                Err(DeviceSpecError::FeatureMissing {
                    spec: self.to_string(),
                    feature: "cuda",
                })
            }
            DeviceSpec::Wgpu => {
                #[cfg(feature = "wgpu-bare")]
                {
                    let available = Device::enumerate(burn::tensor::DeviceType::Wgpu)
                        .into_iter()
                        .count();
                    if available == 0 {
                        return Err(DeviceSpecError::Unavailable {
                            spec: self.to_string(),
                            reason: what_there_is("wgpu", 0, WGPU_FIX),
                        });
                    }
                    Ok(Device::wgpu(burn::tensor::DeviceKind::default()))
                }
                #[cfg(not(feature = "wgpu-bare"))]
                Err(DeviceSpecError::FeatureMissing {
                    spec: self.to_string(),
                    feature: "wgpu",
                })
            }
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceSpecError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let unknown = || DeviceSpecError::Unknown(text.to_string());
        let (kind, index) = match text.split_once(':') {
            Some((kind, index)) => (kind, Some(index.parse::<usize>().map_err(|_| unknown())?)),
            None => (text, None),
        };
        match (kind, index) {
            ("cpu", index) => Ok(DeviceSpec::Cpu(index.unwrap_or(0))),
            ("cuda", index) => Ok(DeviceSpec::Cuda(index.unwrap_or(0))),
            ("wgpu", None) => Ok(DeviceSpec::Wgpu),
            _ => Err(unknown()),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu(index) => write!(f, "cpu:{index}"),
            DeviceSpec::Cuda(index) => write!(f, "cuda:{index}"),
            DeviceSpec::Wgpu => write!(f, "wgpu"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_opens_each_device_under_its_given_name() {
        let opened = DeviceSpec::open_list("cpu, cpu:1").unwrap();
        let named: Vec<_> = opened.iter().map(|(n, s, _)| (n.as_str(), *s)).collect();
        assert_eq!(
            named,
            [("cpu", DeviceSpec::Cpu(0)), ("cpu:1", DeviceSpec::Cpu(1))]
        );
        assert!(DeviceSpec::open_list("cpu,tpu").is_err());
    }

    #[test]
    fn parses_every_documented_form() {
        assert_eq!(
            DeviceSpec::parse_list("cpu, cpu:1,cuda:2,wgpu").unwrap(),
            vec![
                DeviceSpec::Cpu(0),
                DeviceSpec::Cpu(1),
                DeviceSpec::Cuda(2),
                DeviceSpec::Wgpu
            ]
        );
        assert!(matches!(
            "tpu:0".parse::<DeviceSpec>(),
            Err(DeviceSpecError::Unknown(_))
        ));
        assert!("cpu:x".parse::<DeviceSpec>().is_err());
        assert_eq!(DeviceSpec::Cuda(3).to_string(), "cuda:3");
    }

    #[test]
    fn a_missing_device_names_what_the_machine_has_instead() {
        assert_eq!(
            what_there_is("cuda", 1, CUDA_FIX),
            "this machine has one cuda device, cuda:0"
        );
        assert_eq!(
            what_there_is("cuda", 4, CUDA_FIX),
            "this machine has 4 cuda devices, cuda:0 to cuda:3"
        );
        assert!(what_there_is("cuda", 0, CUDA_FIX).contains("nvidia-smi"));
        let err = DeviceSpecError::Unavailable {
            spec: "cuda:7".into(),
            reason: what_there_is("cuda", 1, CUDA_FIX),
        };
        assert_eq!(
            err.to_string(),
            "device `cuda:7` is not available: this machine has one cuda device, cuda:0"
        );
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_names_the_feature() {
        let err = DeviceSpec::Cuda(0).device().unwrap_err();
        assert_eq!(
            err.to_string(),
            "device `cuda:0` needs kiln built with `--features cuda`"
        );
    }
}
