//! The `quantshadow` command: collector, report, demo and benchmarks.
