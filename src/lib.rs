//! hipfire: LLM decode when the model does not fit in VRAM, with both engines
//! (GPU over PCIe and the CPU cores) working on the layers that spilled to host memory.
//!
//! This root crate only re-exports the workspace crates so that `tests/` and
//! `examples/` can use one path. The layering is quant ← gpu ← exec ← model ← cli,
//! with config a leaf (see `docs/design.md`).
#![deny(missing_docs)]

pub use hipfire_config as config;
pub use hipfire_exec as exec;
pub use hipfire_gpu as gpu;
pub use hipfire_model as model;
pub use hipfire_quant as quant;
