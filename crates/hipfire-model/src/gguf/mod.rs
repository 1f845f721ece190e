//! GGUF v2/v3 reader (over a memory map or any byte slice) and a streaming writer.
//!
//! Spec: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>. The layout is
//! `magic, version, tensor_count, kv_count, kv[], tensor_info[], pad to alignment, data`.
//!
//! # Design
//! Parsing is a pure function of a byte slice ([`GgufIndex::parse`]) so the fuzz target and the
//! malformed-input tests exercise exactly the code the memory-mapped path runs. Every read goes
//! through a private `Cursor`, which bounds-checks against the slice and returns a typed
//! [`GgufError`]; every count read from the file is checked against the bytes that remain
//! before anything is allocated, so a hostile header cannot make us reserve gigabytes.
//! Tensor data stays where it is: [`GgufFile::tensor_data`] hands out sub-slices of the map.

mod quoted;
mod reader;
mod types;
mod writer;

pub use quoted::{Quoted, MAX_QUOTED_CHARS};
pub use reader::{GgufFile, GgufIndex, TensorInfo};
pub use types::{GgmlType, MetaValue, MetaValueType};
pub use writer::{GgufWriter, TensorSpec};

use thiserror::Error;

/// `"GGUF"` read as a little-endian u32 (spec: magic bytes `G G U F`).
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Default data alignment when `general.alignment` is absent (spec: `GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Metadata key that overrides the alignment (spec).
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays inside arrays we accept. The spec allows nesting but no real
/// file nests more than once; the cap keeps recursion bounded on hostile input.
pub const MAX_ARRAY_DEPTH: u32 = 4;
/// Largest alignment we accept. Real files use 32 (rarely 64); the cap only rejects absurd
/// values that would make padding arithmetic meaningless.
pub const MAX_ALIGNMENT: u64 = 1 << 16;
/// Longest tensor name accepted, in bytes: ggml's `GGML_MAX_NAME` (64) less its NUL, the same
/// limit llama.cpp's `gguf_init_from_file` enforces ("tensor name … is too long"), so no file
/// llama.cpp loads is refused, and a flipped bit in a name's length cannot make a name of
/// hundreds of megabytes.
pub const MAX_TENSOR_NAME_BYTES: u64 = 63;
/// Longest metadata key accepted, in bytes: the spec's limit ("at most 2^16-1 characters").
pub const MAX_KEY_BYTES: u64 = (1 << 16) - 1;

/// Everything that can be wrong with a GGUF file. Parsing never panics and never reads
/// outside the input; each failure is one of these. Every name or key in a variant is a
/// [`Quoted`], so no message quotes more than [`MAX_QUOTED_CHARS`] of a string from a file.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum GgufError {
    /// Opening or mapping the file failed.
    #[error("cannot read {path}: {message}")]
    Io {
        /// File path.
        path: String,
        /// OS error text.
        message: String,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file (magic {0:#010x})")]
    BadMagic(u32),
    /// Only versions 2 and 3 are understood (v1 used 32-bit counts and is long gone).
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    /// The input ended in the middle of a field.
    #[error("truncated: {what} at byte {offset} needs {need} bytes, {have} left")]
    Truncated {
        /// Field being read.
        what: &'static str,
        /// Byte offset of the read.
        offset: usize,
        /// Bytes needed.
        need: u64,
        /// Bytes left.
        have: usize,
    },
    /// A count (tensors, keys, array elements, string bytes) cannot fit in the file.
    #[error("absurd {what} {count} at byte {offset}: the file has only {remaining} bytes left")]
    AbsurdCount {
        /// What was counted.
        what: &'static str,
        /// The count read.
        count: u64,
        /// Byte offset of the count.
        offset: usize,
        /// Bytes remaining after the count.
        remaining: usize,
    },
    /// A metadata value type id outside the spec.
    #[error("unknown metadata value type {ty} for key {key}")]
    UnknownValueType {
        /// Key.
        key: Quoted,
        /// Type id read.
        ty: u32,
    },
    /// A bool byte that is neither 0 nor 1.
    #[error("invalid bool byte {0} in metadata")]
    BadBool(u8),
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`].
    #[error("metadata arrays nested deeper than {MAX_ARRAY_DEPTH} (key {0})")]
    TooDeep(Quoted),
    /// The same metadata key twice.
    #[error("duplicate metadata key {0}")]
    DuplicateKey(Quoted),
    /// The same tensor name twice.
    #[error("duplicate tensor name {0}")]
    DuplicateTensor(Quoted),
    /// A tensor name or metadata key longer than its limit ([`MAX_TENSOR_NAME_BYTES`],
    /// [`MAX_KEY_BYTES`]); checked before the bytes are read.
    #[error("{what} of {len} bytes at byte {offset} is longer than the limit of {max} bytes")]
    NameTooLong {
        /// What the string is (`"tensor name"`, `"metadata key"`).
        what: &'static str,
        /// Length read.
        len: u64,
        /// Byte offset of the length.
        offset: usize,
        /// The limit.
        max: u64,
    },
    /// `general.alignment` is zero, not a power of two, not a u32, or too large.
    #[error("invalid general.alignment {0}")]
    BadAlignment(u64),
    /// A tensor with zero or more than [`MAX_DIMS`] dimensions.
    #[error("tensor {name} has {n_dims} dimensions (1..={MAX_DIMS} allowed)")]
    BadDims {
        /// Tensor.
        name: Quoted,
        /// Dimension count read.
        n_dims: u32,
    },
    /// A dimension is zero, or the element / byte count overflows.
    #[error("tensor {name} has invalid shape {dims:?}: {why}")]
    BadShape {
        /// Tensor.
        name: Quoted,
        /// Dimensions read.
        dims: Vec<u64>,
        /// What is wrong.
        why: &'static str,
    },
    /// A GGML type id we do not know the block geometry of.
    #[error("tensor {name} has unknown GGML type id {ty}")]
    UnknownTensorType {
        /// Tensor.
        name: Quoted,
        /// Type id read.
        ty: u32,
    },
    /// A tensor offset not aligned to the file's alignment.
    #[error("tensor {name} offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// Tensor.
        name: Quoted,
        /// Offset relative to the data section.
        offset: u64,
        /// Alignment in force.
        alignment: u64,
    },
    /// A tensor's bytes run past the end of the file.
    #[error(
        "tensor {name} bytes [{start}, {end}) run past the end of the file ({file_len} bytes)"
    )]
    TensorOutOfBounds {
        /// Tensor.
        name: Quoted,
        /// Absolute start.
        start: u64,
        /// Absolute end.
        end: u64,
        /// File length.
        file_len: u64,
    },
    /// Two tensors share bytes.
    #[error("tensors {a} and {b} overlap")]
    OverlappingTensors {
        /// First tensor (lower offset).
        a: Quoted,
        /// Second tensor.
        b: Quoted,
    },
    /// A metadata key the caller needs is missing.
    #[error("missing metadata key {0}")]
    MissingKey(Quoted),
    /// A metadata key has a different type than the caller needs.
    #[error("metadata key {key} is {found}, expected {expected}")]
    WrongType {
        /// Key.
        key: Quoted,
        /// Type wanted.
        expected: &'static str,
        /// Type found.
        found: &'static str,
    },
    /// A tensor the caller asked for does not exist.
    #[error("missing tensor {0}")]
    MissingTensor(Quoted),
    /// Writer misuse or I/O failure while writing.
    #[error("GGUF write error: {0}")]
    Write(String),
}
