//! A streaming GGUF v3 writer: the header goes out first, then tensor bytes in declared
//! order, in as many pieces as the caller likes, so an 8B model never sits in RAM.

use std::io::Write;

use super::types::{GgmlType, MetaValue};
use super::{GgufError, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC};

/// Version written (spec's current version).
const WRITE_VERSION: u32 = 3;

/// A tensor to be written: shape in ggml order (`dims[0]` = row length) and type.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// Dimensions, `dims[0]` contiguous.
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
}

impl TensorSpec {
    /// Byte size, or an error for unknown types, zero dims, non-block-multiple rows or overflow.
    pub fn n_bytes(&self) -> Result<u64, GgufError> {
        let (be, bb) = self
            .ggml_type
            .block()
            .ok_or_else(|| GgufError::UnknownTensorType {
                name: (&self.name).into(),
                ty: self.ggml_type.0,
            })?;
        let bad = |why| GgufError::BadShape {
            name: (&self.name).into(),
            dims: self.dims.clone(),
            why,
        };
        if self.dims.is_empty()
            || self.dims.len() > super::MAX_DIMS as usize
            || self.dims.contains(&0)
        {
            return Err(bad("rank must be 1..=4 with non-zero dims"));
        }
        if self.dims[0] % be != 0 {
            return Err(bad("row length is not a multiple of the block size"));
        }
        let n = self
            .dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad("element count overflows u64"))?;
        (n / be)
            .checked_mul(bb)
            .ok_or_else(|| bad("byte count overflows u64"))
    }
}

/// Streaming writer. Create with [`GgufWriter::new`] (writes the header), feed every
/// tensor's bytes in order with [`GgufWriter::write_data`], then call [`GgufWriter::finish`].
pub struct GgufWriter<W: Write> {
    out: W,
    sizes: Vec<u64>,
    names: Vec<String>,
    alignment: u64,
    /// Tensor currently being filled.
    current: usize,
    /// Bytes of the current tensor written so far.
    filled: u64,
}

fn wio(e: std::io::Error) -> GgufError {
    GgufError::Write(e.to_string())
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => buf.push(*x),
        MetaValue::I8(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => buf.push(u8::from(*x)),
        MetaValue::String(s) => put_str(buf, s),
        MetaValue::Array(ty, items) => {
            buf.extend_from_slice(&(*ty as u32).to_le_bytes());
            buf.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for it in items {
                put_value(buf, it);
            }
        }
        MetaValue::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
    }
}

fn padding(pos: u64, alignment: u64) -> u64 {
    (alignment - pos % alignment) % alignment
}

impl<W: Write> GgufWriter<W> {
    /// Write the header (metadata and tensor infos) and prepare to receive tensor bytes.
    ///
    /// Arrays must be homogeneous with their declared element type; the alignment is
    /// taken from a `general.alignment` u32 entry if present (else 32).
    pub fn new(
        mut out: W,
        metadata: &[(String, MetaValue)],
        tensors: &[TensorSpec],
    ) -> Result<Self, GgufError> {
        let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            Some((_, MetaValue::U32(a))) if a.is_power_of_two() => u64::from(*a),
            Some((_, v)) => {
                return Err(GgufError::Write(format!(
                    "bad {ALIGNMENT_KEY}: a {} (a power-of-two u32 is needed)",
                    v.type_name()
                )))
            }
            None => DEFAULT_ALIGNMENT,
        };
        for (k, v) in metadata {
            if let MetaValue::Array(ty, items) = v {
                if items.iter().any(|i| i.value_type() != *ty) {
                    return Err(GgufError::Write(format!(
                        "array {} is not homogeneous",
                        super::Quoted::new(k)
                    )));
                }
            }
        }
        let mut h = Vec::new();
        h.extend_from_slice(&GGUF_MAGIC.to_le_bytes());
        h.extend_from_slice(&WRITE_VERSION.to_le_bytes());
        h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
        for (k, v) in metadata {
            put_str(&mut h, k);
            h.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            put_value(&mut h, v);
        }
        let mut sizes = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for t in tensors {
            let n = t.n_bytes()?;
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ggml_type.0.to_le_bytes());
            h.extend_from_slice(&offset.to_le_bytes());
            offset += n + padding(n, alignment);
            sizes.push(n);
        }
        let pad = padding(h.len() as u64, alignment);
        h.resize(h.len() + pad as usize, 0);
        out.write_all(&h).map_err(wio)?;
        Ok(GgufWriter {
            out,
            sizes,
            names: tensors.iter().map(|t| t.name.clone()).collect(),
            alignment,
            current: 0,
            filled: 0,
        })
    }

    /// Append bytes to the tensor being filled (tensors are filled in declaration order;
    /// a piece may span the end of one tensor and the start of the next).
    pub fn write_data(&mut self, mut bytes: &[u8]) -> Result<(), GgufError> {
        while !bytes.is_empty() {
            let Some(&size) = self.sizes.get(self.current) else {
                return Err(GgufError::Write(format!(
                    "{} bytes beyond the last tensor",
                    bytes.len()
                )));
            };
            let n = (size - self.filled).min(bytes.len() as u64) as usize;
            self.out.write_all(&bytes[..n]).map_err(wio)?;
            bytes = &bytes[n..];
            self.filled += n as u64;
            if self.filled == size {
                let pad = padding(size, self.alignment) as usize;
                self.out.write_all(&vec![0u8; pad]).map_err(wio)?;
                self.current += 1;
                self.filled = 0;
            }
        }
        Ok(())
    }

    /// Check every tensor was filled, flush, and return the sink.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if let Some(name) = self.names.get(self.current) {
            return Err(GgufError::Write(format!(
                "tensor {} got {} of {} bytes",
                super::Quoted::new(name),
                self.filled,
                self.sizes[self.current]
            )));
        }
        self.out.flush().map_err(wio)?;
        Ok(self.out)
    }
}
