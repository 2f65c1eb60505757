//! Progress reporting: an indicatif bar on a terminal, periodic log lines otherwise, and
//! nothing with `--quiet`. Notes and warnings always go to stderr unless quiet.
//!
//! Owns what a run prints while it runs. Must not decide anything about the run.

/// `eprintln!` that never panics: when stderr is closed (`leapfmm run … 2>&1 | head -1`,
/// a pager quit early) the printing stops and the run goes on.
#[macro_export]
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Seconds between log lines when stderr is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// Resolution of the bar (parts of the whole run).
const BAR_STEPS: u64 = 10_000;

/// Seconds left, extrapolated from the simulation time covered since timing started at
/// `time_at_start` — not since t = 0, so a resumed run does not count what it inherited.
fn eta_seconds(elapsed: f64, time_at_start: f64, time: f64, t_end: f64) -> f64 {
    let done_here = time - time_at_start;
    if done_here > 0.0 {
        elapsed * (t_end - time).max(0.0) / done_here
    } else {
        f64::NAN
    }
}

/// How progress is shown.
#[derive(Debug)]
enum Mode {
    Quiet,
    Bar(ProgressBar),
    Log { last: Instant },
}

/// Reports a run's progress in simulation time.
#[derive(Debug)]
pub struct Progress {
    mode: Mode,
    label: String,
    t_end: f64,
    started: Instant,
    steps_at_start: u64,
    time_at_start: f64,
}

impl Progress {
    /// A reporter for a run called `label` that ends at `t_end`; with `group`, its bar
    /// shows below the group's other bars (a campaign's overall bar).
    pub fn new(label: &str, t_end: f64, quiet: bool, group: Option<&MultiProgress>) -> Self {
        let mode = if quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(Some(BAR_STEPS), ProgressDrawTarget::stderr());
            let bar = match group {
                Some(g) => g.add(bar),
                None => bar,
            };
            let style =
                ProgressStyle::with_template("{prefix} [{bar:30}] {percent:>3}% {msg} ETA {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
            bar.set_style(style);
            bar.set_prefix(label.to_string());
            Mode::Bar(bar)
        } else {
            Mode::Log {
                last: Instant::now(),
            }
        };
        Progress {
            mode,
            label: label.to_string(),
            t_end,
            started: Instant::now(),
            steps_at_start: 0,
            time_at_start: 0.0,
        }
    }

    /// Marks the step count the timing starts from (non-zero when resuming).
    pub fn start_at(&mut self, step: u64, time: f64) {
        self.steps_at_start = step;
        self.time_at_start = time;
        self.started = Instant::now();
        if let Mode::Bar(bar) = &self.mode {
            bar.set_position(self.fraction(time));
            bar.reset_eta();
        }
    }

    fn fraction(&self, time: f64) -> u64 {
        ((time / self.t_end).clamp(0.0, 1.0) * BAR_STEPS as f64) as u64
    }

    /// Reports that `step` ended at simulation time `time`.
    pub fn update(&mut self, step: u64, time: f64) {
        let elapsed = self.started.elapsed().as_secs_f64();
        let rate = (step - self.steps_at_start) as f64 / elapsed.max(1e-9);
        let fraction = self.fraction(time);
        let t_end = self.t_end;
        let time_at_start = self.time_at_start;
        match &mut self.mode {
            Mode::Quiet => {}
            Mode::Bar(bar) => {
                bar.set_position(fraction);
                bar.set_message(format!(
                    "t = {time:.4}/{t_end} step {step} {rate:.1} steps/s"
                ));
            }
            Mode::Log { last } => {
                if last.elapsed() >= LOG_EVERY {
                    *last = Instant::now();
                    let done = time / t_end;
                    let eta = eta_seconds(elapsed, time_at_start, time, t_end);
                    crate::tell!(
                        "[{}] t = {time:.6}/{t_end} ({:.1}%), step {step}, {rate:.1} steps/s, ETA {eta:.0} s",
                        self.label,
                        100.0 * done
                    );
                }
            }
        }
    }

    /// Prints a note (unless quiet) without disturbing the bar.
    pub fn note(&self, message: &str) {
        match &self.mode {
            Mode::Quiet => {}
            Mode::Bar(bar) => bar.println(message),
            Mode::Log { .. } => crate::tell!("{message}"),
        }
    }

    /// Prints a warning, even when quiet: the user must see it.
    pub fn warn(&self, message: &str) {
        let line = format!("warning: {message}");
        match &self.mode {
            Mode::Bar(bar) => bar.println(line),
            _ => crate::tell!("{line}"),
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Mode::Bar(bar) = &self.mode {
            bar.finish_and_clear();
        }
    }
}

/// A campaign's overall progress: runs done of all, as a bar above the current run's bar
/// on a terminal, else as log lines.
#[derive(Debug)]
pub struct CampaignProgress {
    bar: Option<ProgressBar>,
    quiet: bool,
    total: u64,
}

impl CampaignProgress {
    /// Progress over `total` runs, its bar in `group`.
    pub fn campaign(group: &MultiProgress, total: u64, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = group.add(ProgressBar::new(total));
            let style = ProgressStyle::with_template("campaign [{bar:30}] {pos}/{len} runs {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            bar
        });
        CampaignProgress { bar, quiet, total }
    }

    /// `done` runs finished; `current` is the one under way.
    pub fn set(&self, done: u64, current: &str) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(done);
                bar.set_message(current.to_string());
            }
            None if !self.quiet && done < self.total => {
                crate::tell!("campaign: run {}/{}: {current}", done + 1, self.total)
            }
            None => {}
        }
    }

    /// Prints a line (unless quiet) without disturbing the bars.
    pub fn note(&self, message: &str) {
        match &self.bar {
            Some(bar) => bar.println(message),
            None if !self.quiet => crate::tell!("{message}"),
            None => {}
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::eta_seconds;

    #[test]
    fn a_resumed_run_extrapolates_from_the_time_covered_since_the_resume() {
        // Resumed at 70% of the run; 10 s of wall time covered 5% more.
        let eta = eta_seconds(10.0, 0.70, 0.75, 1.0);
        assert!((eta - 50.0).abs() < 1e-9, "{eta}");
        assert!(eta_seconds(0.0, 0.5, 0.5, 1.0).is_nan());
        assert_eq!(eta_seconds(10.0, 0.0, 1.0, 1.0), 0.0);
    }
}
