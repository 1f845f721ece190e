//! Gemma 3's GPU kernels in `kernels/decode.cu` (`geglu_f32`, `scale_f32`, `rms_norm_add_f32`,
//! `softcap_f32`), not launched by the GPU decoder yet: they compile for sm_90 with NVRTC (no
//! GPU needed) and are in the image. Skips, saying so, without libnvrtc, unless CI's
//! `HIPFIRE_REQUIRE_NVRTC=1` says it must be there.

use hipfire_gpu::GpuError;

/// The Gemma 3 kernels of `decode.cu`.
const GEMMA_KERNEL_NAMES: [&str; 4] = ["geglu_f32", "scale_f32", "rms_norm_add_f32", "softcap_f32"];

#[test]
fn gemma_kernels_compile_for_sm90_with_nvrtc() {
    let src = &hipfire_model::gpu::DECODE_SOURCE;
    let image =
        match hipfire_gpu::cuda::nvrtc_compile(src.name, src.source, src.headers, "sm_90", &[]) {
            Ok(image) => image,
            Err(GpuError::NoGpu { reason }) => {
                assert!(
                    std::env::var("HIPFIRE_REQUIRE_NVRTC").as_deref() != Ok("1"),
                    "HIPFIRE_REQUIRE_NVRTC=1 but {reason}"
                );
                println!("skipped: {reason}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
    for n in GEMMA_KERNEL_NAMES {
        let needle = format!("{n}\0");
        assert!(
            image.windows(needle.len()).any(|w| w == needle.as_bytes()),
            "decode.cu: kernel {n} missing"
        );
    }
}
