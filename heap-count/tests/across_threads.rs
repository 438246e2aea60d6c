//! Blocks allocated on many threads at once (more threads than slots, so some share the last)
//! and freed on another are counted while they live and not after. The threads start together
//! and churn first, so an update lost between two threads (a slot shared without a locked add)
//! shows in the count.
//!
//! A binary of its own without the test harness (`harness = false`): the count is the whole
//! process's, and the harness's own thread allocated beside the test now and then (once
//! 900 bytes, in one run of six).

use std::sync::{Arc, Barrier, mpsc};

#[global_allocator]
static HEAP: heap_count::Counting = heap_count::Counting;

fn main() {
    const THREADS: usize = 80;
    let before = heap_count::live();
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let start = Arc::new(Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|i| {
            let (tx, start) = (tx.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..20_000 {
                    std::hint::black_box(Box::new([0u8; 24]));
                }
                let mut block = Vec::with_capacity(1000 + i);
                block.resize(1000 + i, 7);
                // Grown in place or moved: either way the count follows the capacity.
                block.reserve_exact(1000);
                tx.send(block).unwrap();
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    drop((tx, start));
    let blocks: Vec<Vec<u8>> = rx.into_iter().collect();
    let held: usize = blocks.iter().map(Vec::capacity).sum::<usize>() + blocks.capacity() * size_of::<Vec<u8>>();
    // The channel's own blocks are freed by now; the threads' handles too.
    let counted = heap_count::live() - before;
    assert_eq!(counted, held, "live heap {counted} B, the test holds {held} B");
    drop(blocks);
    assert_eq!(heap_count::live(), before);
    println!("counts what lives across threads: ok ({held} B on {THREADS} threads)");
}
