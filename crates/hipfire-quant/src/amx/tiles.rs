//! The tile micro-kernel of the AMX GEMM: AMX hardware (`tdpbf16ps` through `asm!`) and a
//! portable scalar emulation of exactly the same operation on exactly the same packed buffers.
//!
//! Everything the GEMM does except this one micro-kernel (packing, dequantising, tails, the
//! scatter into the outputs) is shared by both engines, so the emulation, which runs on every
//! CI machine, tests all of it; the hardware engine is tested by the same tests where the CPU
//! has AMX. All the `unsafe` AMX code of the crate is in this file.

use super::{Line, PANEL_ROWS, TILE_ROWS};
use std::cell::Cell;
use std::marker::PhantomData;

/// f32 values of one 16 × 16 C tile (row-major, 64 bytes a row, as `tilestored` writes it).
pub(crate) const C_TILE: usize = TILE_ROWS * TILE_ROWS;

/// The 2 × 2 block of C tiles one micro-kernel call produces: index `2·rt + g` holds weight
/// rows `16·rt..16·rt + 16` of the panel against token group `g` (C\[row\]\[token\]).
#[repr(C, align(64))]
pub(crate) struct CBlock(pub(crate) [[f32; C_TILE]; 4]);

/// Lines of a B tile (16 bf16 pairs × 16 tokens) and of the A panel per k-step.
const B_STEP_LINES: usize = TILE_ROWS;
const A_STEP_LINES: usize = PANEL_ROWS;

/// Which engine runs the micro-kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    /// The scalar emulation (any CPU).
    Emulated,
    /// AMX hardware; only constructed once [`super::amx_available`] said yes.
    #[cfg(target_arch = "x86_64")]
    Hardware,
}

/// `c[2·rt + g] += Σ_s A(s, rt) · B_g(s)` over `ksteps` k-steps of 32, for row tiles
/// `rt ∈ {0, 1}` of the panel `a` and the token groups `b[0]` and (if present) `b[1]`; with one
/// group, `c[1]` and `c[3]` are left as they were.
///
/// `a` is a panel in the A layout (k-step `s` holds [`PANEL_ROWS`] lines, line `32·s + r` =
/// row r's bf16 `32·s..32·s + 32`), `b[g]` a token group in the B layout (k-step `s` holds 16
/// lines, line `16·s + p` = for each token n, its bf16 pair `2p, 2p + 1` at `2n, 2n + 1`).
/// Lengths are checked: too short a buffer, or `ksteps == 0`, leaves `c` untouched and returns
/// false (the callers size them exactly, so this is a bug guard, not a path).
pub(crate) fn dot_panel(
    tiles: &TileSession,
    a: &[Line],
    b: (&[Line], Option<&[Line]>),
    ksteps: usize,
    c: &mut CBlock,
) -> bool {
    let need_a = ksteps * A_STEP_LINES;
    let need_b = ksteps * B_STEP_LINES;
    let b_ok = |x: &[Line]| x.len() >= need_b;
    if ksteps == 0 || a.len() < need_a || !b_ok(b.0) || !b.1.is_none_or(b_ok) {
        return false;
    }
    match tiles.engine {
        Engine::Emulated => emulate(a, b, ksteps, c),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Engine::Hardware` exists only after `amx_available()` (CPUID AMX-TILE and
        // AMX-BF16, and the kernel's XTILEDATA permission for this process), and a live
        // `TileSession` of it has configured the tiles on this thread (it is not `Send`); the
        // lengths were checked above against exactly what the loops read (`ksteps` steps of
        // 2 KiB of `a` and 1 KiB of each `b`), and `c` holds the 4 KiB the stores write.
        Engine::Hardware => unsafe {
            match b.1 {
                Some(b1) => hw::dot_2x2(a.as_ptr(), b.0.as_ptr(), b1.as_ptr(), ksteps, c),
                None => hw::dot_2x1(a.as_ptr(), b.0.as_ptr(), ksteps, c),
            }
        },
    }
    true
}

thread_local! {
    /// Live [`TileSession`]s of the hardware engine on this thread (the tiles are configured
    /// while it is above zero).
    static SESSIONS: Cell<usize> = const { Cell::new(0) };
}

/// The tile unit configured for this thread, for the life of the value: `ldtilecfg` and
/// `tilerelease` cost hundreds of cycles each, which paid per micro-kernel call held the GEMM
/// at 95 against 130 GMAC/s (H200 box, Q4_K k 4096, 32 tokens, 8 against 128 k-steps per call,
/// `prefill_gemm --amx hw`, 2026-12-02). Not `Send`: the configuration is the thread's. The OS
/// keeps it across context switches (XSAVE of the tile state the process was granted).
pub(crate) struct TileSession {
    engine: Engine,
    _thread: PhantomData<*const ()>,
}

impl TileSession {
    /// Configure the tiles (hardware engine; nested sessions share one configuration).
    pub(crate) fn start(engine: Engine) -> TileSession {
        #[cfg(target_arch = "x86_64")]
        if engine == Engine::Hardware {
            SESSIONS.with(|n| {
                if n.get() == 0 {
                    // SAFETY: `Engine::Hardware` exists only once AMX is present and permitted.
                    unsafe { hw::configure() };
                }
                n.set(n.get() + 1);
            });
        }
        TileSession {
            engine,
            _thread: PhantomData,
        }
    }
}

impl Drop for TileSession {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        if self.engine == Engine::Hardware {
            SESSIONS.with(|n| {
                n.set(n.get().saturating_sub(1));
                if n.get() == 0 {
                    // SAFETY: as in `start`; no session of this thread is left to use the tiles.
                    unsafe { hw::release() };
                }
            });
        }
    }
}

/// `tdpbf16ps` in scalar code: per element, the two products of a bf16 pair (exact in f32) are
/// added to the f32 accumulator one after the other, as Intel's pseudo-code for the instruction
/// does (the hardware flushes denormals, which the packed data here never holds).
fn emulate(a: &[Line], b: (&[Line], Option<&[Line]>), ksteps: usize, c: &mut CBlock) {
    let groups: [Option<&[Line]>; 2] = [Some(b.0), b.1];
    for rt in 0..2 {
        for (g, bg) in groups.iter().enumerate() {
            let Some(bg) = bg else { continue };
            let ct = &mut c.0[2 * rt + g];
            for s in 0..ksteps {
                let at = &a[s * A_STEP_LINES + rt * TILE_ROWS..][..TILE_ROWS];
                let bt = &bg[s * B_STEP_LINES..][..B_STEP_LINES];
                for (m, arow) in at.iter().enumerate() {
                    for (p, brow) in bt.iter().enumerate() {
                        let (a0, a1) = (bf16_to_f32(arow.0[2 * p]), bf16_to_f32(arow.0[2 * p + 1]));
                        for n in 0..TILE_ROWS {
                            let acc = &mut ct[m * TILE_ROWS + n];
                            *acc += a0 * bf16_to_f32(brow.0[2 * n]);
                            *acc += a1 * bf16_to_f32(brow.0[2 * n + 1]);
                        }
                    }
                }
            }
        }
    }
}

/// bf16 bits → f32 (exact).
#[inline]
pub(crate) fn bf16_to_f32(v: u16) -> f32 {
    f32::from_bits(u32::from(v) << 16)
}

#[cfg(target_arch = "x86_64")]
mod hw {
    use super::{CBlock, Line};
    use std::arch::asm;

    /// `ldtilecfg`'s 64-byte operand: palette 1, tiles 0–7 each 16 rows of 64 bytes
    /// (byte 0 palette, bytes 16..32 bytes-per-row as u16 per tile, bytes 48..56 rows per tile).
    #[repr(C, align(64))]
    struct TileConfig([u8; 64]);

    const fn config() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = 16;
            t += 1;
        }
        TileConfig(c)
    }
    static CONFIG: TileConfig = config();

    /// Bytes between tile rows in every buffer (A panel, B groups, C block): one [`Line`].
    const STRIDE: usize = 64;

    /// Four C tiles (tmm0–3), two A tiles (tmm4–5: rows 0–15 and 16–31 of the panel), two B
    /// tiles (tmm6–7: groups 0 and 1); C tile `2·rt + g` loaded from and stored back to
    /// `c + 1024·(2·rt + g)`.
    ///
    /// # Safety
    /// AMX-TILE and AMX-BF16 are present, XTILEDATA is permitted for this process and
    /// [`configure`] ran on this thread since the last [`release`]; `ksteps ≥ 1`; `a` is
    /// readable for `ksteps × 2048` bytes, `b0` and `b1` for `ksteps × 1024` each, and `c` is
    /// readable and writable for 4096. Every tile register it uses is loaded inside the one
    /// `asm!` block, so no tile data lives across Rust code (only the configuration).
    pub(super) unsafe fn dot_2x2(
        a: *const Line,
        b0: *const Line,
        b1: *const Line,
        ksteps: usize,
        c: &mut CBlock,
    ) {
        // SAFETY: the function's contract.
        unsafe {
            asm!(
                "tileloadd tmm0, [{c} + {st}*1]",
                "tileloadd tmm1, [{c} + {st}*1 + 1024]",
                "tileloadd tmm2, [{c} + {st}*1 + 2048]",
                "tileloadd tmm3, [{c} + {st}*1 + 3072]",
                "2:",
                "tileloadd tmm4, [{a} + {st}*1]",
                "tileloadd tmm5, [{a} + {st}*1 + 1024]",
                "tileloadd tmm6, [{b0} + {st}*1]",
                "tileloadd tmm7, [{b1} + {st}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a}, 2048",
                "add {b0}, 1024",
                "add {b1}, 1024",
                "dec {n}",
                "jnz 2b",
                "tilestored [{c} + {st}*1], tmm0",
                "tilestored [{c} + {st}*1 + 1024], tmm1",
                "tilestored [{c} + {st}*1 + 2048], tmm2",
                "tilestored [{c} + {st}*1 + 3072], tmm3",
                a = inout(reg) a => _,
                b0 = inout(reg) b0 => _,
                b1 = inout(reg) b1 => _,
                n = inout(reg) ksteps => _,
                st = in(reg) STRIDE,
                c = in(reg) c.0.as_mut_ptr(),
                options(nostack),
            );
        }
    }

    /// [`dot_2x2`] with one token group: C tiles 0 and 2 only (tmm0, tmm2).
    ///
    /// # Safety
    /// As [`dot_2x2`], without `b1`.
    pub(super) unsafe fn dot_2x1(a: *const Line, b0: *const Line, ksteps: usize, c: &mut CBlock) {
        // SAFETY: the function's contract.
        unsafe {
            asm!(
                "tileloadd tmm0, [{c} + {st}*1]",
                "tileloadd tmm2, [{c} + {st}*1 + 2048]",
                "2:",
                "tileloadd tmm4, [{a} + {st}*1]",
                "tileloadd tmm5, [{a} + {st}*1 + 1024]",
                "tileloadd tmm6, [{b0} + {st}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "add {a}, 2048",
                "add {b0}, 1024",
                "dec {n}",
                "jnz 2b",
                "tilestored [{c} + {st}*1], tmm0",
                "tilestored [{c} + {st}*1 + 2048], tmm2",
                a = inout(reg) a => _,
                b0 = inout(reg) b0 => _,
                n = inout(reg) ksteps => _,
                st = in(reg) STRIDE,
                c = in(reg) c.0.as_mut_ptr(),
                options(nostack),
            );
        }
    }

    /// Load the tile configuration (every tile 16 rows of 64 bytes) on this thread.
    ///
    /// # Safety
    /// AMX-TILE is present and XTILEDATA is permitted for this process.
    pub(super) unsafe fn configure() {
        // SAFETY: the function's contract; `CONFIG` is a valid 64-byte palette-1 configuration.
        unsafe { asm!("ldtilecfg [{cfg}]", cfg = in(reg) &CONFIG, options(nostack)) };
    }

    /// Return the tiles to their initial state (cheap context switches again).
    ///
    /// # Safety
    /// As [`configure`].
    pub(super) unsafe fn release() {
        // SAFETY: the function's contract.
        unsafe { asm!("tilerelease", options(nostack)) };
    }

    /// `arch_prctl` request: permission for a dynamically enabled XSAVE feature (Linux
    /// `ARCH_REQ_XCOMP_PERM`, arch/x86/include/uapi/asm/prctl.h).
    #[cfg(target_os = "linux")]
    const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
    /// The XSAVE feature number of AMX tile data (`XFEATURE_XTILEDATA`).
    #[cfg(target_os = "linux")]
    const XFEATURE_XTILEDATA: libc::c_ulong = 18;

    /// CPUID.(EAX=7, ECX=0):EDX bits of AMX-BF16 and AMX-TILE.
    const CPUID7_EDX_AMX_BF16: u32 = 1 << 22;
    const CPUID7_EDX_AMX_TILE: u32 = 1 << 24;

    /// Whether the CPU has AMX-TILE and AMX-BF16 (plus the AVX-512 the packing uses) and the
    /// kernel granted this process the tile data state. Linux only: elsewhere the OS side is
    /// not known, so no.
    pub(super) fn detect() -> Result<(), &'static str> {
        let avx512 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16");
        if !avx512 {
            return Err("no AVX-512 BF16");
        }
        // CPUID leaf 7 exists on every CPU with AVX-512 (checked just above).
        let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
        let need = CPUID7_EDX_AMX_BF16 | CPUID7_EDX_AMX_TILE;
        if edx & need != need {
            return Err("no AMX-TILE / AMX-BF16 in CPUID");
        }
        #[cfg(target_os = "linux")]
        {
            // SAFETY: arch_prctl with this request reads only its two integer arguments.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            };
            if rc == 0 {
                Ok(())
            } else {
                Err("the kernel refused ARCH_REQ_XCOMP_PERM for XTILEDATA")
            }
        }
        #[cfg(not(target_os = "linux"))]
        Err("AMX permission is only requested on Linux")
    }
}

/// See `hw::detect`; on other architectures there is no AMX.
pub(crate) fn detect() -> Result<(), &'static str> {
    #[cfg(target_arch = "x86_64")]
    {
        hw::detect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Err("not x86_64")
    }
}
