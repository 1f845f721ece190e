//! GPU tier: the dequantiser (`kernels/dequant.cu`) for every GEMV format against hipfire-quant's
//! CPU dequantiser rounded to f16 and the independent f64 reference, row ranges into poisoned
//! outputs, device and host-mapped weights, the f32 → f16 conversion and typed errors. Each
//! test is `#[ignore]`d, as it needs a GPU: `--include-ignored` runs them
//! (`scripts/device-check.sh run`). The dequantiser's throughput is `gpu_bench --dequant`
//! (`examples/gpu_bench.rs`).

mod common;

use common::dequant::{
    check_against_f64, check_convert, check_strided, convert_inputs, expected_f16, formats, shapes,
    strided_len, unstride, weight_sources, POISON,
};
use common::{gpu, random_weights, rng};
use hipfire_gpu::{
    Context, DequantKernels, DeviceBuffer, DeviceMemory, GpuError, KernelRegistry, RowRange,
    Stream, WeightRef,
};
use hipfire_quant::Format;
use std::sync::Arc;

/// The poison as the 32-bit fill pattern (two f16 values).
const POISON_FILL: u32 = ((POISON as u32) << 16) | POISON as u32;

struct Gpu {
    ctx: Arc<Context>,
    stream: Stream,
    kernels: DequantKernels,
}

fn setup() -> Gpu {
    let ctx = gpu();
    let dir = std::env::temp_dir().join(format!("hipfire-gpu-dequant-{}", std::process::id()));
    let kernels = DequantKernels::new(&KernelRegistry::with_cache_dir(&ctx, dir))
        .expect("dequant module compiles and loads");
    let stream = ctx.new_stream().expect("stream");
    Gpu {
        ctx,
        stream,
        kernels,
    }
}

/// Weight bytes in device memory, or in host-mapped (pinned) memory read over PCIe.
enum Weights {
    Device(DeviceBuffer<u8>),
    Mapped(hipfire_gpu::HostMappedBuffer),
}

impl Weights {
    fn new(g: &Gpu, bytes: &[u8], mapped: bool) -> Weights {
        if mapped {
            let mut b = g.ctx.alloc_host_mapped(bytes.len()).expect("pinned alloc");
            b.as_mut_slice().copy_from_slice(bytes);
            return Weights::Mapped(b);
        }
        let mut b = g.ctx.alloc::<u8>(bytes.len()).expect("device alloc");
        b.upload(&g.stream, bytes).expect("upload");
        Weights::Device(b)
    }
    fn mem(&self) -> &dyn DeviceMemory {
        match self {
            Weights::Device(b) => b,
            Weights::Mapped(b) => b,
        }
    }
}

/// A view of a buffer `off` bytes in: misaligned pointers for the error checks.
struct Offset<'a> {
    mem: &'a dyn DeviceMemory,
    off: usize,
}

impl DeviceMemory for Offset<'_> {
    fn device_ptr(&self) -> u64 {
        self.mem.device_ptr() + self.off as u64
    }
    fn byte_len(&self) -> usize {
        self.mem.byte_len() - self.off
    }
    fn context(&self) -> &Arc<Context> {
        self.mem.context()
    }
}

/// A poisoned output of `n` f16 values.
fn poisoned(g: &Gpu, n: usize) -> DeviceBuffer<u16> {
    let mut out = g.ctx.alloc::<u16>(n.next_multiple_of(2)).expect("out");
    g.stream
        .fill_u32_async(&mut out, POISON_FILL)
        .expect("poison");
    out
}

fn download(g: &Gpu, b: &DeviceBuffer<u16>, n: usize) -> Vec<u16> {
    let mut v = vec![0u16; n];
    b.download(&g.stream, &mut v).expect("download");
    v
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_dequant_rows_match_the_cpu_dequantiser_for_every_format() {
    let g = setup();
    let mut not_exact_total = 0usize;
    for (fi, format) in formats().into_iter().enumerate() {
        let mut not_exact = 0usize;
        let mut checked = 0usize;
        for (si, s) in shapes(format).into_iter().enumerate() {
            // Packed rows, and on the first shape rows 8 and 24 values apart (gaps poisoned).
            let strides: &[usize] = if si == 0 {
                &[s.k, s.k + 8, s.k + 24]
            } else {
                &[s.k]
            };
            for (source, bytes) in weight_sources(format, s.m, s.k, (fi * 16 + si) as u64) {
                // Alternate the memories: every format reads from both.
                let mapped = (si + usize::from(source == "random bytes")) % 2 == 1;
                let placed = Weights::new(&g, &bytes, mapped);
                let w = WeightRef::new(placed.mem(), 0, format, s.m, s.k).expect("view");
                let want = expected_f16(format, &bytes, s.k, s.rows);
                for &stride in strides {
                    let total = strided_len(s.rows.len(), s.k, stride);
                    let mut out = poisoned(&g, total);
                    if stride == s.k {
                        g.kernels.dequant_rows(&g.stream, &w, s.rows, &mut out)
                    } else {
                        g.kernels
                            .dequant_rows_strided(&g.stream, &w, s.rows, &mut out, stride)
                    }
                    .expect("launch");
                    let got = download(&g, &out, total);
                    let what = format!(
                        "{format} {source} m={} k={} rows={:?} stride {stride} {}",
                        s.m,
                        s.k,
                        s.rows,
                        if mapped { "host-mapped" } else { "device" }
                    );
                    let (off, worst) = check_strided(&got, &want, s.rows.len(), s.k, stride)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(
                        worst <= 1,
                        "{what}: {off} values differ, up to {worst} f16 ulps"
                    );
                    let rows = unstride(&got, s.rows.len(), s.k, stride);
                    check_against_f64(format, &bytes, s.k, s.rows, &rows)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    not_exact += off;
                    checked += want.len();
                }
            }
        }
        println!("{format}: {checked} values, {not_exact} not bit-identical to the CPU's f16");
        not_exact_total += not_exact;
    }
    println!("all formats: {not_exact_total} values not bit-identical");
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_dequant_row_ranges_are_slices_of_the_whole_matrix() {
    let g = setup();
    let mut r = rng(0x5EED_D001);
    let (m, k) = (37, 4096);
    for format in formats() {
        let bytes = random_weights(format, m, k, &mut r);
        let placed = Weights::new(&g, &bytes, false);
        let w = WeightRef::new(placed.mem(), 0, format, m, k).expect("view");
        let mut whole = poisoned(&g, m * k);
        g.kernels
            .dequant_rows(&g.stream, &w, RowRange::all(m), &mut whole)
            .expect("whole");
        let whole = download(&g, &whole, m * k);
        // Ranges that together cover the matrix, written one after another into one buffer.
        let mut parts = Vec::with_capacity(m * k);
        for (a, b) in [(0, 1), (1, 16), (16, 36), (36, 37)] {
            let mut out = poisoned(&g, (b - a) * k);
            g.kernels
                .dequant_rows(&g.stream, &w, RowRange::new(a, b), &mut out)
                .expect("part");
            parts.extend(download(&g, &out, (b - a) * k));
        }
        assert!(
            whole == parts,
            "{format}: row ranges differ from the whole launch"
        );
    }
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_convert_f32_to_f16_rounds_as_half_does() {
    let g = setup();
    // Whole vector chunks, a partial last chunk over several blocks, a single value.
    for (seed, n) in [1usize << 16, 2053 * 8 + 6, 3001, 1]
        .into_iter()
        .enumerate()
    {
        let x = convert_inputs(n, seed as u64);
        let mut xd = g.ctx.alloc::<f32>(n + 1).expect("x");
        let mut staged = x.clone();
        staged.push(0.0);
        xd.upload(&g.stream, &staged).expect("upload");
        // Aligned pointers (vector path), then x 4 bytes in (elementwise path).
        for skew in [0usize, 4] {
            let xs = Offset {
                mem: &xd,
                off: skew,
            };
            let xin: Vec<f32> = if skew == 0 {
                x.clone()
            } else {
                staged[1..=n].to_vec()
            };
            let mut y = poisoned(&g, n + 8);
            g.kernels
                .convert_f32_to_f16(&g.stream, &xs, &mut y, n)
                .expect("convert");
            let got = download(&g, &y, n + 8);
            check_convert(&xin, &got[..n]).unwrap_or_else(|e| panic!("n = {n} skew {skew}: {e}"));
            assert!(
                got[n..].iter().all(|&v| v == POISON),
                "n = {n}: wrote past n"
            );
        }
    }
}

#[test]
#[ignore = "GPU tier: needs a CUDA GPU; run with --include-ignored on the GPU box"]
fn gpu_dequant_preconditions_are_typed_errors() {
    let g = setup();
    let mut r = rng(0x5EED_D002);
    let (m, k) = (37, 512);
    let bytes = random_weights(Format::Q4K, m, k, &mut r);
    let placed = Weights::new(&g, &bytes, false);
    let w = WeightRef::new(placed.mem(), 0, Format::Q4K, m, k).expect("view");
    let mut out = poisoned(&g, m * k);
    for rows in [
        RowRange::new(5, 5),
        RowRange::new(30, 38),
        RowRange::new(9, 3),
    ] {
        let e = g
            .kernels
            .dequant_rows(&g.stream, &w, rows, &mut out)
            .unwrap_err();
        assert!(matches!(e, GpuError::BadRowRange { .. }), "{rows:?}: {e}");
    }
    let mut small = poisoned(&g, 3 * k - 2);
    let e = g
        .kernels
        .dequant_rows(&g.stream, &w, RowRange::new(0, 3), &mut small)
        .unwrap_err();
    assert!(matches!(e, GpuError::BufferTooSmall { .. }), "{e}");
    let mut skewed = Offset { mem: &out, off: 2 };
    let e = g
        .kernels
        .dequant_rows(&g.stream, &w, RowRange::new(0, 3), &mut skewed)
        .unwrap_err();
    assert!(matches!(e, GpuError::Misaligned { align: 16, .. }), "{e}");
    // Weights 1 byte off (2-byte loads) and F32 weights 2 bytes off (4-byte loads).
    let odd = WeightRef::new(placed.mem(), 1, Format::Q4K, m - 1, k).expect("view");
    let e = g
        .kernels
        .dequant_rows(&g.stream, &odd, RowRange::new(0, 3), &mut out)
        .unwrap_err();
    assert!(matches!(e, GpuError::Misaligned { align: 2, .. }), "{e}");
    let f32w = WeightRef::new(placed.mem(), 2, Format::F32, 4, 64).expect("view");
    let e = g
        .kernels
        .dequant_rows(&g.stream, &f32w, RowRange::new(0, 1), &mut out)
        .unwrap_err();
    assert!(matches!(e, GpuError::Misaligned { align: 4, .. }), "{e}");
    // A float row that is not whole 8-value chunks.
    let f16w = WeightRef::new(placed.mem(), 0, Format::F16, 4, 12).expect("view");
    let e = g
        .kernels
        .dequant_rows(&g.stream, &f16w, RowRange::new(0, 1), &mut out)
        .unwrap_err();
    assert!(matches!(e, GpuError::Unsupported { .. }), "{e}");
    // Output rows closer than k, or not 16 bytes apart.
    let e = g
        .kernels
        .dequant_rows_strided(&g.stream, &w, RowRange::new(0, 3), &mut out, k - 8)
        .unwrap_err();
    assert!(matches!(e, GpuError::Invalid { .. }), "{e}");
    let e = g
        .kernels
        .dequant_rows_strided(&g.stream, &w, RowRange::new(0, 3), &mut out, k + 4)
        .unwrap_err();
    assert!(matches!(e, GpuError::Misaligned { .. }), "{e}");
    // Eleven rows 4k apart span 41k values; the buffer holds 37k.
    let e = g
        .kernels
        .dequant_rows_strided(&g.stream, &w, RowRange::new(0, 11), &mut out, 4 * k)
        .unwrap_err();
    assert!(matches!(e, GpuError::BufferTooSmall { .. }), "{e}");
    // None of the refused launches wrote anything.
    assert!(
        download(&g, &out, m * k).iter().all(|&v| v == POISON),
        "a refused launch wrote"
    );
    let x = g.ctx.alloc::<f32>(100).expect("x");
    let mut y = poisoned(&g, 100);
    let e = g
        .kernels
        .convert_f32_to_f16(&g.stream, &x, &mut y, 101)
        .unwrap_err();
    assert!(
        matches!(e, GpuError::BufferTooSmall { what: "x", .. }),
        "{e}"
    );
    let xs = Offset { mem: &x, off: 2 };
    let e = g
        .kernels
        .convert_f32_to_f16(&g.stream, &xs, &mut y, 10)
        .unwrap_err();
    assert!(matches!(e, GpuError::Misaligned { what: "x", .. }), "{e}");
}
