//! A typed kernel parameter list: `LaunchArgs::new().ptr(x).i32(n).f32(eps)` holds each value in
//! a slot of its own and hands the launch the `*mut c_void` array that points at them, so a caller
//! builds no raw pointer array and cannot point a parameter at a temporary or at the wrong width.
//!
//! The list lives on the stack (no allocation per launch): [`MAX_LAUNCH_PARAMS`] slots of eight
//! bytes, each 8-aligned, a value's bytes at the slot's start — what the driver reads for a
//! parameter of that type. The pointer array is rebuilt from the slots by [`LaunchArgs::params`],
//! whose borrow keeps the slots from moving or changing while the array is in use.

use std::ffi::c_void;

use crate::context::DeviceMemory;
use crate::error::GpuError;

/// Parameters one list holds at most: above the widest kernel of the project (14, the flags
/// wait-fold) with room for the decode kernels; 24 × 16 bytes stay a small stack value.
pub const MAX_LAUNCH_PARAMS: usize = 24;

/// One parameter's bytes: eight, 8-aligned, so every scalar and device address fits at offset 0
/// with its own alignment.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Slot([u8; 8]);

/// A kernel's parameters in order, each typed; see the module docs.
pub struct LaunchArgs {
    slots: [Slot; MAX_LAUNCH_PARAMS],
    ptrs: [*mut c_void; MAX_LAUNCH_PARAMS],
    len: usize,
    /// Parameters pushed past [`MAX_LAUNCH_PARAMS`] (then [`LaunchArgs::params`] refuses).
    overflow: usize,
}

impl Default for LaunchArgs {
    fn default() -> Self {
        LaunchArgs::new()
    }
}

impl std::fmt::Debug for LaunchArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchArgs")
            .field("len", &(self.len + self.overflow))
            .finish()
    }
}

impl LaunchArgs {
    /// An empty list.
    pub fn new() -> LaunchArgs {
        LaunchArgs {
            slots: [Slot([0; 8]); MAX_LAUNCH_PARAMS],
            ptrs: [std::ptr::null_mut(); MAX_LAUNCH_PARAMS],
            len: 0,
            overflow: 0,
        }
    }

    fn push(mut self, bytes: &[u8]) -> LaunchArgs {
        match self.slots.get_mut(self.len) {
            Some(slot) => {
                slot.0[..bytes.len()].copy_from_slice(bytes);
                self.len += 1;
            }
            None => self.overflow += 1,
        }
        self
    }

    /// A device address parameter (`T*` in the kernel), as a raw `u64`.
    pub fn ptr(self, device_ptr: u64) -> LaunchArgs {
        self.push(&device_ptr.to_ne_bytes())
    }

    /// A device buffer's address (`T*` in the kernel).
    pub fn buf<M: DeviceMemory + ?Sized>(self, mem: &M) -> LaunchArgs {
        self.ptr(mem.device_ptr())
    }

    /// An `int` parameter.
    pub fn i32(self, v: i32) -> LaunchArgs {
        self.push(&v.to_ne_bytes())
    }

    /// An `unsigned int` parameter.
    pub fn u32(self, v: u32) -> LaunchArgs {
        self.push(&v.to_ne_bytes())
    }

    /// An `unsigned long long` parameter.
    pub fn u64(self, v: u64) -> LaunchArgs {
        self.push(&v.to_ne_bytes())
    }

    /// A `float` parameter.
    pub fn f32(self, v: f32) -> LaunchArgs {
        self.push(&v.to_ne_bytes())
    }

    /// Parameters pushed.
    pub fn len(&self) -> usize {
        self.len + self.overflow
    }

    /// True iff no parameter was pushed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pointer array for a launch (`Backend::launch`'s `params`), one pointer per
    /// parameter into this list's slots; an error if more than [`MAX_LAUNCH_PARAMS`] were
    /// pushed. The borrow keeps the slots in place while the array is used.
    pub fn params(&mut self) -> Result<&mut [*mut c_void], GpuError> {
        if self.overflow > 0 {
            return Err(GpuError::BufferTooSmall {
                what: "launch parameter slots",
                need: self.len + self.overflow,
                got: MAX_LAUNCH_PARAMS,
            });
        }
        for (p, slot) in self
            .ptrs
            .iter_mut()
            .zip(self.slots.iter_mut())
            .take(self.len)
        {
            *p = slot.0.as_mut_ptr().cast();
        }
        Ok(&mut self.ptrs[..self.len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Every pointer reads back its own value at its own width, 8-aligned, in order.
    #[test]
    fn each_pointer_reads_back_its_value() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x1A0C);
        for _ in 0..50 {
            let (p, n, u, e, w): (u64, i32, u32, f32, u64) = (
                rng.random(),
                rng.random(),
                rng.random(),
                rng.random_range(-1e6f32..1e6),
                rng.random(),
            );
            let mut args = LaunchArgs::new().ptr(p).i32(n).u32(u).f32(e).u64(w);
            assert_eq!(args.len(), 5);
            let params = args.params().expect("within the slots");
            assert_eq!(params.len(), 5);
            for q in params.iter() {
                assert_eq!(*q as usize % 8, 0, "slot alignment");
            }
            // SAFETY: each pointer points at an 8-byte slot of `args`, alive and unmoved here,
            // holding the value of the type read.
            unsafe {
                assert_eq!(*(params[0] as *const u64), p);
                assert_eq!(*(params[1] as *const i32), n);
                assert_eq!(*(params[2] as *const u32), u);
                assert_eq!((*(params[3] as *const f32)).to_bits(), e.to_bits());
                assert_eq!(*(params[4] as *const u64), w);
            }
            let distinct: std::collections::HashSet<usize> =
                params.iter().map(|q| *q as usize).collect();
            assert_eq!(distinct.len(), 5, "one slot per parameter");
        }
    }

    #[test]
    fn too_many_parameters_is_an_error() {
        let mut args = LaunchArgs::new();
        for i in 0..MAX_LAUNCH_PARAMS as i32 {
            args = args.i32(i);
        }
        assert_eq!(
            args.params().expect("exactly full").len(),
            MAX_LAUNCH_PARAMS
        );
        let mut args = args.i32(-1);
        assert_eq!(args.len(), MAX_LAUNCH_PARAMS + 1);
        assert!(matches!(
            args.params(),
            Err(GpuError::BufferTooSmall { need, got, .. })
                if need == MAX_LAUNCH_PARAMS + 1 && got == MAX_LAUNCH_PARAMS
        ));
        assert!(LaunchArgs::new().is_empty());
        assert!(LaunchArgs::new().params().expect("empty").is_empty());
    }
}
