//! HIP runtime: being written.
