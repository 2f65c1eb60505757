//! The KDK leapfrog: second order with a fixed step, tight energy conservation with the
//! adaptive step, momentum conserved to rounding. Plummer sphere, N = 1000, Hénon units
//! (crossing time 2√2), direct forces.

mod common;

use common::*;

/// Runs a Plummer config in a temporary folder and returns its diagnostics.
fn run(name: &str, t_end: f64, dt_max: f64, integrator: &str) -> Diagnostics {
    run_with(name, t_end, dt_max, integrator, "")
}

/// `run` with extra lines in `[gravity]`.
fn run_with(name: &str, t_end: f64, dt_max: f64, integrator: &str, gravity: &str) -> Diagnostics {
    let dir = tempfile::tempdir().unwrap();
    let cfg = plummer_config(name, 1000, t_end, dt_max, integrator, "")
        .replace("softening = 0.05", &format!("softening = 0.05\n{gravity}"));
    let cfg = write(dir.path(), "run.toml", &cfg);
    let out = run_in(dir.path(), &["run", cfg.to_str().unwrap(), "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Diagnostics::read(&dir.path().join("runs").join(name).join("diagnostics.csv"))
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

#[test]
fn fixed_step_energy_error_is_second_order() {
    // Energy error of a symplectic integrator oscillates; its largest excursion over a
    // fixed time is the robust measure of the step's truncation error.
    let t_end = 4.0;
    let coarse = run("coarse", t_end, 1.0 / 64.0, "fixed_step = true");
    let fine = run("fine", t_end, 1.0 / 128.0, "fixed_step = true");
    let (e1, e2) = (
        max_abs(&coarse.column("rel_energy_error")),
        max_abs(&fine.column("rel_energy_error")),
    );
    let ratio = e1 / e2;
    eprintln!("max |dE/E|: dt = 1/64 -> {e1:e}, dt = 1/128 -> {e2:e}, ratio {ratio:.3}");
    assert!(
        (3.0..=5.0).contains(&ratio),
        "halving dt should cut the error 4 ± 1 x, got {ratio}"
    );
    assert_eq!(coarse.rows.len(), 257);
    assert_eq!(fine.rows.len(), 513);
}

#[test]
fn adaptive_step_conserves_energy_and_momentum_over_ten_crossing_times() {
    let t_cross = 2.0 * 2f64.sqrt();
    let t_end = 28.5; // > 10 crossing times, a whole number of dt_max = 1/16
    assert!(t_end > 10.0 * t_cross);
    // The Plummer kernel keeps this long direct-summation run cheap; the integrator does not
    // depend on the kernel.
    let d = run_with(
        "adaptive",
        t_end,
        1.0 / 16.0,
        "eta = 0.01",
        "kernel = \"plummer\"",
    );
    let de = max_abs(&d.column("rel_energy_error"));
    let steps = d.rows.len() - 1;
    eprintln!("eta = 0.01: {steps} steps, max |dE/E| = {de:e}");
    assert!(
        de < 1e-5,
        "relative energy error {de:e} over 10 crossing times"
    );
    let dts = d.column("dt");
    assert!(
        dts[1..].iter().all(|&dt| dt < 1.0 / 16.0),
        "the criterion should limit the step"
    );

    // Momentum, relative to the Σ m|v| scale of the system. By Cauchy-Schwarz
    // Σ m|v| <= sqrt(2 K M) (M = 1); for a Plummer sphere the two differ by under 10%.
    let (px, py, pz) = (d.column("px"), d.column("py"), d.column("pz"));
    let kinetic = d.column("kinetic");
    for i in 0..d.rows.len() {
        let p = (px[i] * px[i] + py[i] * py[i] + pz[i] * pz[i]).sqrt();
        let scale = (2.0 * kinetic[i]).sqrt();
        assert!(p < 1e-12 * scale, "row {i}: |P| = {p:e} vs scale {scale:e}");
    }
}

#[test]
fn fmm_run_conserves_energy_and_momentum_over_200_steps() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = plummer_config("fmm", 20_000, 3.125, 1.0 / 64.0, "fixed_step = true", "").replace(
        "solver = \"direct\"\nsoftening = 0.05",
        "solver = \"fmm\"\nsoftening = 0.01",
    );
    assert!(cfg.contains("solver = \"fmm\""));
    let cfg = write(dir.path(), "run.toml", &cfg);
    let out = run_in(dir.path(), &["run", cfg.to_str().unwrap(), "--quiet"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = Diagnostics::read(&dir.path().join("runs/fmm/diagnostics.csv"));
    assert_eq!(d.rows.len(), 201);
    let de = max_abs(&d.column("rel_energy_error"));
    let (px, py, pz) = (d.column("px"), d.column("py"), d.column("pz"));
    let kinetic = d.column("kinetic");
    let mut dp: f64 = 0.0;
    for i in 0..d.rows.len() {
        let p = (px[i] * px[i] + py[i] * py[i] + pz[i] * pz[i]).sqrt();
        dp = dp.max(p / (2.0 * kinetic[i]).sqrt());
    }
    let retries: f64 = d.column("fmm_retries")[2..].iter().sum();
    eprintln!(
        "FMM, 200 steps: max |dE/E| = {de:e}, max |P|/sum m|v| = {dp:e}, retries after step 1: {retries}"
    );
    assert!(de < 1e-4, "energy error {de:e}");
    assert!(dp < 1e-6, "momentum error {dp:e}");
    assert_eq!(retries, 0.0, "steady-state steps must reuse the caps");
}
