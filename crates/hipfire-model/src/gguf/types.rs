//! GGML tensor types (block geometry) and GGUF metadata values.

/// A GGML tensor type id with its block geometry.
///
/// The reader knows the geometry of every type ggml defines (not only those hipfire can
/// multiply), so any well-formed file parses; whether a type is *usable* is decided later
/// through `hipfire_quant::Format::from_ggml_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// `(id, name, elements per block, bytes per block)`, from ggml's `type_traits` table in
/// `ggml/src/ggml.c` (ids 31–33 and 36–38 were removed upstream and are rejected).
const GGML_TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl GgmlType {
    fn entry(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        GGML_TYPES.iter().find(|e| e.0 == self.0)
    }

    /// True if and only if ggml defines this id.
    pub fn is_known(self) -> bool {
        self.entry().is_some()
    }

    /// ggml's name for the type (`"Q4_K"`), or `"unknown"`.
    pub fn name(self) -> &'static str {
        self.entry().map_or("unknown", |e| e.1)
    }

    /// `(elements per block, bytes per block)`, `None` for unknown ids.
    pub fn block(self) -> Option<(u64, u64)> {
        self.entry().map(|e| (e.2, e.3))
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name())
    }
}

/// GGUF metadata value type ids (spec: `gguf_metadata_value_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MetaValueType {
    /// u8
    U8 = 0,
    /// i8
    I8 = 1,
    /// u16
    U16 = 2,
    /// i16
    I16 = 3,
    /// u32
    U32 = 4,
    /// i32
    I32 = 5,
    /// f32
    F32 = 6,
    /// bool (one byte, 0 or 1)
    Bool = 7,
    /// u64 length + UTF-8 bytes
    String = 8,
    /// element type u32 + u64 count + elements
    Array = 9,
    /// u64
    U64 = 10,
    /// i64
    I64 = 11,
    /// f64
    F64 = 12,
}

impl MetaValueType {
    /// Type for an id read from a file.
    pub fn from_id(id: u32) -> Option<Self> {
        use MetaValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Smallest encoded size of one value of this type; used to reject element counts
    /// that cannot fit in the bytes left before allocating for them.
    pub fn min_encoded_size(self) -> u64 {
        use MetaValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            // element type (4) + count (8)
            Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// u8
    U8(u8),
    /// i8
    I8(i8),
    /// u16
    U16(u16),
    /// i16
    I16(i16),
    /// u32
    U32(u32),
    /// i32
    I32(i32),
    /// f32
    F32(f32),
    /// bool
    Bool(bool),
    /// String. Invalid UTF-8 is replaced (U+FFFD) rather than rejected: a few published
    /// vocabularies carry stray bytes and refusing the whole file would help nobody.
    String(String),
    /// Array with its declared element type (kept so an empty array round-trips).
    Array(MetaValueType, Vec<MetaValue>),
    /// u64
    U64(u64),
    /// i64
    I64(i64),
    /// f64
    F64(f64),
}

impl MetaValue {
    /// The value's type id.
    pub fn value_type(&self) -> MetaValueType {
        match self {
            MetaValue::U8(_) => MetaValueType::U8,
            MetaValue::I8(_) => MetaValueType::I8,
            MetaValue::U16(_) => MetaValueType::U16,
            MetaValue::I16(_) => MetaValueType::I16,
            MetaValue::U32(_) => MetaValueType::U32,
            MetaValue::I32(_) => MetaValueType::I32,
            MetaValue::F32(_) => MetaValueType::F32,
            MetaValue::Bool(_) => MetaValueType::Bool,
            MetaValue::String(_) => MetaValueType::String,
            MetaValue::Array(..) => MetaValueType::Array,
            MetaValue::U64(_) => MetaValueType::U64,
            MetaValue::I64(_) => MetaValueType::I64,
            MetaValue::F64(_) => MetaValueType::F64,
        }
    }

    /// Short type name for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(..) => "array",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }

    /// Any integer type as u64 (negative values give `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type as i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any float or integer type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The bool, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(_, v) => Some(v),
            _ => None,
        }
    }
}
