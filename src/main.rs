//! The `leapfmm` command line (design §3).

mod cli;

fn main() -> std::process::ExitCode {
    // Output piped into a program that stops reading (`leapfmm info snap.hdf5 | head`) ends
    // the process quietly, as for any Unix tool, instead of a panic on the failed write.
    // Not for `run`: a closed pipe must not kill a simulation, so SIGPIPE stays ignored
    // (Rust's default) and its messages go through `leapfmm::tell!`, which drops a failed
    // write; the run goes on to its end.
    if std::env::args().nth(1).as_deref() != Some("run") {
        // SAFETY: called first thing in main, before any thread starts; SIG_DFL is a valid
        // disposition for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    cli::main()
}
