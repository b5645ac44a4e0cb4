//! CUDA runtime: being written.
