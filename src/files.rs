//! Reading input files safely, below every module that reads one (configs and models,
//! presets, manifests, checkpoints, snapshots' neighbours): regular files only, never more
//! bytes than they hold or than the machine has. Owns no format.

use std::io::Read;
use std::path::Path;

/// Reads a whole input file, refusing anything but a regular file (a FIFO would block the
/// run forever, a link to `/dev/zero` would read until memory ran out) and reading no more
/// than its size, which must fit in the memory available.
pub fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    let refuse = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, what);
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(refuse(
            "not a regular file (a folder, FIFO or device); refusing to read it".into(),
        ));
    }
    let len = meta.len();
    if let Some(available) = available_host()
        && len > available
    {
        return Err(refuse(format!(
            "{len} bytes, more than the {available} bytes of memory available"
        )));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    std::fs::File::open(path)?
        .take(len)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// `read_regular` as UTF-8 text.
pub fn read_regular_text(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read_regular(path)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

/// Memory this process may still use: the smaller of the kernel's `MemAvailable` and the
/// room left under a cgroup (container, batch job) limit; `None` where neither is known.
pub fn available_host() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let available = meminfo.as_deref().and_then(|text| {
        text.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let read = |name: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{name}"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    let cgroup =
        read("memory.max").map(|max| max.saturating_sub(read("memory.current").unwrap_or(0)));
    match (available, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}
