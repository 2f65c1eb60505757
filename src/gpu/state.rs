//! A run's particles resident on the device (design §7; the GPU side of
//! `integrate::leapfrog` and `integrate::diagnostics`): load and store, migration between
//! ranks, kick (global and per-particle steps), drift, the step criterion's maxima and the
//! conserved sums, and downloads of positions, velocities and accelerations.

use super::buffers::{Reused, SPARE_ROOM};
use super::context::{BLOCK, GpuFmm, flat, grid};
use super::error::GpuError;
use super::memory::resident_f64_counts;
use crate::gravity::external::EXTERNAL_TERM;
use crate::integrate::diagnostics::CONSERVED_SUMS;
use crate::particles::Particles;
use cudarc::driver::{CudaFunction, CudaSlice, PushKernelArg};

/// The fewest rows the scratch of a migration's leaving particles has room for
/// (`GpuFmm::migrate_state`, and the download of their velocities).
const LEAVING_FLOOR: usize = 1024;

/// A run's particle state on the device (design §7), in the run's particle order: what the
/// integrator kicks and drifts between force evaluations. `GpuFmm` creates and updates it;
/// the host copy is brought up to date only when it is read.
pub struct DeviceState {
    pub(super) n: usize,
    /// Particles its buffers hold (at least `n`: a state rebuilt by `migrate_state` has
    /// room to spare, so that the next migration can reuse it).
    pub(super) capacity: usize,
    pub(super) pos: CudaSlice<f64>,
    pub(super) vel: CudaSlice<f64>,
    pub(super) mass: CudaSlice<f64>,
    pub(super) acc: CudaSlice<f64>,
    pub(super) pot: CudaSlice<f64>,
    pub(super) block_max: CudaSlice<f64>,
    pub(super) partial: CudaSlice<f64>,
    pub(super) component: CudaSlice<u8>,
    /// The particles' ids, which order runs of equal keys.
    pub(super) id: CudaSlice<u64>,
    /// The block scheme's buffers (grown at their first use): the steps of its last kick
    /// (`GpuFmm::kick_each`), the rows of the particles a kick or a download of
    /// accelerations is for (a sub-step's active ones), and those accelerations gathered
    /// for the download (`GpuFmm::accelerations`).
    pub(super) steps: Reused<f64>,
    pub(super) rows: Reused<u32>,
    pub(super) picked: Reused<f64>,
    /// An external potential's terms (`ExternalPotential::device_terms`), uploaded with
    /// each use (a few dozen values).
    pub(super) terms: Reused<f64>,
}

impl DeviceState {
    /// How many particles it holds.
    pub fn particles(&self) -> usize {
        self.n
    }
}

impl GpuFmm {
    /// The particles' state on the device: positions, velocities, masses, accelerations
    /// and components of `particles` (their order).
    pub fn load_state(&self, particles: &Particles) -> Result<DeviceState, GpuError> {
        let n = particles.len();
        let mut state = self.alloc_state(n, n)?;
        self.upload_rows(&mut state, particles, 0)?;
        if particles.acc.len() == n && n > 0 {
            self.stream
                .memcpy_htod(&flat(&particles.acc), &mut state.acc)?;
        }
        if particles.pot.len() == n && n > 0 {
            self.stream.memcpy_htod(&particles.pot, &mut state.pot)?;
        }
        Ok(state)
    }

    /// A state of `n` particles, all zero, with room for `capacity` (at least `n`).
    fn alloc_state(&self, n: usize, capacity: usize) -> Result<DeviceState, GpuError> {
        let stream = &self.stream;
        let capacity = capacity.max(n);
        let [pos, vel, mass, acc, pot, block_max, partial] = resident_f64_counts(capacity);
        let zeros = |count: usize| stream.alloc_zeros::<f64>(count.max(1));
        Ok(DeviceState {
            n,
            capacity,
            pos: zeros(pos)?,
            vel: zeros(vel)?,
            mass: zeros(mass)?,
            acc: zeros(acc)?,
            pot: zeros(pot)?,
            block_max: zeros(block_max)?,
            partial: zeros(partial)?,
            component: stream.alloc_zeros::<u8>(capacity.max(1))?,
            id: stream.alloc_zeros::<u64>(capacity.max(1))?,
            steps: Reused::new(stream, 0)?,
            rows: Reused::new(stream, 0)?,
            picked: Reused::new(stream, 0)?,
            terms: Reused::new(stream, 0)?,
        })
    }

    /// The positions, velocities (when `particles` has them), masses, ids and components
    /// of the rows `first..` of `particles` into the same rows of `state` (its other rows
    /// stay as they are).
    fn upload_rows(
        &self,
        state: &mut DeviceState,
        particles: &Particles,
        first: usize,
    ) -> Result<(), GpuError> {
        let stream = &self.stream;
        let n = particles.len();
        if state.n != n || first > n {
            return Err(GpuError::Unsupported(format!(
                "rows {first}.. of {n} particles into a device state of {}",
                state.n
            )));
        }
        if n == 0 {
            return Ok(());
        }
        if first < n {
            let component: Vec<u8> = particles.component[first..]
                .iter()
                .map(|c| c.index() as u8)
                .collect();
            stream.memcpy_htod(&component, &mut state.component.slice_mut(first..n))?;
            stream.memcpy_htod(&particles.id[first..], &mut state.id.slice_mut(first..n))?;
            let pos = flat(&particles.pos[first..]);
            stream.memcpy_htod(&pos, &mut state.pos.slice_mut(3 * first..3 * n))?;
            if particles.vel.len() == n {
                let vel = flat(&particles.vel[first..]);
                stream.memcpy_htod(&vel, &mut state.vel.slice_mut(3 * first..3 * n))?;
            }
            let mass = &particles.mass[first..];
            stream.memcpy_htod(mass, &mut state.mass.slice_mut(first..n))?;
        }
        Ok(())
    }

    /// `state` as the rank's new set `particles` after a migration
    /// (`distributed::decomposition::migrate`): the rows of `state` not in `leaving`
    /// (strictly increasing) stay, in order, keeping their positions, velocities, masses,
    /// accelerations, potentials, ids and components, gathered on the device (only the
    /// leaving rows go up, and the device finds the staying ones: kernels/integrate.cu,
    /// `staying_rows`); the arrivals, the rows of `particles` after them, come up with zero
    /// accelerations and potentials (the host's copy of theirs is the device's).
    /// `particles` must list the staying rows' ids and components as the device has them
    /// (`migrate` keeps them in order). The new set is built in `spare` (a state kept for
    /// it, allocated with room to spare when it has too little), and the old one becomes
    /// the spare: after the first few migrations a step allocates nothing (design §7).
    pub fn migrate_state(
        &self,
        state: &mut DeviceState,
        spare: &mut Option<DeviceState>,
        leaving: &[u32],
        particles: &Particles,
    ) -> Result<(), GpuError> {
        let n = particles.len();
        let increasing = leaving.windows(2).all(|w| w[0] < w[1]);
        let below = leaving.last().is_none_or(|&r| (r as usize) < state.n);
        if !increasing || !below || leaving.len() > state.n || state.n - leaving.len() > n {
            return Err(GpuError::Unsupported(format!(
                "{} of {} particles on the device leaving, for a set of {n}",
                leaving.len(),
                state.n
            )));
        }
        let kept = state.n - leaving.len();
        let stream = self.stream.clone();
        let mut next = match spare.take() {
            Some(next) if next.capacity >= n => next,
            _ => self.alloc_state(n, n + n.div_ceil(SPARE_ROOM))?,
        };
        next.n = n;
        // The scratch of the block scheme stays with the particles' state, grown as it is.
        std::mem::swap(&mut next.steps, &mut state.steps);
        std::mem::swap(&mut next.rows, &mut state.rows);
        std::mem::swap(&mut next.picked, &mut state.picked);
        if kept > 0 {
            // The leaving rows in the old state's (now free) row scratch, the staying ones
            // found from them into the new state's.
            // At least LEAVING_FLOOR rows, so that a few more leaving than last time do not
            // allocate again.
            state.rows.room(&stream, leaving.len().max(LEAVING_FLOOR))?;
            if !leaving.is_empty() {
                state.rows.upload(&stream, leaving)?;
            }
            next.rows.room(&stream, kept)?;
            let (leaving_count, all) = (leaving.len() as u32, state.n as u32);
            let mut launch = stream.launch_builder(&self.kernels.staying_rows);
            launch
                .arg(&state.rows.buf)
                .arg(&leaving_count)
                .arg(&all)
                .arg(&mut next.rows.buf);
            // SAFETY: the arguments match staying_rows's signature; `leaving` is increasing
            // and below state.n (checked above), so the state.n - leaving rows written are
            // the first `kept` of next.rows.
            unsafe { launch.launch(grid(state.n)) }?;
            let count = kept as u32;
            for (from, to, width) in [
                (&state.pos, &mut next.pos, 3u32),
                (&state.vel, &mut next.vel, 3),
                (&state.mass, &mut next.mass, 1),
                (&state.acc, &mut next.acc, 3),
                (&state.pot, &mut next.pot, 1),
            ] {
                let mut launch = stream.launch_builder(&self.kernels.gather_rows);
                launch
                    .arg(from)
                    .arg(&next.rows.buf)
                    .arg(&count)
                    .arg(&width)
                    .arg(to);
                // SAFETY: the arguments match gather_rows's signature; every row is a
                // particle of `state`, and `to` holds `width` values for each of n >= kept.
                unsafe { launch.launch(grid(kept * width as usize)) }?;
            }
            let mut launch = stream.launch_builder(&self.kernels.gather_labels);
            launch
                .arg(&state.id)
                .arg(&state.component)
                .arg(&next.rows.buf)
                .arg(&count)
                .arg(&mut next.id)
                .arg(&mut next.component);
            // SAFETY: the arguments match gather_labels's signature; every row is a
            // particle of `state`, and `next` holds n >= kept ids and components.
            unsafe { launch.launch(grid(kept)) }?;
        }
        if n > kept {
            stream.memset_zeros(&mut next.acc.slice_mut(3 * kept..3 * n))?;
            stream.memset_zeros(&mut next.pot.slice_mut(kept..n))?;
        }
        self.upload_rows(&mut next, particles, kept)?;
        stream.synchronize()?;
        *spare = Some(std::mem::replace(state, next));
        Ok(())
    }

    /// `v += a dt` on the device.
    pub fn kick(&self, state: &mut DeviceState, dt: f64) -> Result<(), GpuError> {
        let kernel = &self.kernels.kick;
        self.add_scaled(kernel, &mut state.vel, &state.acc, dt, state.n)
    }

    /// The block scheme's kick on the device, `v += a h[k]` for the k-th particle of `rows`
    /// (of all without them), with the host's bits (`leapfrog::kick_each`).
    pub fn kick_each(
        &self,
        state: &mut DeviceState,
        rows: Option<&[u32]>,
        h: &[f64],
    ) -> Result<(), GpuError> {
        let count = rows.map_or(state.n, <[u32]>::len);
        if h.len() != count || rows.is_some_and(|r| r.iter().any(|&i| i as usize >= state.n)) {
            return Err(GpuError::Unsupported(format!(
                "{} steps for {count} of the {} particles on the device",
                h.len(),
                state.n
            )));
        }
        if count == 0 {
            return Ok(());
        }
        if let Some(rows) = rows {
            state.rows.room(&self.stream, count)?;
            state.rows.upload(&self.stream, rows)?;
        }
        state.steps.room(&self.stream, count)?;
        state.steps.upload(&self.stream, h)?;
        let (listed, count32) = (u32::from(rows.is_some()), count as u32);
        let mut launch = self.stream.launch_builder(&self.kernels.kick_each);
        launch
            .arg(&mut state.vel)
            .arg(&state.acc)
            .arg(&state.rows.buf)
            .arg(&listed)
            .arg(&state.steps.buf)
            .arg(&count32);
        // SAFETY: the arguments match kick_each's signature; vel and acc hold 3 n values,
        // steps `count`, and rows (read only when listed) `count` rows below n.
        unsafe { launch.launch(grid(count)) }?;
        Ok(())
    }

    /// `x += v dt` on the device.
    pub fn drift(&self, state: &mut DeviceState, dt: f64) -> Result<(), GpuError> {
        let kernel = &self.kernels.drift;
        self.add_scaled(kernel, &mut state.pos, &state.vel, dt, state.n)
    }

    /// `out += by dt` for `n` particles' 3-vectors with `kernel` (kick or drift, which
    /// share a signature).
    fn add_scaled(
        &self,
        kernel: &CudaFunction,
        out: &mut CudaSlice<f64>,
        by: &CudaSlice<f64>,
        dt: f64,
        n: usize,
    ) -> Result<(), GpuError> {
        let n32 = n as u32;
        let mut launch = self.stream.launch_builder(kernel);
        launch.arg(out).arg(by).arg(&dt).arg(&n32);
        // SAFETY: the arguments match kick's and drift's signature; both buffers hold 3 n
        // values.
        unsafe { launch.launch(grid(n)) }?;
        Ok(())
    }

    /// The largest |a| of each component's particles (`Component::index` order; 0 where
    /// there are none), with the host's bits (`leapfrog::max_acceleration_by_component`):
    /// per-block maxima of |a|² on the device, their maximum and square root here.
    pub fn max_acceleration_by_component(
        &self,
        state: &mut DeviceState,
    ) -> Result<[f64; 4], GpuError> {
        let n32 = state.n as u32;
        let mut launch = self.stream.launch_builder(&self.kernels.max_acc);
        launch
            .arg(&state.acc)
            .arg(&state.component)
            .arg(&n32)
            .arg(&mut state.block_max);
        // SAFETY: as above, for max_acceleration_blocks (block_max holds 4 per block).
        unsafe { launch.launch(grid(state.n)) }?;
        // The blocks of these particles only (a state may have room for more).
        let used = 4 * state.n.div_ceil(BLOCK as usize).max(1);
        let blocks = self.stream.clone_dtoh(&state.block_max.slice(0..used))?;
        self.stream.synchronize()?;
        let mut best = [0.0f64; 4];
        for m in blocks.chunks_exact(4) {
            for c in 0..4 {
                best[c] = best[c].max(m[c]);
            }
        }
        Ok(best.map(f64::sqrt))
    }

    /// The sums behind the diagnostics' conserved quantities (`Conserved::sums`), with the
    /// host's bits: per chunk on the device, the chunks added in order here.
    pub fn conserved_sums(
        &self,
        state: &mut DeviceState,
    ) -> Result<[f64; CONSERVED_SUMS], GpuError> {
        let n32 = state.n as u32;
        let chunks = state.n.div_ceil(crate::sum::CHUNK);
        let mut launch = self.stream.launch_builder(&self.kernels.conserved);
        launch
            .arg(&state.pos)
            .arg(&state.vel)
            .arg(&state.mass)
            .arg(&state.pot)
            .arg(&n32)
            .arg(&mut state.partial);
        // SAFETY: the arguments match conserved_chunks's signature; partial holds 12 values
        // per chunk (one thread per chunk).
        unsafe { launch.launch(grid(chunks)) }?;
        let partial = self
            .stream
            .clone_dtoh(&state.partial.slice(0..CONSERVED_SUMS * chunks))?;
        self.stream.synchronize()?;
        let mut total = [0.0; CONSERVED_SUMS];
        for chunk in partial.chunks_exact(CONSERVED_SUMS) {
            for (t, &c) in total.iter_mut().zip(chunk) {
                *t += c;
            }
        }
        Ok(total)
    }

    /// `acc += a_ext(x)` on the device for the particles `rows` (all without them): the
    /// external potential `terms` (`ExternalPotential::device_terms`).
    pub fn add_external(
        &self,
        state: &mut DeviceState,
        terms: &[f64],
        rows: Option<&[u32]>,
    ) -> Result<(), GpuError> {
        let count = rows.map_or(state.n, <[u32]>::len);
        if rows.is_some_and(|r| r.iter().any(|&i| i as usize >= state.n)) {
            return Err(GpuError::Unsupported(format!(
                "external forces for rows beyond the {} particles on the device",
                state.n
            )));
        }
        if count == 0 || terms.is_empty() {
            return Ok(());
        }
        if let Some(rows) = rows {
            state.rows.room(&self.stream, count)?;
            state.rows.upload(&self.stream, rows)?;
        }
        state.terms.room(&self.stream, terms.len())?;
        state.terms.upload(&self.stream, terms)?;
        let term_count = (terms.len() / EXTERNAL_TERM) as u32;
        let (listed, count32) = (u32::from(rows.is_some()), count as u32);
        let mut launch = self.stream.launch_builder(&self.kernels.add_external);
        launch
            .arg(&state.pos)
            .arg(&mut state.acc)
            .arg(&state.terms.buf)
            .arg(&term_count)
            .arg(&state.rows.buf)
            .arg(&listed)
            .arg(&count32);
        // SAFETY: the arguments match add_external's signature; pos and acc hold 3 n
        // values, terms `term_count` terms, rows (read only when listed) `count` rows below n.
        unsafe { launch.launch(grid(count)) }?;
        Ok(())
    }

    /// Σ m Φ_ext of the state's particles (the external potential `terms`), with the
    /// host's bits but for the logarithms: per chunk on the device, the chunks added in
    /// order here, as `ExternalPotential::energy` sums.
    pub fn external_energy(&self, state: &mut DeviceState, terms: &[f64]) -> Result<f64, GpuError> {
        if state.n == 0 || terms.is_empty() {
            return Ok(0.0);
        }
        state.terms.room(&self.stream, terms.len())?;
        state.terms.upload(&self.stream, terms)?;
        let term_count = (terms.len() / EXTERNAL_TERM) as u32;
        let n32 = state.n as u32;
        let chunks = state.n.div_ceil(crate::sum::CHUNK);
        let mut launch = self.stream.launch_builder(&self.kernels.external_energy);
        launch
            .arg(&state.pos)
            .arg(&state.mass)
            .arg(&n32)
            .arg(&state.terms.buf)
            .arg(&term_count)
            .arg(&mut state.partial);
        // SAFETY: the arguments match external_energy_chunks's signature; partial holds
        // CONSERVED_SUMS values per chunk (one is used here), one thread per chunk.
        unsafe { launch.launch(grid(chunks)) }?;
        let partial = self.stream.clone_dtoh(&state.partial.slice(0..chunks))?;
        self.stream.synchronize()?;
        Ok(partial.iter().sum())
    }

    /// Copies the positions of `state` into `pos` (the host's tree build needs them).
    /// Through the page-locked stage: a K-rank run brings them down every step.
    pub fn positions(&mut self, state: &DeviceState, pos: &mut [[f64; 3]]) -> Result<(), GpuError> {
        let n = state.n;
        if pos.len() != n {
            return Err(GpuError::Unsupported(format!(
                "positions of {n} particles into {}",
                pos.len()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let src = state.pos.slice(0..3 * n);
        self.stage
            .download(&self.stream, &src, pos.as_flattened_mut())
    }

    /// Copies the accelerations of `state` into `acc`, or with `only` those of the listed
    /// particles (gathered on the device: a block sub-step's active ones, whose step
    /// criterion reads them; the others in `acc` stay as they were).
    pub fn accelerations(
        &mut self,
        state: &mut DeviceState,
        acc: &mut [[f64; 3]],
        only: Option<&[u32]>,
    ) -> Result<(), GpuError> {
        let n = state.n;
        if acc.len() != n || only.is_some_and(|r| r.iter().any(|&i| i as usize >= n)) {
            return Err(GpuError::Unsupported(format!(
                "accelerations of {n} particles into {}, or of rows beyond them",
                acc.len()
            )));
        }
        match only {
            None => {
                let all = acc.as_flattened_mut();
                self.stage
                    .download(&self.stream, &state.acc.slice(0..3 * n), all)
            }
            Some(rows) => {
                let DeviceState {
                    acc: from,
                    rows: index,
                    picked,
                    ..
                } = state;
                self.download_rows(from, rows, index, picked, acc)
            }
        }
    }

    /// Copies the velocities of the particles of `rows` of `state` into those rows of
    /// `vel` (gathered on the device: the particles about to leave a rank).
    pub fn velocities(
        &mut self,
        state: &mut DeviceState,
        rows: &[u32],
        vel: &mut [[f64; 3]],
    ) -> Result<(), GpuError> {
        let n = state.n;
        if vel.len() != n || rows.iter().any(|&i| i as usize >= n) {
            return Err(GpuError::Unsupported(format!(
                "velocities of {n} particles into {}, or of rows beyond them",
                vel.len()
            )));
        }
        let DeviceState {
            vel: from,
            rows: index,
            picked,
            ..
        } = state;
        self.download_rows(from, rows, index, picked, vel)
    }

    /// The 3-vectors of `rows` of a state's column `from` into those rows of `out`,
    /// gathered on the device (through the state's `index` and `picked` buffers).
    fn download_rows(
        &mut self,
        from: &CudaSlice<f64>,
        rows: &[u32],
        index: &mut Reused<u32>,
        picked: &mut Reused<f64>,
        out: &mut [[f64; 3]],
    ) -> Result<(), GpuError> {
        if rows.is_empty() {
            return Ok(());
        }
        let stream = self.stream.clone();
        // At least LEAVING_FLOOR rows (a migration's few leaving particles vary in number).
        let room = rows.len().max(LEAVING_FLOOR);
        index.room(&stream, room)?;
        index.upload(&stream, rows)?;
        picked.room(&stream, 3 * room)?;
        let (count, width) = (rows.len() as u32, 3u32);
        let mut launch = stream.launch_builder(&self.kernels.gather_rows);
        launch
            .arg(from)
            .arg(&index.buf)
            .arg(&count)
            .arg(&width)
            .arg(&mut picked.buf);
        // SAFETY: the arguments match gather_rows's signature; `picked` holds 3 values a
        // row and every row is a particle of the state (the callers check).
        unsafe { launch.launch(grid(3 * rows.len())) }?;
        let mut values = vec![0.0; 3 * rows.len()];
        let gathered = picked.buf.slice(0..3 * rows.len());
        self.stage.download(&stream, &gathered, &mut values)?;
        for (&i, v) in rows.iter().zip(values.chunks_exact(3)) {
            out[i as usize] = [v[0], v[1], v[2]];
        }
        Ok(())
    }

    /// Copies positions, velocities, accelerations and potentials of `state` into
    /// `particles` (masses and components do not change on the device).
    pub fn store_state(
        &self,
        state: &DeviceState,
        particles: &mut Particles,
    ) -> Result<(), GpuError> {
        let n = state.n;
        let rows = |buf: &CudaSlice<f64>| -> Result<Vec<[f64; 3]>, GpuError> {
            let flat = self.stream.clone_dtoh(&buf.slice(0..3 * n))?;
            Ok(flat.chunks_exact(3).map(|x| [x[0], x[1], x[2]]).collect())
        };
        particles.pos = rows(&state.pos)?;
        particles.vel = rows(&state.vel)?;
        particles.acc = rows(&state.acc)?;
        particles.pot = self.stream.clone_dtoh(&state.pot.slice(0..n))?;
        self.stream.synchronize()?;
        Ok(())
    }
}
