//! Benchmarks only: see `benches/core.rs`, run with `cargo bench -p dlbridge-bench`.
