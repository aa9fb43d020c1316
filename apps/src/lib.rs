//! cpnet applications and microbenchmarks. Binaries live in `src/bin/`.
