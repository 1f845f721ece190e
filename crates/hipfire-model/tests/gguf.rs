//! GGUF reader/writer: round trip, and every class of malformed input → typed error.

use hipfire_model::gguf::{
    GgmlType, GgufError, GgufFile, GgufIndex, GgufWriter, MetaValue, MetaValueType, TensorSpec,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const F32: GgmlType = GgmlType(0);
const Q8_0: GgmlType = GgmlType(8);

fn sample_meta() -> Vec<(String, MetaValue)> {
    vec![
        (
            "general.architecture".into(),
            MetaValue::String("llama".into()),
        ),
        ("u8".into(), MetaValue::U8(7)),
        ("i8".into(), MetaValue::I8(-7)),
        ("u16".into(), MetaValue::U16(65000)),
        ("i16".into(), MetaValue::I16(-300)),
        ("u32".into(), MetaValue::U32(4_000_000_000)),
        ("i32".into(), MetaValue::I32(-5)),
        ("f32".into(), MetaValue::F32(1.5e-5)),
        ("bool".into(), MetaValue::Bool(true)),
        ("u64".into(), MetaValue::U64(u64::MAX - 3)),
        ("i64".into(), MetaValue::I64(i64::MIN + 1)),
        ("f64".into(), MetaValue::F64(-2.25)),
        (
            "strs".into(),
            MetaValue::Array(
                MetaValueType::String,
                vec![
                    MetaValue::String("a b".into()),
                    MetaValue::String("ü".into()),
                ],
            ),
        ),
        (
            "nested".into(),
            MetaValue::Array(
                MetaValueType::Array,
                vec![MetaValue::Array(
                    MetaValueType::I32,
                    vec![MetaValue::I32(1), MetaValue::I32(-2)],
                )],
            ),
        ),
        ("empty".into(), MetaValue::Array(MetaValueType::F32, vec![])),
    ]
}

fn sample_tensors() -> Vec<TensorSpec> {
    vec![
        TensorSpec {
            name: "a".into(),
            dims: vec![3, 2],
            ggml_type: F32,
        },
        TensorSpec {
            name: "b".into(),
            dims: vec![64, 3],
            ggml_type: Q8_0,
        },
        TensorSpec {
            name: "c".into(),
            dims: vec![5],
            ggml_type: F32,
        },
    ]
}

/// A valid file with seeded random tensor bytes; returns the image and each tensor's bytes.
fn sample_file(seed: u64) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let specs = sample_tensors();
    let datas: Vec<Vec<u8>> = specs
        .iter()
        .map(|s| (0..s.n_bytes().unwrap()).map(|_| rng.random()).collect())
        .collect();
    let mut w = GgufWriter::new(Vec::new(), &sample_meta(), &specs).unwrap();
    // Feed in uneven pieces that straddle tensor boundaries to exercise the streaming path.
    let all: Vec<u8> = datas.concat();
    for piece in all.chunks(7) {
        w.write_data(piece).unwrap();
    }
    (w.finish().unwrap(), datas)
}

#[test]
fn round_trip_all_value_types_and_tensors_in_place() {
    let (img, datas) = sample_file(1);
    let f = GgufFile::from_bytes(img).unwrap();
    let idx = f.index();
    assert_eq!(idx.version, 3);
    assert_eq!(idx.alignment, 32);
    assert_eq!(idx.metadata, sample_meta());
    assert_eq!(idx.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(idx.get_u64("u32").unwrap(), 4_000_000_000);
    assert!(matches!(
        idx.get_u64("i32"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(idx.get_str("nope"), Err(GgufError::MissingKey(_))));
    for (spec, data) in sample_tensors().iter().zip(&datas) {
        let (info, bytes) = f.tensor(&spec.name).unwrap();
        assert_eq!(info.dims, spec.dims);
        assert_eq!(bytes, &data[..]);
        assert_eq!(info.start % 32, 0);
    }
    assert!(matches!(f.tensor("zz"), Err(GgufError::MissingTensor(_))));
}

#[test]
fn custom_alignment_is_honoured() {
    let mut meta = sample_meta();
    meta.push(("general.alignment".into(), MetaValue::U32(64)));
    let specs = sample_tensors();
    let mut w = GgufWriter::new(Vec::new(), &meta, &specs).unwrap();
    for s in &specs {
        w.write_data(&vec![0x5a; s.n_bytes().unwrap() as usize])
            .unwrap();
    }
    let f = GgufFile::from_bytes(w.finish().unwrap()).unwrap();
    assert_eq!(f.index().alignment, 64);
    for t in &f.index().tensors {
        assert_eq!(t.start % 64, 0);
    }
}

#[test]
fn writer_rejects_short_or_long_data() {
    let specs = sample_tensors();
    let mut w = GgufWriter::new(Vec::new(), &[], &specs).unwrap();
    w.write_data(&[0; 10]).unwrap();
    assert!(matches!(w.finish(), Err(GgufError::Write(_))));
    let total: u64 = specs.iter().map(|s| s.n_bytes().unwrap()).sum();
    let mut w = GgufWriter::new(Vec::new(), &[], &specs).unwrap();
    assert!(w.write_data(&vec![0; total as usize + 1]).is_err());
}

#[test]
fn every_truncation_is_an_error() {
    let (img, _) = sample_file(2);
    let idx = GgufIndex::parse(&img).unwrap();
    // Trailing padding after the last tensor is optional, so only prefixes that cut into
    // header or tensor bytes must fail.
    let end = idx
        .tensors
        .iter()
        .map(|t| t.start + t.n_bytes)
        .max()
        .unwrap() as usize;
    assert!(end < img.len());
    assert!(GgufIndex::parse(&img[..end]).is_ok());
    for len in 0..end {
        let r = GgufIndex::parse(&img[..len]);
        assert!(r.is_err(), "prefix of {len} bytes parsed");
    }
    assert!(GgufIndex::parse(&img).is_ok());
}

#[test]
fn random_corruption_never_panics() {
    let (img, _) = sample_file(3);
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut errors = 0;
    for _ in 0..3000 {
        let mut m = img.clone();
        for _ in 0..rng.random_range(1..4) {
            let i = rng.random_range(0..m.len());
            m[i] = rng.random();
        }
        errors += usize::from(GgufIndex::parse(&m).is_err());
    }
    // Flips inside tensor data are legal, so not every mutant fails — but many must.
    assert!(errors > 300, "only {errors} of 3000 mutants rejected");
}

/// Hand-assembled headers for targeted defects.
struct Raw(Vec<u8>);
impl Raw {
    fn new(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut v = b"GGUF".to_vec();
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&n_tensors.to_le_bytes());
        v.extend_from_slice(&n_kv.to_le_bytes());
        Raw(v)
    }
    fn u32(mut self, x: u32) -> Raw {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn u64(mut self, x: u64) -> Raw {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, off: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(off)
    }
    /// Pad to 32 and add `n` data bytes.
    fn data(mut self, n: usize) -> Vec<u8> {
        let pad = (32 - self.0.len() % 32) % 32;
        self.0.resize(self.0.len() + pad + n, 0x11);
        self.0
    }
}

fn err(b: &[u8]) -> GgufError {
    match GgufIndex::parse(b) {
        Ok(_) => panic!("malformed input parsed"),
        Err(e) => e,
    }
}

#[test]
fn bad_magic_and_versions() {
    assert!(matches!(err(b"GGML\x03\0\0\0"), GgufError::BadMagic(_)));
    for v in [0u32, 1, 4, u32::MAX] {
        assert_eq!(err(&Raw::new(v, 0, 0).0), GgufError::UnsupportedVersion(v));
    }
    // v2 with the same layout parses.
    assert!(GgufIndex::parse(&Raw::new(2, 0, 0).0).is_ok());
}

#[test]
fn absurd_counts_and_lengths() {
    assert!(matches!(
        err(&Raw::new(3, u64::MAX, 0).0),
        GgufError::AbsurdCount { .. }
    ));
    assert!(matches!(
        err(&Raw::new(3, 0, 1 << 60).0),
        GgufError::AbsurdCount { .. }
    ));
    // key length far past the end
    assert!(matches!(
        err(&Raw::new(3, 0, 1).u64(u64::MAX).bytes(&[0; 16]).0),
        GgufError::AbsurdCount { .. }
    ));
    // string value with huge length
    let b = Raw::new(3, 0, 1)
        .str("k")
        .u32(8)
        .u64(1 << 40)
        .bytes(b"xx")
        .0;
    assert!(matches!(err(&b), GgufError::AbsurdCount { .. }));
    // array of u64 whose count cannot fit
    let b = Raw::new(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(10)
        .u64(1 << 30)
        .bytes(&[0; 64])
        .0;
    assert!(matches!(err(&b), GgufError::AbsurdCount { .. }));
}

#[test]
fn bad_values() {
    let b = Raw::new(3, 0, 1).str("k").u32(13).bytes(&[0; 8]).0;
    assert!(matches!(
        err(&b),
        GgufError::UnknownValueType { ty: 13, .. }
    ));
    let b = Raw::new(3, 0, 1).str("k").u32(9).u32(99).u64(0).0;
    assert!(matches!(
        err(&b),
        GgufError::UnknownValueType { ty: 99, .. }
    ));
    let b = Raw::new(3, 0, 1)
        .str("k")
        .u32(7)
        .bytes(&[2])
        .bytes(&[0; 12])
        .0;
    assert_eq!(err(&b), GgufError::BadBool(2));
    let b = Raw::new(3, 0, 2)
        .str("k")
        .u32(0)
        .bytes(&[1])
        .str("k")
        .u32(0)
        .bytes(&[1])
        .0;
    assert!(matches!(err(&b), GgufError::DuplicateKey(_)));
    // arrays nested five deep
    let mut r = Raw::new(3, 0, 1).str("k").u32(9);
    for _ in 0..5 {
        r = r.u32(9).u64(1);
    }
    let b = r.u32(0).u64(1).bytes(&[1; 40]).0;
    assert!(matches!(err(&b), GgufError::TooDeep(_)));
}

#[test]
fn bad_alignment() {
    for (a, ok) in [(0u32, false), (48, false), (1 << 20, false), (16, true)] {
        let b = Raw::new(3, 0, 1).str("general.alignment").u32(4).u32(a).0;
        assert_eq!(GgufIndex::parse(&b).is_ok(), ok, "alignment {a}");
    }
    let b = Raw::new(3, 0, 1).str("general.alignment").u32(10).u64(32).0;
    assert!(matches!(err(&b), GgufError::WrongType { .. }));
}

#[test]
fn bad_tensor_infos() {
    let one = |dims: &[u64], ty: u32, off: u64, data: usize| {
        Raw::new(3, 1, 0).tensor("t", dims, ty, off).data(data)
    };
    assert!(GgufIndex::parse(&one(&[4, 2], 0, 0, 32)).is_ok());
    assert!(matches!(
        err(&one(&[], 0, 0, 64)),
        GgufError::BadDims { n_dims: 0, .. }
    ));
    assert!(matches!(
        err(&one(&[1, 1, 1, 1, 1], 0, 0, 64)),
        GgufError::BadDims { n_dims: 5, .. }
    ));
    assert!(matches!(
        err(&one(&[4, 0], 0, 0, 64)),
        GgufError::BadShape { .. }
    ));
    assert!(matches!(
        err(&one(&[1 << 32, 1 << 32, 1 << 8], 0, 0, 64)),
        GgufError::BadShape { .. }
    ));
    // element count fits but byte count overflows
    assert!(matches!(
        err(&one(&[1 << 62, 2], 0, 0, 64)),
        GgufError::BadShape { .. }
    ));
    assert!(matches!(
        err(&one(&[4, 2], 31, 0, 64)),
        GgufError::UnknownTensorType { ty: 31, .. }
    ));
    assert!(matches!(
        err(&one(&[4, 2], 1000, 0, 64)),
        GgufError::UnknownTensorType { .. }
    ));
    // Q8_0 row of 40 elements is not a block multiple
    assert!(matches!(
        err(&one(&[40], 8, 0, 64)),
        GgufError::BadShape { .. }
    ));
    assert!(matches!(
        err(&one(&[4, 2], 0, 8, 64)),
        GgufError::MisalignedTensor { .. }
    ));
    // data one byte short
    assert!(matches!(
        err(&one(&[4, 2], 0, 0, 31)),
        GgufError::TensorOutOfBounds { .. }
    ));
    // offset far past the end, and offset that overflows when added to the data start
    assert!(matches!(
        err(&one(&[4, 2], 0, 1 << 40, 64)),
        GgufError::TensorOutOfBounds { .. }
    ));
    assert!(matches!(
        err(&one(&[4, 2], 0, u64::MAX - 31, 64)),
        GgufError::TensorOutOfBounds { .. }
    ));
    // no padding / data at all after the infos
    let b = Raw::new(3, 1, 0).tensor("t", &[4], 0, 0).0;
    assert!(
        err(&b).to_string().contains("truncated")
            || matches!(err(&b), GgufError::TensorOutOfBounds { .. })
    );
}

#[test]
fn overlapping_and_duplicate_tensors() {
    // 12 f32 = 48 bytes at 0, and another at 32: overlap.
    let b = Raw::new(3, 2, 0)
        .tensor("a", &[12], 0, 0)
        .tensor("b", &[4], 0, 32)
        .data(128);
    assert!(matches!(err(&b), GgufError::OverlappingTensors { .. }));
    let b = Raw::new(3, 2, 0)
        .tensor("a", &[4], 0, 0)
        .tensor("b", &[4], 0, 0)
        .data(128);
    assert!(matches!(err(&b), GgufError::OverlappingTensors { .. }));
    let b = Raw::new(3, 2, 0)
        .tensor("a", &[4], 0, 0)
        .tensor("a", &[4], 0, 32)
        .data(128);
    assert!(matches!(err(&b), GgufError::DuplicateTensor(_)));
    let b = Raw::new(3, 2, 0)
        .tensor("a", &[12], 0, 0)
        .tensor("b", &[4], 0, 64)
        .data(128);
    assert!(GgufIndex::parse(&b).is_ok());
}

#[test]
fn open_missing_and_empty_files() {
    let dir = std::env::temp_dir().join(format!("hipfire-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert!(matches!(
        GgufFile::open(dir.join("nope.gguf")),
        Err(GgufError::Io { .. })
    ));
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty),
        Err(GgufError::Truncated { .. })
    ));
    let (img, datas) = sample_file(5);
    let good = dir.join("good.gguf");
    std::fs::write(&good, &img).unwrap();
    let f = GgufFile::open(&good).unwrap();
    assert_eq!(f.tensor("b").unwrap().1, &datas[1][..]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fuzz_seed_corpus_parses_as_labelled() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/gguf_parse");
    let mut seen = 0;
    for (name, ok) in [
        ("valid_v3.gguf", true),
        ("valid_v2_align64.gguf", true),
        ("header_only.gguf", true),
        ("truncated.gguf", false),
        ("overlap.gguf", false),
    ] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        assert_eq!(GgufIndex::parse(&bytes).is_ok(), ok, "{name}");
        seen += 1;
    }
    assert_eq!(seen, 5);
    let v3 = GgufIndex::parse(&std::fs::read(dir.join("valid_v3.gguf")).unwrap()).unwrap();
    assert_eq!(v3.tensors.len(), 3);
    assert_eq!(
        v3.get("nest").unwrap().as_array().unwrap()[0]
            .as_array()
            .unwrap()[1],
        MetaValue::I32(-1)
    );
}

/// Names and keys have length limits checked before their bytes are read (ggml's 63-byte
/// tensor names, the spec's 65535-byte keys), and every error quotes a file string cut short.
#[test]
fn name_and_key_lengths_are_bounded_and_quoted_short() {
    use hipfire_model::gguf::{MAX_KEY_BYTES, MAX_QUOTED_CHARS, MAX_TENSOR_NAME_BYTES};
    let named = |name: &str| Raw::new(3, 1, 0).tensor(name, &[4], 0, 0).data(32);
    let at_limit = "n".repeat(MAX_TENSOR_NAME_BYTES as usize);
    assert!(GgufIndex::parse(&named(&at_limit)).is_ok());
    let over = "n".repeat(MAX_TENSOR_NAME_BYTES as usize + 1);
    assert!(matches!(
        err(&named(&over)),
        GgufError::NameTooLong {
            what: "tensor name",
            len: 64,
            max: 63,
            ..
        }
    ));
    // A length that swallows the rest of the file is refused before it is read.
    let b = Raw::new(3, 1, 0).u64(1 << 20).data(2 << 20);
    assert!(matches!(
        err(&b),
        GgufError::NameTooLong { len: 1_048_576, .. }
    ));

    let key = |k: &str| Raw::new(3, 0, 1).str(k).u32(0).bytes(&[7]).0;
    assert!(GgufIndex::parse(&key(&"k".repeat(MAX_KEY_BYTES as usize))).is_ok());
    assert!(matches!(
        err(&key(&"k".repeat(MAX_KEY_BYTES as usize + 1))),
        GgufError::NameTooLong {
            what: "metadata key",
            ..
        }
    ));
    // A long key (within the limit) in an error message is cut, with its length.
    let long = "k".repeat(60_000);
    let dup = Raw::new(3, 0, 2)
        .str(&long)
        .u32(0)
        .bytes(&[1])
        .str(&long)
        .u32(0)
        .bytes(&[2])
        .0;
    let e = err(&dup);
    assert!(matches!(&e, GgufError::DuplicateKey(k) if k.len() == 60_000 && !k.is_whole()));
    let msg = e.to_string();
    assert!(
        msg.len() < MAX_QUOTED_CHARS + 64,
        "{} bytes: {msg}",
        msg.len()
    );
    assert!(msg.ends_with("… (60000 bytes)"), "{msg}");
}
