//! CPU hints for the data path.

/// Asks the CPU to bring the cache line holding `p` into its caches (all levels), so a read
/// that follows soon does not wait for memory or another core. A hint only: any address,
/// mapped or not, is allowed, nothing is read and no fault can result.
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 never faults and reads nothing architecturally visible; any
    // pointer value, valid or not, is allowed.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Like [`prefetch`], with the intent to write: the line is fetched in exclusive state, so
/// a store that follows soon does not wait for another core to give the line up (PREFETCHW;
/// a plain prefetch or nothing on CPUs without it).
#[inline(always)]
pub fn prefetch_write<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW never faults and changes nothing architecturally visible; any
    // pointer value, valid or not, is allowed.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
