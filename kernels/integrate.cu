// The leapfrog's kick and drift on device-resident state (f64, one thread per particle).

extern "C" __global__ void kick(double* __restrict__ vel, const double* __restrict__ acc,
                                double dt, unsigned n) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        vel[3 * i] += acc[3 * i] * dt;
        vel[3 * i + 1] += acc[3 * i + 1] * dt;
        vel[3 * i + 2] += acc[3 * i + 2] * dt;
    }
}

extern "C" __global__ void drift(double* __restrict__ pos, const double* __restrict__ vel,
                                 double dt, unsigned n) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        pos[3 * i] += vel[3 * i] * dt;
        pos[3 * i + 1] += vel[3 * i + 1] * dt;
        pos[3 * i + 2] += vel[3 * i + 2] * dt;
    }
}
