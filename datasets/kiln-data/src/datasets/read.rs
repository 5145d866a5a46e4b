//! Reading whole files with errors that name them.

use std::io::Read;
use std::path::Path;

use crate::DataError;

/// Reads `path` entirely; a `.gz` file is decompressed.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, DataError> {
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        source,
    };
    let raw = std::fs::read(path).map_err(io)?;
    if path.extension().is_some_and(|ext| ext == "gz") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(io)?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// A format error for `path`.
pub(crate) fn format_error(path: &Path, detail: impl Into<String>) -> DataError {
    DataError::Format {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}
