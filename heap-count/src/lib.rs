//! The live heap of a process (bytes allocated and not yet freed), counted by a global
//! allocator cheap enough to leave on while measuring time.
//!
//! Each thread adds to a slot of its own with a plain load and store: no locked instruction
//! and no cache line shared with another thread, so counting costs an allocation a few
//! instructions. [`live`] sums the slots with relaxed reads: a sample, exact once the threads
//! it counts are quiet.
//!
//! Why not a crate from crates.io: `cap` keeps one atomic counter for the process, and its
//! `lock xadd` on one cache line in every allocation and free cost kuralle's in-flight bench a
//! tenth of its CPU; `accounting-allocator` keeps one per thread but makes three locked
//! read-modify-writes, a `catch_unwind` and two thread-local lookups per call, 12% of the
//! bench's CPU a run at 10,000 runs (`docs/performance.md`, "The bench's own counting").
//!
//! ```
//! #[global_allocator]
//! static HEAP: heap_count::Counting = heap_count::Counting;
//!
//! fn main() {
//!     let before = heap_count::live();
//!     let kept = vec![0u8; 4096];
//!     assert_eq!(heap_count::live() - before, 4096);
//!     drop(kept);
//!     assert_eq!(heap_count::live(), before);
//! }
//! ```

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
    sync::atomic::{AtomicIsize, AtomicUsize, Ordering::Relaxed},
};

/// The system allocator, counting the live heap; install it with `#[global_allocator]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counting;

/// One slot for each of the first `SLOTS - 1` threads that allocate, and a last one that the
/// threads after them share, adding to it with a locked instruction.
const SLOTS: usize = 64;

/// A slot on a cache line of its own (two lines: the prefetcher fetches pairs), so that two
/// threads' counts never share one.
#[repr(align(128))]
struct Slot(AtomicIsize);

static COUNTS: [Slot; SLOTS] = [const { Slot(AtomicIsize::new(0)) }; SLOTS];
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's slot, `usize::MAX` until its first allocation. A `const` cell without a
    /// destructor: reading it allocates nothing, and it can be read while the thread exits.
    static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn add(bytes: isize) {
    let slot = MINE
        .try_with(|mine| match mine.get() {
            usize::MAX => {
                let slot = NEXT.fetch_add(1, Relaxed).min(SLOTS - 1);
                mine.set(slot);
                slot
            }
            slot => slot,
        })
        .unwrap_or(SLOTS - 1);
    let count = &COUNTS[slot].0;
    if slot < SLOTS - 1 {
        // Only this thread writes its slot, so a load and a store are a whole update.
        // Wrapping, as `fetch_add` is: an allocator must not panic.
        count.store(count.load(Relaxed).wrapping_add(bytes), Relaxed);
    } else {
        count.fetch_add(bytes, Relaxed);
    }
}

/// Bytes allocated through [`Counting`] and not yet freed, over every thread.
///
/// A memory block freed on another thread than the one that allocated it leaves one slot
/// short and the other over; the sum is right.
pub fn live() -> usize {
    COUNTS.iter().map(|slot| slot.0.load(Relaxed)).sum::<isize>().max(0) as usize
}

// SAFETY: every method passes its call to `System` unchanged and returns its result; the
// counting beside it allocates nothing and cannot unwind.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            add(layout.size() as isize);
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            add(layout.size() as isize);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(block, layout) };
        add(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract for `realloc`, passed on.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            add(new_size as isize - layout.size() as isize);
        }
        moved
    }
}
