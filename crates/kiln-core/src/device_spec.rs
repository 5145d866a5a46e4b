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
}

impl DeviceSpec {
    /// Parses a comma-separated list such as `cpu:0,cpu:1`.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, DeviceSpecError> {
        text.split(',').map(|part| part.trim().parse()).collect()
    }

    /// The Burn device (without autodiff).
    pub fn device(&self) -> Result<Device, DeviceSpecError> {
        match *self {
            DeviceSpec::Cpu(_) => Ok(Device::flex()),
            DeviceSpec::Cuda(_index) => {
                #[cfg(feature = "cuda")]
                {
                    Ok(Device::cuda(_index))
                }
                #[cfg(not(feature = "cuda"))]
                Err(DeviceSpecError::FeatureMissing {
                    spec: self.to_string(),
                    feature: "cuda",
                })
            }
            DeviceSpec::Wgpu => {
                #[cfg(feature = "wgpu")]
                {
                    Ok(Device::wgpu(burn::tensor::DeviceKind::default()))
                }
                #[cfg(not(feature = "wgpu"))]
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
}
