//! Device memory limits as a user writes them (`--device-memory`): one size for every device,
//! or `name=size` per device, in bytes, kB/MB/GB or KiB/MiB/GiB.

use crate::PlanError;

/// The limit of each device of `names` that `text` gives (`None`: no limit; no text: none).
///
/// ```
/// use kiln_planner::parse_memory_limits;
/// let names = ["cpu:0".to_string(), "cpu:1".to_string()];
/// assert_eq!(parse_memory_limits(Some("cpu:1=1KiB"), &names)?, vec![None, Some(1024)]);
/// assert_eq!(parse_memory_limits(Some("1MB"), &names)?, vec![Some(1_000_000); 2]);
/// # Ok::<(), kiln_planner::PlanError>(())
/// ```
///
/// # Errors
/// [`PlanError::Request`] naming the entry: a device not in `names`, a size that is not one.
pub fn parse_memory_limits(
    text: Option<&str>,
    names: &[String],
) -> Result<Vec<Option<u64>>, PlanError> {
    let Some(text) = text else {
        return Ok(vec![None; names.len()]);
    };
    if !text.contains('=') {
        let bytes = parse_size(text)?;
        return Ok(vec![Some(bytes); names.len()]);
    }
    let mut limits = vec![None; names.len()];
    for entry in text.split(',') {
        let (name, size) = entry.split_once('=').ok_or_else(|| {
            PlanError::Request(format!("--device-memory `{entry}`: expected DEVICE=SIZE"))
        })?;
        let index = names.iter().position(|n| n == name.trim()).ok_or_else(|| {
            PlanError::Request(format!(
                "--device-memory: `{name}` is not one of --devices {names:?}"
            ))
        })?;
        limits[index] = Some(parse_size(size)?);
    }
    Ok(limits)
}

/// `1.5GiB`, `512MB`, `4096` (bytes).
fn parse_size(text: &str) -> Result<u64, PlanError> {
    let refuse = |why: String| PlanError::Request(format!("--device-memory `{text}`: {why}"));
    let text = text.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(refuse(format!("unknown unit `{other}`"))),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| refuse("not a size (e.g. 2GiB, 512MB)".into()))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(refuse("must be positive".into()));
    }
    Ok((value * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::{parse_memory_limits, parse_size};

    #[test]
    fn memory_sizes_parse_and_nonsense_is_refused() {
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("512MB").unwrap(), 512_000_000);
        assert_eq!(parse_size("1.5kb").unwrap(), 1500);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "GiB", "2TiB", "-1GB", "0", "two"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        let names = vec!["cpu:0".to_string(), "cpu:1".to_string()];
        assert!(parse_memory_limits(Some("cuda:0=1GB"), &names).is_err());
        assert_eq!(parse_memory_limits(None, &names).unwrap(), vec![None, None]);
    }
}
