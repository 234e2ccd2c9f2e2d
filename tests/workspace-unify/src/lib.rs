//! No code: see Cargo.toml. Each example that builds candle depends on this crate so that its own
//! build compiles candle's dependency tree with the features the workspace's test build uses.
