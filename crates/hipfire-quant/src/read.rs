//! The plain-read loop that GEMV bandwidth is measured against.
//!
//! A GEMV is judged by the bytes it streams, so its ceiling is the fastest plain pass over the
//! same bytes on the same threads: 64-bit adds of every word, four independent 256-bit
//! accumulators (so the loop is bound by loads, not by add latency), AVX2 when the CPU has it.
//! Measured on the 2-core dev VM (1 GiB, best of 5, 2026-11-29): 38.7 / 70.4 GB/s on 1 / 2
//! threads, against 32.8 / 62.0 for a scalar 64-bit XOR loop built for the baseline target — a
//! ceiling that reads low would flatter every GEMV ratio measured against it.

/// Wrapping sum of every little-endian 64-bit word of `buf` (a tail shorter than 8 bytes is
/// folded in byte by byte), so the compiler cannot drop the reads.
pub fn read_sum(buf: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected just above.
        return unsafe { read_sum_avx2(buf) };
    }
    read_sum_scalar(buf)
}

fn read_sum_scalar(buf: &[u8]) -> u64 {
    let mut words = buf.chunks_exact(8);
    let mut acc = [0u64; 4];
    for (i, c) in (&mut words).enumerate() {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        acc[i % 4] = acc[i % 4].wrapping_add(u64::from_le_bytes(w));
    }
    let tail = words
        .remainder()
        .iter()
        .fold(0u64, |t, &b| t.wrapping_add(u64::from(b)));
    acc.iter().fold(tail, |a, &b| a.wrapping_add(b))
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_sum_avx2(buf: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    /// Bytes per iteration: four 32-byte loads.
    const STEP: usize = 128;
    let mut acc = [_mm256_setzero_si256(); 4];
    let n = buf.len() / STEP * STEP;
    let p = buf.as_ptr();
    let mut i = 0;
    while i < n {
        for (u, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 32u + 32 <= n <= buf.len().
            let v = unsafe { _mm256_loadu_si256(p.add(i + 32 * u) as *const __m256i) };
            *a = _mm256_add_epi64(*a, v);
        }
        i += STEP;
    }
    let s = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    let mut out = [0u64; 4];
    // SAFETY: `out` is 32 writable bytes.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, s) };
    let head = out.iter().fold(0u64, |a, &b| a.wrapping_add(b));
    head.wrapping_add(read_sum_scalar(&buf[n..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_and_scalar_sums_agree_on_every_length() {
        let buf: Vec<u8> = (0..1000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        for len in [0, 1, 7, 8, 127, 128, 129, 300, 1000] {
            assert_eq!(
                read_sum(&buf[..len]),
                read_sum_scalar(&buf[..len]),
                "len {len}"
            );
        }
        assert_ne!(read_sum(&buf), 0);
    }
}
