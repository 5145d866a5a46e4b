//! Reading a wheel: its digest, its RECORD, and unpacking the files under one prefix, each
//! checked against the RECORD.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// Why a wheel could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WheelError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// The file is not a readable zip archive.
    #[error("{path} is not a wheel (zip archive): {source}")]
    Zip {
        /// The file.
        path: PathBuf,
        /// What the zip reader said.
        source: zip::result::ZipError,
    },
    /// The wheel's digest is not the pinned one.
    #[error(
        "{path}: SHA-256 {actual}, expected {expected} (a different or damaged file: download it again)"
    )]
    Digest {
        /// The file.
        path: PathBuf,
        /// Its digest.
        actual: String,
        /// The pinned digest.
        expected: String,
    },
    /// The RECORD is missing, or a file in the wheel disagrees with it.
    #[error("{wheel}: {problem}")]
    Record {
        /// The wheel.
        wheel: PathBuf,
        /// What is wrong.
        problem: String,
    },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> WheelError + '_ {
    move |source| WheelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The lowercase hex SHA-256 of a file.
pub fn file_sha256(path: &Path) -> Result<String, WheelError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    let mut hasher = Sha256::new();
    io::copy(&mut file, &mut hasher).map_err(io_error(path))?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The RECORD of a wheel: path → `sha256=<urlsafe base64, unpadded>` digest.
fn parse_record(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| {
            // `path,sha256=digest,size`; paths with commas are quoted, which wheels of
            // compiled libraries never need: such a line is left out and its file then
            // counts as unrecorded, i.e. refused.
            let mut fields = line.split(',');
            let path = fields.next()?;
            let digest = fields.next()?.strip_prefix("sha256=")?;
            Some((path.to_string(), digest.to_string()))
        })
        .collect()
}

/// Unpacks the files of `wheel` under `prefix` (e.g. `mlc_llvm_static/static/`) into `dest`,
/// the prefix stripped, each checked against the wheel's RECORD and keeping its executable
/// bit. Returns the number of files written.
///
/// # Errors
/// A file missing from the RECORD or differing from it, an unreadable wheel, a path that
/// would leave `dest`, or an I/O failure.
pub fn unpack(wheel: &Path, prefix: &str, dest: &Path) -> Result<usize, WheelError> {
    let file = File::open(wheel).map_err(io_error(wheel))?;
    let zip_error = |source| WheelError::Zip {
        path: wheel.to_path_buf(),
        source,
    };
    let mut archive = zip::ZipArchive::new(file).map_err(zip_error)?;
    let record_name = archive
        .file_names()
        .find(|name| name.ends_with(".dist-info/RECORD"))
        .map(str::to_string)
        .ok_or_else(|| WheelError::Record {
            wheel: wheel.to_path_buf(),
            problem: "no .dist-info/RECORD".into(),
        })?;
    let mut record_text = String::new();
    archive
        .by_name(&record_name)
        .map_err(zip_error)?
        .read_to_string(&mut record_text)
        .map_err(io_error(wheel))?;
    let record = parse_record(&record_text);
    let mut written = 0;
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index).map_err(zip_error)?;
        let name = entry.name().to_string();
        let Some(relative) = name.strip_prefix(prefix) else {
            continue;
        };
        if entry.is_dir() || relative.is_empty() {
            continue;
        }
        let Some(relative) = entry.enclosed_name().and_then(|p| {
            p.strip_prefix(prefix.trim_end_matches('/'))
                .ok()
                .map(Path::to_path_buf)
        }) else {
            return Err(WheelError::Record {
                wheel: wheel.to_path_buf(),
                problem: format!("`{name}` would unpack outside the destination"),
            });
        };
        let expected = record.get(&name).ok_or_else(|| WheelError::Record {
            wheel: wheel.to_path_buf(),
            problem: format!("`{name}` is not in the RECORD"),
        })?;
        let target = dest.join(&relative);
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(io_error(parent))?;
        }
        let mut out = File::create(&target).map_err(io_error(&target))?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 20];
        loop {
            let read = entry.read(&mut buffer).map_err(io_error(wheel))?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
            out.write_all(&buffer[..read]).map_err(io_error(&target))?;
        }
        let actual = URL_SAFE_NO_PAD.encode(hasher.finalize());
        if &actual != expected {
            return Err(WheelError::Record {
                wheel: wheel.to_path_buf(),
                problem: format!("`{name}` has digest {actual}, its RECORD says {expected}"),
            });
        }
        if entry.unix_mode().is_some_and(|mode| mode & 0o111 != 0) {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&target, fs::Permissions::from_mode(0o755))
                .map_err(io_error(&target))?;
        }
        written += 1;
    }
    Ok(written)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Write;
    use zip::write::FileOptions;

    /// Writes a wheel with `files` (name, contents, executable) and a RECORD for them; a
    /// `tamper` name gets a RECORD digest of other contents.
    pub(crate) fn write_wheel(
        path: &Path,
        dist_info: &str,
        files: &[(&str, &str, bool)],
        tamper: Option<&str>,
    ) {
        let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
        let mut record = String::new();
        for &(name, contents, executable) in files {
            let mode = if executable { 0o755 } else { 0o644 };
            zip.start_file(name, FileOptions::default().unix_permissions(mode))
                .unwrap();
            zip.write_all(contents.as_bytes()).unwrap();
            let recorded = if tamper == Some(name) {
                "something else"
            } else {
                contents
            };
            let digest = URL_SAFE_NO_PAD.encode(Sha256::digest(recorded.as_bytes()));
            record.push_str(&format!("{name},sha256={digest},{}\n", contents.len()));
        }
        let record_name = format!("{dist_info}/RECORD");
        record.push_str(&format!("{record_name},,\n"));
        zip.start_file(&record_name, FileOptions::default())
            .unwrap();
        zip.write_all(record.as_bytes()).unwrap();
        zip.finish().unwrap();
    }

    #[test]
    fn unpacks_the_prefix_checked_and_keeps_the_executable_bit() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let wheel = dir.join("a.whl");
        write_wheel(
            &wheel,
            "a-1.dist-info",
            &[
                ("pkg/static/bin/tool", "#!/bin/sh\necho hi\n", true),
                ("pkg/static/lib/libx.a", "archive", false),
                ("pkg/__init__.py", "", false),
            ],
            None,
        );
        let dest = dir.join("out");
        assert_eq!(unpack(&wheel, "pkg/static/", &dest).unwrap(), 2);
        assert_eq!(
            fs::read_to_string(dest.join("lib/libx.a")).unwrap(),
            "archive"
        );
        assert!(!dest.join("__init__.py").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(dest.join("bin/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111);
    }

    #[test]
    fn a_file_that_differs_from_the_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let wheel = dir.join("a.whl");
        write_wheel(
            &wheel,
            "a-1.dist-info",
            &[("pkg/static/lib/libx.a", "archive", false)],
            Some("pkg/static/lib/libx.a"),
        );
        let err = unpack(&wheel, "pkg/static/", &dir.join("out")).unwrap_err();
        assert!(err.to_string().contains("its RECORD says"), "{err}");
    }

    #[test]
    fn a_file_that_is_not_a_wheel_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let dir = dir.path();
        let bogus = dir.join("bogus.whl");
        fs::write(&bogus, "not a zip").unwrap();
        let err = unpack(&bogus, "pkg/static/", &dir.join("out")).unwrap_err();
        assert!(
            err.to_string().contains("bogus.whl is not a wheel"),
            "{err}"
        );
    }
}
