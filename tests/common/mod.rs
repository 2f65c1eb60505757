//! Helpers shared by the integration tests: the binary, temporary run folders, and readers
//! for the files a run writes.
#![allow(dead_code)]

pub mod emulation;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Serialises in-process HDF5 use between the threads of one test binary: the system
/// libhdf5 is not built thread-safe.
pub fn hdf5_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `leapfmm` binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leapfmm"))
}

/// Absolute path of a file shipped in the repository.
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Runs the binary with `args` in `cwd` and returns its output.
pub fn run_in(cwd: &Path, args: &[&str]) -> Output {
    bin()
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("the leapfmm binary starts")
}

/// Writes the config `text` to `dir/<name>.toml` and runs it with `--quiet` and `extra`
/// in `dir`, asserting that it succeeded; the run's folder (`dir/runs/<name>` for a config
/// with `output_dir = "runs"`).
pub fn run_config(dir: &Path, name: &str, text: &str, extra: &[&str]) -> PathBuf {
    let cfg = write(dir, &format!("{name}.toml"), text);
    let mut args = vec!["run", cfg.to_str().unwrap(), "--quiet"];
    args.extend_from_slice(extra);
    let out = run_in(dir, &args);
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("runs").join(name)
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A Plummer-sphere run config (N-body units) with the given name, particle count, end
/// time and extra TOML lines appended to the given sections.
pub fn plummer_config(
    name: &str,
    n: usize,
    t_end: f64,
    dt_max: f64,
    extra_integrator: &str,
    extra_output: &str,
) -> String {
    format!(
        r#"name = "{name}"
output_dir = "runs"
seed = 7
units = "nbody"

[ics]
model = "{model}"
n = {n}

[gravity]
solver = "direct"
softening = 0.05

[integrator]
t_end = {t_end}
dt_max = {dt_max}
{extra_integrator}

[output]
{extra_output}
"#,
        model = repo("ics/plummer.toml").display()
    )
}

/// Rows of a run's diagnostics.csv as column name → values.
pub struct Diagnostics {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<f64>>,
}

impl Diagnostics {
    pub fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap();
        let mut lines = text.lines();
        let columns: Vec<String> = lines.next().unwrap().split(',').map(String::from).collect();
        let rows = lines
            .map(|l| l.split(',').map(|v| v.parse::<f64>().unwrap()).collect())
            .collect();
        Diagnostics { columns, rows }
    }

    pub fn column(&self, name: &str) -> Vec<f64> {
        let k = self
            .columns
            .iter()
            .position(|c| c == name)
            .unwrap_or_else(|| panic!("no column {name}"));
        self.rows.iter().map(|r| r[k]).collect()
    }
}

/// The raw bytes of a dataset (as stored, no conversion).
pub fn dataset_bytes(file: &Path, dataset: &str) -> Vec<u8> {
    let _hdf5 = hdf5_lock();
    let f = hdf5::File::open(file).unwrap();
    let ds = f.dataset(dataset).unwrap();
    let dtype = ds.dtype().unwrap();
    if dtype.size() == 4 {
        ds.read_raw::<f32>()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect()
    } else {
        ds.read_raw::<f64>()
            .unwrap()
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect()
    }
}

/// Every file under `dir` with its content, for "nothing was damaged" checks; the run
/// folder's lock file (which holds the PID of the last run to open the folder) is left out.
pub fn tree_contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if !p.ends_with(leapfmm::io::lock::LOCK_FILE) {
                    out.push((p.clone(), std::fs::read(&p).unwrap()));
                }
            }
        }
    }
    out.sort();
    out
}

/// What `run_measured` saw of one run of the binary.
pub struct Measured {
    /// Exit status (`None` when a signal ended it).
    pub code: Option<i32>,
    /// Its stderr.
    pub stderr: String,
    /// Its peak resident memory, bytes (`getrusage`'s `ru_maxrss`).
    pub peak_rss: u64,
    /// Wall time from start to exit.
    pub wall: std::time::Duration,
}

/// Runs the binary with `args` in `cwd` and measures its peak resident memory (through
/// `wait4`, which reports that one child's own figure).
#[allow(clippy::zombie_processes)] // reaped by wait4, not Child::wait
pub fn run_measured(cwd: &Path, args: &[&str]) -> Measured {
    let err_path = cwd.join(format!(".stderr-{}", std::process::id()));
    let err_file = std::fs::File::create(&err_path).unwrap();
    let start = std::time::Instant::now();
    let child = bin()
        .current_dir(cwd)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(err_file)
        .spawn()
        .expect("the leapfmm binary starts");
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4 failed");
    let wall = start.elapsed();
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&err_path);
    Measured {
        code,
        stderr,
        peak_rss: usage.ru_maxrss as u64 * 1024,
        wall,
    }
}

/// Polls `cond` every 5 ms until it holds; fails the test after 120 s, naming `what`.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
