//! The descriptor-chain walker over guest memory a hostile guest controls: the first bytes
//! choose the queue size and head, the rest is written into guest memory as the descriptor
//! table (and whatever indirect tables it points to).
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_dp::port::vhost_user::chain::{walk, MAX_SEGS};
use qswitch_dp::port::vhost_user::mem::GuestView;
use qswitch_dp::port::vhost_user::GuestMem;
use vm_memory::{Bytes, GuestAddress};

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let qsize = u16::from_le_bytes([data[0], data[1]]) % 4097;
    let head = u16::from_le_bytes([data[2], data[3]]);
    let mem = GuestMem::from_ranges(&[(GuestAddress(0), 0x20000)]).unwrap();
    let table = &data[4..data.len().min(4 + 0x10000)];
    mem.write_slice(table, GuestAddress(0)).unwrap();
    let mut out = Vec::new();
    let _ = walk(&GuestView::new(&mem), GuestAddress(0), qsize.max(1), head, &mut out);
    assert!(out.len() <= MAX_SEGS);
});
