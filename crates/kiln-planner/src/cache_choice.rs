//! Where a command keeps the planner's profiles: the per-user cache by default, none, or a
//! directory of the user's (`--profile-cache default|off|DIR`).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Where the planner's profiles are kept between runs.
///
/// The per-user cache is `kiln/planner-profiles` under the platform's cache directory
/// (`$XDG_CACHE_HOME` or `~/.cache` on Linux, `~/Library/Caches` on macOS, the local app
/// data folder on Windows; none where the platform names no cache directory). A profile is
/// reused only for its exact key (model, batch sizes, device, host CPU and its vector
/// instructions, build, precision, optimizer, threads, kiln version), so a home directory
/// shared between machines keeps each kind of host's own.
///
/// ```
/// use kiln_planner::ProfileCacheChoice;
///
/// let choice: ProfileCacheChoice = "off".parse().unwrap();
/// assert_eq!(choice.directory(), None);
/// let mine: ProfileCacheChoice = "runs/profiles".parse().unwrap();
/// assert_eq!(mine.directory(), Some("runs/profiles".into()));
/// assert_eq!(ProfileCacheChoice::default().to_string(), "default");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ProfileCacheChoice {
    /// The per-user cache directory.
    #[default]
    PerUser,
    /// No cache: every run that plans profiles.
    Off,
    /// This directory.
    Directory(PathBuf),
}

impl ProfileCacheChoice {
    /// The per-user cache's directory, `None` where the platform names no cache directory
    /// (no home directory).
    pub fn per_user_directory() -> Option<PathBuf> {
        dirs::cache_dir().map(|dir| dir.join("kiln").join("planner-profiles"))
    }

    /// The directory profiles are kept in, `None` for no cache.
    pub fn directory(&self) -> Option<PathBuf> {
        match self {
            ProfileCacheChoice::PerUser => Self::per_user_directory(),
            ProfileCacheChoice::Off => None,
            ProfileCacheChoice::Directory(dir) => Some(dir.clone()),
        }
    }
}

impl FromStr for ProfileCacheChoice {
    type Err = String;

    /// `default`, `off`, or a directory (a directory named `default` or `off` is `./default`).
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "" => Err("an empty --profile-cache: give default, off or a directory".into()),
            "default" => Ok(ProfileCacheChoice::PerUser),
            "off" => Ok(ProfileCacheChoice::Off),
            dir => Ok(ProfileCacheChoice::Directory(dir.into())),
        }
    }
}

impl fmt::Display for ProfileCacheChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProfileCacheChoice::PerUser => f.write_str("default"),
            ProfileCacheChoice::Off => f.write_str("off"),
            ProfileCacheChoice::Directory(dir) => write!(f, "{}", dir.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ProfileCacheChoice;

    #[test]
    fn choices_parse_and_print_back_and_an_empty_one_is_refused() {
        for text in ["default", "off", "some/dir", "./off"] {
            let choice: ProfileCacheChoice = text.parse().unwrap();
            assert_eq!(choice.to_string(), text);
        }
        assert!(
            "".parse::<ProfileCacheChoice>()
                .unwrap_err()
                .contains("default, off")
        );
        let per_user = ProfileCacheChoice::PerUser.directory();
        assert_eq!(per_user, ProfileCacheChoice::per_user_directory());
        if let Some(dir) = per_user {
            assert!(dir.ends_with("kiln/planner-profiles"), "{}", dir.display());
        }
    }
}
