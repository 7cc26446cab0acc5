//! The operator's allocator: jemalloc, set to give freed pages back to the system within a second.
//!
//! glibc's malloc, which the operator used before, kept about a third of the RSS at the end of a
//! 5,000-node migration as free memory in pages that live objects still shared, and `malloc_trim`
//! could not return it (docs/benchmarks.md). jemalloc keeps objects of one size class together,
//! so the pages a peak leaves behind empty out, and its background thread purges them.
//!
//! The binary installs [`Jemalloc`] as its global allocator and exports [`CONF`] under the name
//! jemalloc reads its options from (`operator/src/main.rs`); the library only reads statistics.

use std::ffi::c_char;

pub use tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at its first allocation:
/// - `background_thread`: a thread of jemalloc's own purges freed pages, so a quiet operator
///   gives its peak back without an allocation to trigger it;
/// - `narenas:2`: two arenas for the runtime's two worker threads, not jemalloc's default of four
///   per core, each with its own half-empty pages;
/// - `dirty_decay_ms:1000,muzzy_decay_ms:0`: freed pages go back to the system after a second,
///   at once with `MADV_DONTNEED` rather than in two stages.
pub const CONF: Conf =
    Conf(c"background_thread:true,narenas:2,dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr());

/// A C string for jemalloc's `malloc_conf` symbol: a pointer to static text.
#[repr(transparent)]
pub struct Conf(pub *const c_char);

// SAFETY: the pointer is to a static, immutable C string literal.
unsafe impl Sync for Conf {}

/// Bytes the allocator has handed out and not taken back: jemalloc's `stats.allocated`, after an
/// epoch refresh. `None` if jemalloc does not answer. Only meaningful in a binary whose global
/// allocator is [`Jemalloc`] (the operator's). Read it per scrape, not per allocation.
pub fn heap_in_use() -> Option<u64> {
    tikv_jemalloc_ctl::epoch::advance().ok()?;
    tikv_jemalloc_ctl::stats::allocated::read().ok().map(|bytes| bytes as u64)
}

/// The options jemalloc runs with, as it reports them: `None` if it does not answer.
pub fn options() -> Option<String> {
    use tikv_jemalloc_ctl::{opt, raw};
    // SAFETY: both options are `ssize_t` in jemalloc, read into an `isize`.
    let (dirty, muzzy) = unsafe {
        (raw::read::<isize>(b"opt.dirty_decay_ms\0").ok()?, raw::read::<isize>(b"opt.muzzy_decay_ms\0").ok()?)
    };
    Some(format!(
        "background_thread={} narenas={} dirty_decay_ms={dirty} muzzy_decay_ms={muzzy}",
        opt::background_thread::read().ok()?,
        opt::narenas::read().ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The library's own tests run on jemalloc too, so the statistics below are the allocator's.
    #[global_allocator]
    static ALLOCATOR: Jemalloc = Jemalloc;

    #[test]
    fn heap_in_use_counts_a_live_allocation() {
        let before = heap_in_use().unwrap();
        let block = vec![1u8; 64 << 20];
        let during = heap_in_use().unwrap();
        drop(std::hint::black_box(block));
        let after = heap_in_use().unwrap();
        // Other test threads allocate and free too: a margin of 16 MiB on the 64 MiB block.
        assert!(during >= before + (48 << 20), "{before} then {during}");
        assert!(after + (48 << 20) <= during, "{during} then {after}");
    }
}
