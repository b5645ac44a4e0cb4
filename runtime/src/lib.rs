//! quantshadow runtime: the vendor-neutral engine.
//!
//! - [`formats`]: element and scale formats, exact decoders and encoders
//! - [`problem`]: `GemmProblem`, the description every interposer fills
//! - [`quantize`]: quantizers that make realistic test data
//! - [`oracle`]: the host reference GEMM in f64, ground truth for everything else
//! - [`metrics`] and [`thresholds`]: one definition of every metric and the pass/fail rules
//! - [`record`]: records leaving the process and their FlatBuffers encoding
//! - [`runfile`]: the append-only, CRC-framed run file
//! - [`transport`]: framing, addresses and the non-blocking client
//! - [`inject`]: fault injection for testing the detector (`QUANTSHADOW_INJECT`)
//! - [`diagnosis`]: alternative readings of a failing call's contract, error maps

pub mod device;
pub mod diagnosis;
pub mod engine;
pub mod formats;
pub mod inject;
pub mod intercept;
pub mod metrics;
pub mod oracle;
pub mod policy;
pub mod problem;
pub mod quantize;
pub mod record;
pub mod rng;
pub mod runfile;
pub mod sketch;
pub mod specs;
pub mod thresholds;
pub mod transport;
pub mod vendor;
