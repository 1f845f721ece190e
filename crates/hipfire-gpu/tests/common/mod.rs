//! Shared pieces of the GPU test tier: device 0 (a failure without one), weight bytes placed in
//! VRAM or pinned host memory, seeded random weights in every format, and an
//! independent f64 dequantiser written from ggml's `dequantize_row_*` (ggml/src/ggml-quants.c).
#![allow(dead_code)]
// The reference dequantisers keep ggml's index loops so they can be read side by side with it.
#![allow(clippy::needless_range_loop)]

pub mod dequant;

use half::{bf16, f16};
use hipfire_gpu::{Context, DeviceBuffer, DeviceMemory, GemvForm, HostMappedBuffer, Stream};
use hipfire_quant::Format;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// The context of device 0. The GPU-tier tests are `#[ignore]`d, so this runs only when asked
/// for (`--ignored`); a machine without a usable GPU is then a failure, with the reason.
pub fn gpu() -> Arc<Context> {
    Context::new(0).unwrap_or_else(|e| panic!("GPU tier: no usable GPU: {e}"))
}

/// Bytes (a weight, an expert) in one of the two memories the GEMV reads: VRAM or pinned,
/// host-mapped memory.
pub enum Placed {
    Device(DeviceBuffer<u8>),
    Host(HostMappedBuffer),
}

impl Placed {
    pub fn mem(&self) -> &dyn DeviceMemory {
        match self {
            Placed::Device(b) => b,
            Placed::Host(b) => b,
        }
    }
}

/// `bytes` copied into pinned host memory (`host`) or uploaded to VRAM.
pub fn place(ctx: &Arc<Context>, stream: &Stream, bytes: &[u8], host: bool) -> Placed {
    if host {
        let mut b = ctx.alloc_host_mapped(bytes.len()).expect("pinned alloc");
        b.as_mut_slice().copy_from_slice(bytes);
        Placed::Host(b)
    } else {
        let mut b = ctx.alloc::<u8>(bytes.len()).expect("device alloc");
        b.upload(stream, bytes).expect("upload");
        Placed::Device(b)
    }
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn put_f16(b: &mut [u8], v: f32) {
    b[..2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// `m` random rows of `k` elements in `format`, scales in realistic ranges (never zero, never NaN).
pub fn random_weights(format: Format, m: usize, k: usize, r: &mut ChaCha8Rng) -> Vec<u8> {
    let rb = format.row_bytes(k).expect("k fits format");
    let mut out = vec![0u8; m * rb];
    match format {
        Format::F32 => out
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&r.random_range(-1.0f32..1.0).to_le_bytes())),
        Format::F16 => out.chunks_exact_mut(2).for_each(|c| {
            c.copy_from_slice(&f16::from_f32(r.random_range(-1.0f32..1.0)).to_le_bytes())
        }),
        Format::BF16 => out.chunks_exact_mut(2).for_each(|c| {
            c.copy_from_slice(&bf16::from_f32(r.random_range(-1.0f32..1.0)).to_le_bytes())
        }),
        _ => {
            r.fill(&mut out[..]);
            let bb = format.block_bytes();
            for b in out.chunks_exact_mut(bb) {
                match format {
                    Format::Q8_0 | Format::Q4_0 => put_f16(b, r.random_range(0.001f32..0.02)),
                    Format::Q4_1 => {
                        put_f16(b, r.random_range(0.001f32..0.02));
                        put_f16(&mut b[2..], r.random_range(-0.1f32..0.1));
                    }
                    Format::Q4K => {
                        put_f16(b, r.random_range(0.0005f32..0.005));
                        put_f16(&mut b[2..], r.random_range(0.0005f32..0.005));
                    }
                    Format::Q6K => put_f16(&mut b[208..], r.random_range(0.0005f32..0.005)),
                    Format::Hfq4G256 => {
                        b[..4].copy_from_slice(&r.random_range(0.001f32..0.02).to_le_bytes());
                        b[4..8].copy_from_slice(&r.random_range(-0.1f32..0.1).to_le_bytes());
                    }
                    Format::Q5_0 | Format::Iq4Nl | Format::Iq4Xs => {
                        put_f16(b, r.random_range(0.001f32..0.02))
                    }
                    Format::Q5_1 => {
                        put_f16(b, r.random_range(0.001f32..0.02));
                        put_f16(&mut b[2..], r.random_range(-0.1f32..0.1));
                    }
                    Format::Q5K => {
                        put_f16(b, r.random_range(0.0005f32..0.005));
                        put_f16(&mut b[2..], r.random_range(0.0005f32..0.005));
                    }
                    // E8M0 exponents 118..=122: scales 2^-10..2^-6, the f16 scales' range.
                    Format::Mxfp4 => b[0] = r.random_range(118u8..=122),
                    Format::Q3K => put_f16(&mut b[108..], r.random_range(0.0005f32..0.005)),
                    Format::Q2K => {
                        put_f16(&mut b[80..], r.random_range(0.0005f32..0.005));
                        put_f16(&mut b[82..], r.random_range(0.0005f32..0.005));
                    }
                    _ => unreachable!("float formats handled above"),
                }
            }
        }
    }
    out
}

pub fn random_x(k: usize, r: &mut ChaCha8Rng) -> Vec<f32> {
    (0..k).map(|_| r.random_range(-1.0f32..1.0)).collect()
}

fn h(b: &[u8]) -> f64 {
    f16::from_le_bytes([b[0], b[1]]).to_f64()
}

/// ggml kvalues_iq4nl: the non-linear grid of IQ4_NL and IQ4_XS.
const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// ggml kvalues_mxfp4: the doubled E2M1 values of MXFP4's codes.
const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml get_scale_min_k4.
fn scale_min_k4(j: usize, q: &[u8]) -> (f64, f64) {
    if j < 4 {
        ((q[j] & 63) as f64, (q[j + 4] & 63) as f64)
    } else {
        (
            ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as f64,
            ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as f64,
        )
    }
}

/// One row dequantised in f64, following ggml's dequantize_row_* exactly.
pub fn dequant_f64(format: Format, row: &[u8], k: usize) -> Vec<f64> {
    let mut y = Vec::with_capacity(k);
    match format {
        Format::F32 => row
            .chunks_exact(4)
            .for_each(|c| y.push(f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)),
        Format::F16 => row.chunks_exact(2).for_each(|c| y.push(h(c))),
        Format::BF16 => row
            .chunks_exact(2)
            .for_each(|c| y.push(bf16::from_le_bytes([c[0], c[1]]).to_f64())),
        Format::Q8_0 => {
            for b in row.chunks_exact(34) {
                let d = h(b);
                y.extend(b[2..34].iter().map(|&q| d * (q as i8) as f64));
            }
        }
        Format::Q4_0 | Format::Q4_1 => {
            let bb = format.block_bytes();
            for b in row.chunks_exact(bb) {
                let d = h(b);
                let (m, qs) = if format == Format::Q4_1 {
                    (h(&b[2..]), &b[4..20])
                } else {
                    (-8.0 * d, &b[2..18])
                };
                let mut v = [0f64; 32];
                for j in 0..16 {
                    v[j] = d * (qs[j] & 0xF) as f64 + m;
                    v[j + 16] = d * (qs[j] >> 4) as f64 + m;
                }
                y.extend(v);
            }
        }
        Format::Q4K => {
            for b in row.chunks_exact(144) {
                let (d, dmin) = (h(b), h(&b[2..]));
                let sc = &b[4..16];
                let mut q = &b[16..144];
                for j in 0..4 {
                    let (s1, m1) = scale_min_k4(2 * j, sc);
                    let (s2, m2) = scale_min_k4(2 * j + 1, sc);
                    for l in 0..32 {
                        y.push(d * s1 * (q[l] & 0xF) as f64 - dmin * m1);
                    }
                    for l in 0..32 {
                        y.push(d * s2 * (q[l] >> 4) as f64 - dmin * m2);
                    }
                    q = &q[32..];
                }
            }
        }
        Format::Q6K => {
            for b in row.chunks_exact(210) {
                let d = h(&b[208..]);
                let mut v = [0f64; 256];
                for n in 0..2 {
                    let ql = &b[64 * n..];
                    let qh = &b[128 + 32 * n..];
                    let sc = &b[192 + 8 * n..];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        let s = |i: usize| sc[i] as i8 as f64;
                        v[128 * n + l] = d * s(is) * q1 as f64;
                        v[128 * n + l + 32] = d * s(is + 2) * q2 as f64;
                        v[128 * n + l + 64] = d * s(is + 4) * q3 as f64;
                        v[128 * n + l + 96] = d * s(is + 6) * q4 as f64;
                    }
                }
                y.extend(v);
            }
        }
        Format::Hfq4G256 => {
            for b in row.chunks_exact(136) {
                let scale = f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
                let zero = f32::from_le_bytes([b[4], b[5], b[6], b[7]]) as f64;
                for &q in &b[8..136] {
                    y.push(scale * (q & 0xF) as f64 + zero);
                    y.push(scale * (q >> 4) as f64 + zero);
                }
            }
        }
        Format::Q5_0 | Format::Q5_1 => {
            // ggml dequantize_row_q5_0 / q5_1: the fifth bit of element j is bit j of qh.
            let bb = format.block_bytes();
            for b in row.chunks_exact(bb) {
                let d = h(b);
                let (m, rest) = if format == Format::Q5_1 {
                    (h(&b[2..]), &b[4..])
                } else {
                    (-16.0 * d, &b[2..])
                };
                let qh = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]);
                let qs = &rest[4..20];
                let mut v = [0f64; 32];
                for j in 0..16 {
                    let xh0 = ((qh >> j) << 4) & 0x10;
                    let xh1 = (qh >> (j + 12)) & 0x10;
                    v[j] = d * ((qs[j] as u32 & 0xF) | xh0) as f64 + m;
                    v[j + 16] = d * ((qs[j] as u32 >> 4) | xh1) as f64 + m;
                }
                y.extend(v);
            }
        }
        Format::Q5K => {
            // ggml dequantize_row_q5_K.
            for b in row.chunks_exact(176) {
                let (d, dmin) = (h(b), h(&b[2..]));
                let sc = &b[4..16];
                let qh = &b[16..48];
                let mut ql = &b[48..176];
                let (mut u1, mut u2) = (1u8, 2u8);
                for j in 0..4 {
                    let (s1, m1) = scale_min_k4(2 * j, sc);
                    let (s2, m2) = scale_min_k4(2 * j + 1, sc);
                    for l in 0..32 {
                        let q = (ql[l] & 0xF) + if qh[l] & u1 != 0 { 16 } else { 0 };
                        y.push(d * s1 * q as f64 - dmin * m1);
                    }
                    for l in 0..32 {
                        let q = (ql[l] >> 4) + if qh[l] & u2 != 0 { 16 } else { 0 };
                        y.push(d * s2 * q as f64 - dmin * m2);
                    }
                    ql = &ql[32..];
                    u1 <<= 2;
                    u2 <<= 2;
                }
            }
        }
        Format::Iq4Nl => {
            // ggml dequantize_row_iq4_nl.
            for b in row.chunks_exact(18) {
                let d = h(b);
                let qs = &b[2..18];
                let mut v = [0f64; 32];
                for j in 0..16 {
                    v[j] = d * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f64;
                    v[j + 16] = d * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f64;
                }
                y.extend(v);
            }
        }
        Format::Mxfp4 => {
            // ggml dequantize_row_mxfp4: kvalues_mxfp4[q] · GGML_E8M0_TO_FP32_HALF(e) = 2^(e − 128).
            for b in row.chunks_exact(17) {
                let d = 2f64.powi(i32::from(b[0]) - 128);
                let qs = &b[1..17];
                let mut v = [0f64; 32];
                for j in 0..16 {
                    v[j] = d * KVALUES_MXFP4[(qs[j] & 0xF) as usize] as f64;
                    v[j + 16] = d * KVALUES_MXFP4[(qs[j] >> 4) as usize] as f64;
                }
                y.extend(v);
            }
        }
        Format::Iq4Xs => {
            // ggml dequantize_row_iq4_xs.
            for b in row.chunks_exact(136) {
                let d = h(b);
                let scales_h = u16::from_le_bytes([b[2], b[3]]) as i32;
                let scales_l = &b[4..8];
                for ib in 0..8 {
                    let ls = ((scales_l[ib / 2] as i32 >> (4 * (ib % 2))) & 0xF)
                        | (((scales_h >> (2 * ib)) & 3) << 4);
                    let dl = d * (ls - 32) as f64;
                    let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
                    let mut v = [0f64; 32];
                    for j in 0..16 {
                        v[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xF) as usize] as f64;
                        v[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f64;
                    }
                    y.extend(v);
                }
            }
        }
        Format::Q3K => {
            // ggml dequantize_row_q3_K: the 16 6-bit scales unpacked with its kmask words.
            for b in row.chunks_exact(110) {
                let d = h(&b[108..]);
                let (hm, qs) = (&b[..32], &b[32..96]);
                let w = |i: usize| {
                    u32::from_le_bytes([b[96 + 4 * i], b[97 + 4 * i], b[98 + 4 * i], b[99 + 4 * i]])
                };
                let (kmask1, kmask2) = (0x0303_0303u32, 0x0f0f_0f0fu32);
                let (a0, a1, tmp) = (w(0), w(1), w(2));
                let aux = [
                    (a0 & kmask2) | ((tmp & kmask1) << 4),
                    (a1 & kmask2) | (((tmp >> 2) & kmask1) << 4),
                    ((a0 >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4),
                    ((a1 >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4),
                ];
                let scales: Vec<i8> = aux
                    .iter()
                    .flat_map(|a| a.to_le_bytes())
                    .map(|v| v as i8)
                    .collect();
                let mut is = 0;
                let mut m = 1u8;
                for n in 0..2 {
                    let q = &qs[32 * n..];
                    for j in 0..4 {
                        let shift = 2 * j;
                        for half in 0..2 {
                            let dl = d * (scales[is] as i32 - 32) as f64;
                            is += 1;
                            for l in 16 * half..16 * half + 16 {
                                let low = ((q[l] >> shift) & 3) as i32;
                                let sub = if hm[l] & m != 0 { 0 } else { 4 };
                                y.push(dl * (low - sub) as f64);
                            }
                        }
                        m <<= 1;
                    }
                }
            }
        }
        Format::Q2K => {
            // ggml dequantize_row_q2_K.
            for b in row.chunks_exact(84) {
                let (d, dmin) = (h(&b[80..]), h(&b[82..]));
                let mut is = 0;
                for n in 0..2 {
                    let q = &b[16 + 32 * n..];
                    for j in 0..4 {
                        let shift = 2 * j;
                        for half in 0..2 {
                            let sc = b[is];
                            is += 1;
                            let (dl, ml) = (d * (sc & 0xF) as f64, dmin * (sc >> 4) as f64);
                            for l in 16 * half..16 * half + 16 {
                                y.push(dl * ((q[l] >> shift) & 3) as f64 - ml);
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(y.len(), k);
    y
}

/// True for the formats whose kernels use the int8 activation.
pub fn uses_int8_activation(format: Format) -> bool {
    !matches!(format, Format::F32 | Format::F16 | Format::BF16)
}

/// Unit roundoff of f32, for the accumulation error bound.
const F32_U: f64 = 6.0e-8;

/// Checks `y` against the f64 reference for every row; returns the worst error relative to its bound.
#[allow(clippy::too_many_arguments)]
pub fn check_rows(
    format: Format,
    wbytes: &[u8],
    k: usize,
    x: &[f32],
    xhat: &[f64],
    dstep: &[f64],
    y0: &[f32],
    y: &[f32],
    form: GemvForm,
) -> f64 {
    let rb = format.row_bytes(k).expect("row bytes");
    let mut worst = 0f64;
    for (r, row) in wbytes.chunks_exact(rb).enumerate() {
        let w = dequant_f64(format, row, k);
        let base = if form == GemvForm::Residual {
            y0[r] as f64
        } else {
            0.0
        };
        let dot_hat: f64 = w.iter().zip(xhat).map(|(a, b)| a * b).sum();
        let abs_hat: f64 = w.iter().zip(xhat).map(|(a, b)| (a * b).abs()).sum();
        let dot_x: f64 = w.iter().zip(x).map(|(a, &b)| a * b as f64).sum();
        // Rounding bound of the kernel's f32 arithmetic: per-lane sums over k/32 units, a 32-way tree,
        // per-block scale products and the offset terms (x8 covers their cancellation).
        let tol_arith = 8.0 * ((k / 32 + 64) as f64) * F32_U * (abs_hat + base.abs()) + 1e-30;
        // Quantising x: |x - x̂| <= d/2 per element (rint), so |W·x - W·x̂| <= Σ|w|·d/2.
        let tol_q: f64 = w
            .iter()
            .zip(dstep)
            .map(|(a, d)| a.abs() * d * 0.5)
            .sum::<f64>()
            * 1.001;
        let got = y[r] as f64;
        assert!(got.is_finite(), "{format} row {r}: non-finite {got}");
        let e_hat = (got - base - dot_hat).abs();
        assert!(
            e_hat <= tol_arith,
            "{format} k={k} row {r}: |y - W·x̂| = {e_hat:e} > {tol_arith:e} (y={got}, ref={})",
            base + dot_hat
        );
        let e_x = (got - base - dot_x).abs();
        assert!(
            e_x <= tol_arith + tol_q,
            "{format} k={k} row {r}: |y - W·x| = {e_x:e} > {:e}",
            tol_arith + tol_q
        );
        worst = worst.max(e_hat / tol_arith);
    }
    worst
}
