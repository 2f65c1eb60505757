//! Surface-density images of a particle set, face-on (x–y) and edge-on (x–z).

use crate::particles::{Component, Particles};

/// A square map of surface density (mass per unit area) on `pixels` × `pixels` cells
/// spanning [-half_width, half_width] on both axes; row 0 is the lowest second coordinate.
#[derive(Debug, Clone, PartialEq)]
pub struct Map {
    /// Cells per side.
    pub pixels: usize,
    /// Half the side length.
    pub half_width: f64,
    /// Surface densities, row by row.
    pub density: Vec<f64>,
}

/// Projection of a map: which two coordinates span it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// x and y (seen from above the disk plane).
    FaceOn,
    /// x and z (seen in the disk plane).
    EdgeOn,
}

/// The surface density of the `component` particles in `view`.
pub fn surface_density(
    p: &Particles,
    component: Component,
    view: View,
    half_width: f64,
    pixels: usize,
) -> Map {
    let mut density = vec![0.0; pixels * pixels];
    let cell = 2.0 * half_width / pixels as f64;
    let second = match view {
        View::FaceOn => 1,
        View::EdgeOn => 2,
    };
    for i in (0..p.len()).filter(|&i| p.component[i] == component) {
        let (a, b) = (p.pos[i][0], p.pos[i][second]);
        let (u, v) = ((a + half_width) / cell, (b + half_width) / cell);
        if u >= 0.0 && v >= 0.0 && u < pixels as f64 && v < pixels as f64 {
            density[v as usize * pixels + u as usize] += p.mass[i] / (cell * cell);
        }
    }
    Map {
        pixels,
        half_width,
        density,
    }
}
