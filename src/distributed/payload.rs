//! The LET payload when it moves between the ranks' devices (design §6–7): in a distributed
//! evaluation whose passes run on devices, only the locally essential trees' cells travel
//! through the host (`WirePrecision::CellsOnly`); each device computes its own cells'
//! multipoles, and the multipoles of those cells and the positions and masses of the
//! particles sent with them go from the sender's device straight into the receiver's plan
//! on its device: through NCCL when every rank has a GPU of its own, else through the
//! host's communicator. Exact f64 both ways, so a cell's multipole is the sender's own
//! bits, as with `WirePrecision::Double`.

use std::ops::Range;

/// Where one sender's payload lands in the receiver's plan: its cells and particles are
/// contiguous there (`FmmSolver` appends each sender's tree in one piece, in rank order).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Landing {
    /// The plan's index of the sender's first cell.
    pub first_cell: usize,
    /// Cells it sent.
    pub cells: usize,
    /// The plan's index of the first particle it sent.
    pub first_particle: usize,
    /// Particles it sent.
    pub particles: usize,
}

/// One rank's message, in its parts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Message<'a> {
    /// The multipoles of its cells, one after the other.
    pub multipoles: &'a [f64],
    /// Its particles' positions, 3 values each.
    pub pos: &'a [f64],
    /// Their masses.
    pub mass: &'a [f64],
}

/// What this rank's device sends every rank and where what it receives lands, for one
/// evaluation. A message is the multipoles of the cells, in the receiver's cell order, then
/// the particles' positions (3 values each), then their masses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PayloadRoutes {
    /// Values per multipole.
    pub len: usize,
    /// Per rank: the own cells whose multipoles it receives, in its order.
    pub send_cells: Vec<Vec<u32>>,
    /// Per rank: the own particles (tree order) whose positions and masses it receives.
    pub send_particles: Vec<Vec<u32>>,
    /// Per rank: where what it sends lands in this rank's plan (all zero for none).
    pub receive: Vec<Landing>,
}

impl PayloadRoutes {
    /// f64 values of the message to rank `to`.
    pub fn send_values(&self, to: usize) -> usize {
        self.send_cells[to].len() * self.len + 4 * self.send_particles[to].len()
    }

    /// f64 values of the message from rank `from`.
    pub fn receive_values(&self, from: usize) -> usize {
        let l = &self.receive[from];
        l.cells * self.len + 4 * l.particles
    }

    /// Where each rank's part lies in the gathered send buffers (every rank's part after
    /// the previous rank's: `send_cells` and `send_particles` concatenated), as a range of
    /// multipole values and a range of particles.
    pub fn send_parts(&self) -> Vec<(Range<usize>, Range<usize>)> {
        let (mut cells, mut particles) = (0, 0);
        (0..self.send_cells.len())
            .map(|j| {
                let (c, p) = (self.send_cells[j].len(), self.send_particles[j].len());
                let part = (
                    cells * self.len..(cells + c) * self.len,
                    particles..particles + p,
                );
                (cells, particles) = (cells + c, particles + p);
                part
            })
            .collect()
    }

    /// The message to rank `to`, from the gathered send buffers (`send_parts`): the
    /// multipoles (`rows`), the flat positions and the masses.
    pub fn message(&self, to: usize, rows: &[f64], pos: &[f64], mass: &[f64]) -> Vec<f64> {
        let (m, q) = self.send_parts().swap_remove(to);
        [&rows[m], &pos[3 * q.start..3 * q.end], &mass[q]].concat()
    }

    /// Where what rank `from` sends lands in the plan: a range of multipole values and a
    /// range of particles.
    pub fn landing(&self, from: usize) -> (Range<usize>, Range<usize>) {
        let l = &self.receive[from];
        (
            l.first_cell * self.len..(l.first_cell + l.cells) * self.len,
            l.first_particle..l.first_particle + l.particles,
        )
    }

    /// Bytes this rank sends in all.
    pub fn bytes_sent(&self) -> usize {
        8 * (0..self.send_cells.len())
            .map(|j| self.send_values(j))
            .sum::<usize>()
    }

    /// Checks that every route stays inside a plan of `cells` cells and `particles`
    /// particles, with `own_cells` and `own_particles` of this rank's own first (what it
    /// sends comes from those; what it receives lands after them).
    pub fn check(
        &self,
        own_cells: usize,
        own_particles: usize,
        cells: usize,
        particles: usize,
    ) -> Result<(), String> {
        let k = self.receive.len();
        if self.send_cells.len() != k || self.send_particles.len() != k {
            return Err(format!(
                "routes for {k} ranks with sends for another number"
            ));
        }
        let own = |list: &[u32], limit: usize| list.iter().all(|&i| (i as usize) < limit);
        if !self.send_cells.iter().all(|c| own(c, own_cells))
            || !self.send_particles.iter().all(|p| own(p, own_particles))
        {
            return Err("a route sends a cell or particle this rank does not own".into());
        }
        for l in self.receive.iter().filter(|l| l.cells > 0) {
            if l.first_cell < own_cells
                || l.first_cell + l.cells > cells
                || l.first_particle < own_particles
                || l.first_particle + l.particles > particles
            {
                return Err(format!(
                    "a route lands outside the plan's other ranks' cells and particles ({l:?})"
                ));
            }
        }
        Ok(())
    }

    /// The message from rank `from` in its parts, or why it does not fit its landing.
    pub fn split<'a>(&self, from: usize, message: &'a [f64]) -> Result<Message<'a>, String> {
        let l = &self.receive[from];
        if message.len() != self.receive_values(from) {
            return Err(format!(
                "rank {from} sent {} payload values where {} cells and {} particles need {}",
                message.len(),
                l.cells,
                l.particles,
                self.receive_values(from)
            ));
        }
        let (multipoles, rest) = message.split_at(l.cells * self.len);
        let (pos, mass) = rest.split_at(3 * l.particles);
        Ok(Message {
            multipoles,
            pos,
            mass,
        })
    }

    /// Puts the message from rank `from` in its place in a plan's multipoles, flat
    /// positions and masses.
    pub fn land(
        &self,
        from: usize,
        message: &[f64],
        multipoles: &mut [f64],
        pos: &mut [f64],
        mass: &mut [f64],
    ) -> Result<(), String> {
        let m = self.split(from, message)?;
        let (cells, particles) = self.landing(from);
        multipoles[cells].copy_from_slice(m.multipoles);
        pos[3 * particles.start..3 * particles.end].copy_from_slice(m.pos);
        mass[particles].copy_from_slice(m.mass);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routes() -> PayloadRoutes {
        PayloadRoutes {
            len: 2,
            send_cells: vec![vec![], vec![1, 0]],
            send_particles: vec![vec![], vec![2]],
            receive: vec![
                Landing::default(),
                Landing {
                    first_cell: 3,
                    cells: 1,
                    first_particle: 4,
                    particles: 2,
                },
            ],
        }
    }

    #[test]
    fn a_message_lands_at_its_senders_cells_and_particles() {
        let r = routes();
        assert_eq!(r.send_values(1), 2 * 2 + 4);
        assert_eq!(r.bytes_sent(), 64);
        assert_eq!(r.check(3, 4, 4, 6), Ok(()));
        let message = [1.0, 2.0, 10.0, 11.0, 12.0, 20.0, 21.0, 22.0, 0.5, 0.25];
        let (mut m, mut x, mut q) = (vec![0.0; 8], vec![0.0; 18], vec![0.0; 6]);
        r.land(1, &message, &mut m, &mut x, &mut q).unwrap();
        assert_eq!(m, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
        assert_eq!(&x[12..], [10.0, 11.0, 12.0, 20.0, 21.0, 22.0]);
        assert_eq!(q, [0.0, 0.0, 0.0, 0.0, 0.5, 0.25]);
        let short = r.land(1, &message[1..], &mut m, &mut x, &mut q);
        assert!(short.unwrap_err().contains("rank 1 sent 9 payload values"));
    }

    #[test]
    fn each_ranks_message_is_its_part_of_the_gathered_buffers() {
        let r = PayloadRoutes {
            len: 2,
            send_cells: vec![vec![4], vec![], vec![0, 1]],
            send_particles: vec![vec![], vec![], vec![7, 8]],
            receive: vec![Landing::default(); 3],
        };
        assert_eq!(r.send_parts(), [(0..2, 0..0), (2..2, 0..0), (2..6, 0..2)]);
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let pos = [10.0, 11.0, 12.0, 20.0, 21.0, 22.0];
        let mass = [0.5, 0.25];
        assert_eq!(r.message(0, &rows, &pos, &mass), [1.0, 2.0]);
        assert!(r.message(1, &rows, &pos, &mass).is_empty());
        let to_2 = r.message(2, &rows, &pos, &mass);
        assert_eq!(
            to_2,
            [
                3.0, 4.0, 5.0, 6.0, 10.0, 11.0, 12.0, 20.0, 21.0, 22.0, 0.5, 0.25
            ]
        );
        assert_eq!(to_2.len(), r.send_values(2));
    }

    #[test]
    fn check_refuses_routes_outside_the_plan() {
        let r = routes();
        // A landing on own cells, past the plan, or a send of a cell not owned.
        assert!(r.check(4, 4, 5, 6).is_err());
        assert!(r.check(3, 4, 3, 6).is_err());
        assert!(r.check(3, 4, 4, 5).is_err());
        assert!(r.check(1, 4, 4, 6).is_err());
        assert!(r.check(3, 2, 4, 6).is_err());
    }
}
