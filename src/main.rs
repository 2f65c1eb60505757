//! The `leapfmm` command line (design §3).

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
