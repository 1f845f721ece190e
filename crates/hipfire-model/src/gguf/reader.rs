//! The bounds-checked GGUF parser.

use std::collections::HashMap;
use std::path::Path;

use super::types::{GgmlType, MetaValue, MetaValueType};
use super::{
    GgufError, Quoted, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ALIGNMENT,
    MAX_ARRAY_DEPTH, MAX_DIMS, MAX_KEY_BYTES, MAX_TENSOR_NAME_BYTES,
};

/// Smallest encoded tensor info: empty name (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 32;
/// Smallest encoded metadata pair: empty key (8) + type (4) + one-byte value (1).
const MIN_KV_BYTES: u64 = 13;

/// One tensor's description, with its byte range resolved and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) length `k`.
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset relative to the start of the data section, as stored in the file.
    pub offset: u64,
    /// Absolute offset of the first byte in the file.
    pub start: u64,
    /// Number of bytes of tensor data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of dims; checked not to overflow at parse time).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Row length `k` (elements per row, `dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(0)
    }

    /// Number of rows (product of `dims[1..]`).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }
}

/// Everything a GGUF header says, checked against the file length. Owns no tensor bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufIndex {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, MetaValue)>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
    /// Data alignment in force.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
    /// Length of the parsed input.
    pub file_len: u64,
    key_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

/// A bounds-checked little-endian reader over a byte slice.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        let have = self.remaining();
        let err = GgufError::Truncated {
            what,
            offset: self.pos,
            need: n,
            have,
        };
        let n = usize::try_from(n).map_err(|_| err.clone())?;
        if n > have {
            return Err(err);
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Read a count and reject it if `count * min_size` bytes cannot remain.
    fn count(&mut self, what: &'static str, min_size: u64) -> Result<u64, GgufError> {
        let offset = self.pos;
        let count = self.u64(what)?;
        let remaining = self.remaining();
        let fits = count
            .checked_mul(min_size)
            .is_some_and(|need| need <= remaining as u64);
        if !fits {
            return Err(GgufError::AbsurdCount {
                what,
                count,
                offset,
                remaining,
            });
        }
        Ok(count)
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.count(what, 1)?;
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// A string whose length must not exceed `max` (names and keys); the length is checked
    /// (against the bytes left, then against `max`) before any byte of it is read.
    fn name(&mut self, what: &'static str, max: u64) -> Result<String, GgufError> {
        let offset = self.pos;
        let len = self.count(what, 1)?;
        if len > max {
            return Err(GgufError::NameTooLong {
                what,
                len,
                offset,
                max,
            });
        }
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, ty: MetaValueType, key: &str, depth: u32) -> Result<MetaValue, GgufError> {
        const W: &str = "metadata value";
        Ok(match ty {
            MetaValueType::U8 => MetaValue::U8(self.u8(W)?),
            MetaValueType::I8 => MetaValue::I8(self.u8(W)? as i8),
            MetaValueType::U16 => MetaValue::U16(self.u16(W)?),
            MetaValueType::I16 => MetaValue::I16(self.u16(W)? as i16),
            MetaValueType::U32 => MetaValue::U32(self.u32(W)?),
            MetaValueType::I32 => MetaValue::I32(self.u32(W)? as i32),
            MetaValueType::F32 => MetaValue::F32(f32::from_bits(self.u32(W)?)),
            MetaValueType::U64 => MetaValue::U64(self.u64(W)?),
            MetaValueType::I64 => MetaValue::I64(self.u64(W)? as i64),
            MetaValueType::F64 => MetaValue::F64(f64::from_bits(self.u64(W)?)),
            MetaValueType::Bool => match self.u8(W)? {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => return Err(GgufError::BadBool(b)),
            },
            MetaValueType::String => MetaValue::String(self.string("metadata string")?),
            MetaValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::TooDeep(key.into()));
                }
                let ty_id = self.u32("array element type")?;
                let elem =
                    MetaValueType::from_id(ty_id).ok_or_else(|| GgufError::UnknownValueType {
                        key: key.into(),
                        ty: ty_id,
                    })?;
                let n = self.count("array length", elem.min_encoded_size())?;
                // `count` proved n * min_size <= remaining bytes, so this allocation is
                // bounded by the input size.
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem, key, depth + 1)?);
                }
                MetaValue::Array(elem, v)
            }
        })
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

impl GgufIndex {
    /// Parse and validate a whole GGUF image. Never panics; every defect is a [`GgufError`].
    ///
    /// Checks: magic, version ∈ {2, 3}, counts against the bytes left, key and tensor-name
    /// lengths ([`super::MAX_KEY_BYTES`], [`super::MAX_TENSOR_NAME_BYTES`]), value types, bool
    /// bytes, array nesting, duplicate keys and tensor names, `general.alignment` (a power
    /// of two ≤ [`MAX_ALIGNMENT`]), tensor rank, non-zero dims without overflow, known GGML
    /// type and a row length that is a block multiple, aligned offsets, every tensor inside
    /// the input and no two tensors overlapping.
    pub fn parse(buf: &[u8]) -> Result<GgufIndex, GgufError> {
        let mut c = Cursor { buf, pos: 0 };
        let magic = c.u32("magic")?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic(magic));
        }
        let version = c.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.count("metadata count", MIN_KV_BYTES)?;
        // Tensor infos follow the metadata, so the tensor count is checked against the
        // same remaining bytes (a weaker but still allocation-bounding test).
        let remaining = c.remaining();
        if n_tensors
            .checked_mul(MIN_TENSOR_INFO_BYTES)
            .is_none_or(|need| need > remaining as u64)
        {
            return Err(GgufError::AbsurdCount {
                what: "tensor count",
                count: n_tensors,
                offset: 8,
                remaining,
            });
        }

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut key_index = HashMap::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let key = c.name("metadata key", MAX_KEY_BYTES)?;
            let ty_id = c.u32("metadata value type")?;
            let ty = MetaValueType::from_id(ty_id).ok_or_else(|| GgufError::UnknownValueType {
                key: Quoted::new(&key),
                ty: ty_id,
            })?;
            let value = c.value(ty, &key, 0)?;
            if key_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey(Quoted::new(&key)));
            }
            metadata.push((key, value));
        }

        let alignment = match key_index.get(ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => {
                let v = &metadata[i].1;
                // The spec types general.alignment as u32.
                let a = match v {
                    MetaValue::U32(a) => u64::from(*a),
                    other => {
                        return Err(GgufError::WrongType {
                            key: Quoted::new(ALIGNMENT_KEY),
                            expected: "u32",
                            found: other.type_name(),
                        })
                    }
                };
                if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                    return Err(GgufError::BadAlignment(a));
                }
                a
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = c.name("tensor name", MAX_TENSOR_NAME_BYTES)?;
            let n_dims = c.u32("tensor n_dims")?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(GgufError::BadDims {
                    name: Quoted::new(&name),
                    n_dims,
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("tensor dim")?);
            }
            let ty = GgmlType(c.u32("tensor type")?);
            let offset = c.u64("tensor offset")?;
            let n_bytes = tensor_bytes(&name, &dims, ty)?;
            if offset % alignment != 0 {
                return Err(GgufError::MisalignedTensor {
                    name: Quoted::new(&name),
                    offset,
                    alignment,
                });
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor(Quoted::new(&name)));
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type: ty,
                offset,
                start: 0,
                n_bytes,
            });
        }

        let file_len = buf.len() as u64;
        let data_offset =
            align_up(c.pos as u64, alignment).ok_or(GgufError::BadAlignment(alignment))?;
        // A file with no tensors may end right after the header without padding.
        if !tensors.is_empty() && data_offset > file_len {
            return Err(GgufError::Truncated {
                what: "padding before tensor data",
                offset: c.pos,
                need: data_offset - c.pos as u64,
                have: c.remaining(),
            });
        }
        for t in &mut tensors {
            let start = data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.n_bytes));
            match (start, end) {
                (Some(s), Some(e)) if e <= file_len => t.start = s,
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        name: Quoted::new(&t.name),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                    })
                }
            }
        }
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&i| tensors[i].start);
        for w in order.windows(2) {
            let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
            // Empty tensors cannot exist (dims are non-zero), so equal starts overlap too.
            if a.start + a.n_bytes > b.start {
                return Err(GgufError::OverlappingTensors {
                    a: Quoted::new(&a.name),
                    b: Quoted::new(&b.name),
                });
            }
        }

        Ok(GgufIndex {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
            file_len,
            key_index,
            tensor_index,
        })
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The description of a tensor.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    fn require(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(Quoted::new(key)))
    }

    fn wrong(key: &str, expected: &'static str, v: &MetaValue) -> GgufError {
        GgufError::WrongType {
            key: Quoted::new(key),
            expected,
            found: v.type_name(),
        }
    }

    /// A required string key.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong(key, "string", v))
    }

    /// A required non-negative integer key (any integer type).
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| Self::wrong(key, "unsigned integer", v))
    }

    /// A required number (float or integer).
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| Self::wrong(key, "number", v))
    }

    /// A required array key.
    pub fn get_array(&self, key: &str) -> Result<&[MetaValue], GgufError> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| Self::wrong(key, "array", v))
    }
}

/// Byte size of a tensor, validating rank, dims, type and block alignment of `dims[0]`.
fn tensor_bytes(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64, GgufError> {
    let bad = |why| GgufError::BadShape {
        name: Quoted::new(name),
        dims: dims.to_vec(),
        why,
    };
    if dims.contains(&0) {
        return Err(bad("zero dimension"));
    }
    let n = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad("element count overflows u64"))?;
    let (block_elems, block_bytes) = ty.block().ok_or_else(|| GgufError::UnknownTensorType {
        name: Quoted::new(name),
        ty: ty.0,
    })?;
    if dims[0] % block_elems != 0 {
        return Err(bad("row length is not a multiple of the block size"));
    }
    (n / block_elems)
        .checked_mul(block_bytes)
        .ok_or_else(|| bad("byte count overflows u64"))
}

/// Where the bytes of a [`GgufFile`] live.
enum Storage {
    /// Memory-mapped file (the normal case: tensors are used in place).
    Mapped(memmap2::Mmap),
    /// Owned bytes (tests, fuzzing, small synthetic files).
    Owned(Vec<u8>),
}

/// A parsed GGUF file whose tensor bytes are served in place.
pub struct GgufFile {
    storage: Storage,
    index: GgufIndex,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.index.version)
            .field("tensors", &self.index.tensors.len())
            .field("file_len", &self.index.file_len)
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and parse a file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io = |e: std::io::Error| GgufError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // Mapping an empty file fails on some platforms; report it as what it is.
            return Err(GgufError::Truncated {
                what: "magic",
                offset: 0,
                need: 4,
                have: 0,
            });
        }
        // SAFETY: the map is read-only and private to this process. The remaining hazard of
        // file-backed maps — another process truncating or rewriting the file while it is
        // mapped — is the documented contract of `Mmap::map`; model files are treated as
        // immutable while loaded (same assumption llama.cpp makes with mmap).
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let index = GgufIndex::parse(&mmap)?;
        Ok(GgufFile {
            storage: Storage::Mapped(mmap),
            index,
        })
    }

    /// Parse an in-memory image.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let index = GgufIndex::parse(&bytes)?;
        Ok(GgufFile {
            storage: Storage::Owned(bytes),
            index,
        })
    }

    /// The parsed header.
    pub fn index(&self) -> &GgufIndex {
        &self.index
    }

    /// All bytes of the file.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }

    /// A tensor's description and its bytes, in place.
    pub fn tensor(&self, name: &str) -> Result<(&TensorInfo, &[u8]), GgufError> {
        let t = self
            .index
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(Quoted::new(name)))?;
        Ok((t, self.tensor_data(t)))
    }

    /// The bytes of a tensor described by this file's index.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        // Parse proved start + n_bytes <= file_len, and `t` came from this index, so the
        // range is in bounds; `get` keeps it panic-free even if a foreign TensorInfo is passed.
        let (s, e) = (t.start as usize, (t.start + t.n_bytes) as usize);
        self.bytes().get(s..e).unwrap_or(&[])
    }
}
