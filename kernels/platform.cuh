// platform.cuh — what every kernel file but gemv.cu starts with: which compiler builds it (HF_HIP
// under hipcc / hiprtc, else HF_CUDA for NVRTC; the per-platform code tests these), the warp width
// and -inf. Include first, before f16.cuh and anything else that tests HF_CUDA / HF_HIP.
#pragma once

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC_RTC__)
#define HF_HIP 1
#else
#define HF_CUDA 1
#endif

// Lanes a warp-level reduction spans; HIP wave64 builds set it to 64.
#ifndef HF_WARP
#define HF_WARP 32
#endif

// NVRTC has no <math.h>: -inf as a bit pattern.
#define HF_NEG_INF __int_as_float(0xff800000)
