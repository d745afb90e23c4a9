//! A global allocator that counts the heap bytes and blocks currently allocated, for the
//! memory figures of the examples (`#[path]`-included; the allocator's own per-block overhead
//! is not counted).
#![allow(dead_code)] // each example uses a different subset

use std::alloc::{GlobalAlloc, Layout, System as SystemAllocator};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Forwards to the system allocator and counts the bytes currently allocated.
struct Counting;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static LIVE_BLOCKS: AtomicUsize = AtomicUsize::new(0);
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so it upholds
// exactly the contract `System` does; the counters are only statistics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is (see the impl).
        counted(unsafe { SystemAllocator.alloc(layout) }, layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is (see the impl).
        counted(unsafe { SystemAllocator.alloc_zeroed(layout) }, layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is (see the impl).
        unsafe { SystemAllocator.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is (see the impl).
        let new = unsafe { SystemAllocator.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            raise_peak(LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed) + new_size);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

/// Counts a fresh block (if the allocation succeeded) and passes it through.
fn counted(ptr: *mut u8, layout: Layout) -> *mut u8 {
    if !ptr.is_null() {
        raise_peak(LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed) + layout.size());
        LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
    }
    ptr
}

/// Records `live` as the peak if it is one: a plain load in the usual case, not a locked
/// read-modify-write on every allocation.
fn raise_peak(live: usize) {
    if live > PEAK_BYTES.load(Ordering::Relaxed) {
        PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated and not freed, process-wide.
pub fn live_bytes() -> usize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Blocks allocated and not freed, process-wide.
pub fn live_blocks() -> usize {
    LIVE_BLOCKS.load(Ordering::Relaxed)
}

/// The most bytes allocated at once since the last [`reset_peak`] (or the start). A
/// reallocation counts its new size before the old one is freed, as a copy would hold both.
pub fn peak_bytes() -> usize {
    PEAK_BYTES.load(Ordering::Relaxed)
}

/// Starts measuring the peak afresh, from what is allocated now.
pub fn reset_peak() {
    PEAK_BYTES.store(live_bytes(), Ordering::Relaxed);
}

/// Heap bytes allocated since `baseline` (signed: memory may have been freed).
pub fn heap_since(baseline: usize) -> i64 {
    live_bytes() as i64 - baseline as i64
}
