//! Structure-of-arrays particle store.
//!
//! Positions and velocities are f64 (design §4); every per-particle quantity is its own array
//! so solvers can stream exactly the fields they need.
//!
//! Owns the particle arrays; depends on nothing in the crate.

use serde::{Deserialize, Serialize};

/// Which part of a model a particle belongs to; decides its GADGET `PartType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Component {
    /// Dark-matter halo (PartType1).
    Halo,
    /// Stellar disk (PartType2).
    Disk,
    /// Stellar bulge (PartType3).
    Bulge,
    /// Anything else, e.g. the particles of a test sphere (PartType4).
    Generic,
}

impl Component {
    /// All components in PartType order.
    pub const ALL: [Component; 4] = [
        Component::Halo,
        Component::Disk,
        Component::Bulge,
        Component::Generic,
    ];

    /// Position in `ALL` (for per-component tables).
    pub fn index(self) -> usize {
        match self {
            Component::Halo => 0,
            Component::Disk => 1,
            Component::Bulge => 2,
            Component::Generic => 3,
        }
    }

    /// The GADGET particle type this component is written as.
    pub fn part_type(self) -> usize {
        match self {
            Component::Halo => 1,
            Component::Disk => 2,
            Component::Bulge => 3,
            Component::Generic => 4,
        }
    }

    /// The component a GADGET particle type is read as; `None` for gas (PartType0), which
    /// a collisionless code cannot evolve.
    pub fn from_part_type(part_type: usize) -> Option<Component> {
        match part_type {
            1 => Some(Component::Halo),
            2 => Some(Component::Disk),
            3 => Some(Component::Bulge),
            4 | 5 => Some(Component::Generic),
            _ => None,
        }
    }

    /// Lower-case name for messages and files.
    pub fn name(self) -> &'static str {
        match self {
            Component::Halo => "halo",
            Component::Disk => "disk",
            Component::Bulge => "bulge",
            Component::Generic => "generic",
        }
    }
}

/// The particle state of one rank.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Particles {
    /// Positions.
    pub pos: Vec<[f64; 3]>,
    /// Velocities.
    pub vel: Vec<[f64; 3]>,
    /// Accelerations from the last force evaluation.
    pub acc: Vec<[f64; 3]>,
    /// Gravitational potentials from the last force evaluation (self-interaction excluded).
    pub pot: Vec<f64>,
    /// Masses.
    pub mass: Vec<f64>,
    /// Unique, stable identifiers.
    pub id: Vec<u64>,
    /// Model component of each particle.
    pub component: Vec<Component>,
    /// The block scheme's rung of each particle while a force evaluation may move particles
    /// between ranks (it travels with them); empty otherwise, and never in a checkpoint
    /// (which keeps its format).
    #[serde(skip)]
    pub rung: Vec<u8>,
}

impl Particles {
    /// An empty store with room for `n` particles.
    pub fn with_capacity(n: usize) -> Self {
        Particles {
            pos: Vec::with_capacity(n),
            vel: Vec::with_capacity(n),
            acc: Vec::with_capacity(n),
            pot: Vec::with_capacity(n),
            mass: Vec::with_capacity(n),
            id: Vec::with_capacity(n),
            component: Vec::with_capacity(n),
            rung: Vec::new(),
        }
    }

    /// Number of particles.
    pub fn len(&self) -> usize {
        self.pos.len()
    }

    /// True when there are no particles.
    pub fn is_empty(&self) -> bool {
        self.pos.is_empty()
    }

    /// Appends one particle with zero acceleration and potential.
    pub fn push(&mut self, pos: [f64; 3], vel: [f64; 3], mass: f64, id: u64, component: Component) {
        self.pos.push(pos);
        self.vel.push(vel);
        self.acc.push([0.0; 3]);
        self.pot.push(0.0);
        self.mass.push(mass);
        self.id.push(id);
        self.component.push(component);
    }

    /// Appends all particles of `other`.
    pub fn extend(&mut self, other: Particles) {
        self.pos.extend(other.pos);
        self.vel.extend(other.vel);
        self.acc.extend(other.acc);
        self.pot.extend(other.pot);
        self.mass.extend(other.mass);
        self.id.extend(other.id);
        self.component.extend(other.component);
        self.rung.extend(other.rung);
    }

    /// A copy of the particles at positions `range` (accelerations and potentials where
    /// present).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Particles {
        let part = |v: &[[f64; 3]]| v.get(range.clone()).map(<[_]>::to_vec).unwrap_or_default();
        Particles {
            pos: part(&self.pos),
            vel: part(&self.vel),
            acc: part(&self.acc),
            pot: self
                .pot
                .get(range.clone())
                .map(<[_]>::to_vec)
                .unwrap_or_default(),
            mass: self.mass[range.clone()].to_vec(),
            id: self.id[range.clone()].to_vec(),
            component: self.component[range.clone()].to_vec(),
            rung: self.rung.get(range).map(<[_]>::to_vec).unwrap_or_default(),
        }
    }

    /// Indices of the particles of one component, in store order.
    pub fn indices_of(&self, component: Component) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| self.component[i] == component)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_rungs_stay_out_of_checkpoints() {
        // Checkpoints encode `Particles` (postcard, not self-describing): a new field would
        // make every earlier checkpoint unreadable.
        let mut p = Particles::with_capacity(1);
        p.push([1.0, 2.0, 3.0], [0.5; 3], 0.25, 7, Component::Disk);
        let plain = crate::io::checkpoint::encode(&p).unwrap();
        p.rung = vec![3];
        assert_eq!(crate::io::checkpoint::encode(&p).unwrap(), plain);
    }
}
