//! Fixed-capacity vectors that share one anonymous mapping with huge pages: a table split
//! into shards (the firewall's connection table) keeps each shard's slots apart, each under
//! its own lock, while the memory is one range the kernel can back with 2 MiB pages. A
//! table walked at random then misses the TLB far less than with a small allocation per
//! shard (each below 2 MiB, so never backed by a huge page). The pages are backed as the
//! vectors grow (`MAP_NORESERVE`, written on push), never all at once.

use std::io;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

const HUGE: usize = 2 << 20;

/// The mapping, unmapped when the last vector in it goes.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is only an address range; every byte of it is reached through exactly
// one `SlabVec` (disjoint parts), which carries its own Send/Sync bounds.
unsafe impl Send for Mapping {}
// SAFETY: as above: `&Mapping` gives no access to the bytes.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `slab` (same address and length), when
        // the last vector holding it (the only users of its bytes) is dropped.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A vector of at most `capacity` values of `T` in its own part of a shared mapping.
pub struct SlabVec<T: Copy> {
    /// `None` for vectors of no capacity, which map nothing.
    _map: Option<Arc<Mapping>>,
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
    _t: PhantomData<T>,
}

// SAFETY: a `SlabVec` owns its part of the mapping alone (like a `Vec<T>` its buffer); the
// shared `Arc<Mapping>` is only kept to unmap at the end.
unsafe impl<T: Copy + Send> Send for SlabVec<T> {}
// SAFETY: `&SlabVec` gives only `&[T]`, as `&Vec<T>` does.
unsafe impl<T: Copy + Sync> Sync for SlabVec<T> {}

/// `parts` vectors of `capacity` values of `T` each, in one private anonymous mapping
/// advised for transparent huge pages (`MADV_HUGEPAGE`; refused advice is ignored: the
/// vectors work on small pages). Nothing is backed until written. With no capacity (or a
/// zero-sized `T`) nothing is mapped and this cannot fail.
pub fn slab<T: Copy>(parts: usize, capacity: usize) -> io::Result<Vec<SlabVec<T>>> {
    let (map, at) = reserve::<T>(parts, capacity)?;
    let cap = if map.is_some() || std::mem::size_of::<T>() == 0 {
        capacity
    } else {
        0
    };
    Ok(at
        .into_iter()
        .map(|ptr| SlabVec {
            _map: map.clone(),
            ptr,
            len: 0,
            cap,
            _t: PhantomData,
        })
        .collect())
}

/// The mapping of `parts` parts of `capacity` values of `T` and where each part starts
/// (aligned for `T`); no mapping (and dangling starts) when there is nothing to hold.
#[allow(clippy::type_complexity)]
fn reserve<T>(
    parts: usize,
    capacity: usize,
) -> io::Result<(Option<Arc<Mapping>>, Vec<NonNull<T>>)> {
    if capacity == 0 || parts == 0 || std::mem::size_of::<T>() == 0 {
        return Ok((None, vec![NonNull::dangling(); parts]));
    }
    let align = std::mem::align_of::<T>();
    // Each part starts aligned for `T`: the mapping is, and parts are multiples of it.
    if align > 4096 {
        return Err(io::Error::other("slab of a type aligned above a page"));
    }
    let part = capacity
        .checked_mul(std::mem::size_of::<T>())
        .and_then(|b| b.checked_next_multiple_of(align))
        .ok_or_else(|| io::Error::other("slab too large"))?;
    let len = part
        .checked_mul(parts)
        .and_then(|b| b.checked_next_multiple_of(HUGE))
        .ok_or_else(|| io::Error::other("slab too large"))?
        .max(HUGE);
    // One huge page more, so that the mapping can start on a 2 MiB boundary.
    let whole = len + HUGE;
    // SAFETY: a fresh private anonymous mapping at an address the kernel picks; no existing
    // memory is touched. The result is checked for MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            whole,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = p as usize;
    let start = base.next_multiple_of(HUGE);
    // SAFETY: the slack before `start` and after `start + len` lies inside the mapping just
    // made and nothing refers to it: unmapping it leaves exactly [start, start + len).
    unsafe {
        if start > base {
            libc::munmap(p, start - base);
        }
        let tail = base + whole - (start + len);
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
    }
    // SAFETY: advice over the mapping just made (aligned, whole pages); MADV_HUGEPAGE
    // changes no byte. A kernel without THP refuses it, which only costs the TLB reach.
    unsafe {
        libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
    let map = Arc::new(Mapping {
        ptr: NonNull::new(start as *mut u8).ok_or_else(|| io::Error::other("mmap gave null"))?,
        len,
    });
    let at = (0..parts)
        // Inside the mapping (so not null), aligned for T (see above).
        .map(|i| NonNull::new((start + i * part) as *mut T).unwrap_or(NonNull::dangling()))
        .collect();
    Ok((Some(map), at))
}

/// A shared, fixed slice of `T` (atomics) in its own part of a mapping: [`shared`].
pub struct SlabSlice<T> {
    _map: Store<T>,
    ptr: NonNull<T>,
    len: usize,
}

impl<T> Clone for SlabSlice<T> {
    fn clone(&self) -> SlabSlice<T> {
        SlabSlice {
            _map: self._map.clone(),
            ptr: self.ptr,
            len: self.len,
        }
    }
}

// SAFETY: a `SlabSlice` only gives `&[T]` (like an `Arc<[T]>`), so it may move to or be
// shared with another thread when `T` may be shared.
unsafe impl<T: Sync + Send> Send for SlabSlice<T> {}
// SAFETY: as above.
unsafe impl<T: Sync + Send> Sync for SlabSlice<T> {}

/// `parts` slices of `len` values each made by `init`, in one mapping advised for huge
/// pages as in [`slab`] (on the heap, one allocation per part, when it cannot be mapped),
/// every value written now; each slice shared by its clones (as an `Arc<[T]>`), for values
/// changed through `&` (atomics). `T` must need no drop (checked when compiled: the values
/// are never dropped, only unmapped).
pub fn shared<T: Sync>(parts: usize, len: usize, init: impl Fn() -> T) -> Vec<SlabSlice<T>> {
    const {
        assert!(
            !std::mem::needs_drop::<T>(),
            "a shared slab of a type with a destructor"
        )
    };
    let Ok((map, at)) = reserve::<T>(parts, len) else {
        return (0..parts)
            .map(|_| {
                let heap: Arc<[T]> = (0..len).map(|_| init()).collect();
                SlabSlice {
                    ptr: NonNull::new(heap.as_ptr().cast_mut()).unwrap_or(NonNull::dangling()),
                    len,
                    _map: Store::Heap(heap),
                }
            })
            .collect();
    };
    let len = if map.is_some() || std::mem::size_of::<T>() == 0 {
        len
    } else {
        0
    };
    at.into_iter()
        .map(|ptr| {
            for i in 0..len {
                // SAFETY: slot `i` is inside this part (below `len`, its size), aligned for
                // T, and nothing refers to it yet: the part was just mapped and is handed
                // out only below, after every slot is written.
                unsafe { ptr.as_ptr().add(i).write(init()) };
            }
            SlabSlice {
                _map: Store::Map(map.clone()),
                ptr,
                len,
            }
        })
        .collect()
}

/// What keeps a [`SlabSlice`]'s values alive.
enum Store<T> {
    /// Its part of a mapping (`None`: nothing to hold).
    Map(Option<Arc<Mapping>>),
    /// A heap allocation of its own, when the mapping could not be made.
    Heap(Arc<[T]>),
}

impl<T> Clone for Store<T> {
    fn clone(&self) -> Store<T> {
        match self {
            Store::Map(m) => Store::Map(m.clone()),
            Store::Heap(h) => Store::Heap(h.clone()),
        }
    }
}

impl<T> std::ops::Deref for SlabSlice<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: the `len` values of this part were written in `shared` before any clone
        // existed (or are the heap slice's), are aligned for T, and live as long as
        // `self._map` (no mapping: `len` is 0 and the pointer dangling but aligned); only
        // shared references are ever made.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> SlabVec<T> {
    /// Appends `v`; gives it back when the vector is at its capacity.
    #[inline]
    pub fn push(&mut self, v: T) -> Result<(), T> {
        if self.len == self.cap {
            return Err(v);
        }
        // SAFETY: `len < cap`, so the slot is inside this vector's part of the mapping
        // (which lives as long as `self._map`; for a zero-sized T a dangling aligned
        // pointer, which a write of nothing accepts), aligned for T, and no reference to it
        // exists (slices given out borrow `self` and cover `..len` only).
        unsafe { self.ptr.as_ptr().add(self.len).write(v) };
        self.len += 1;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Where the vector's values start (its slot `i` at `i * size_of::<T>()` past it): for
    /// prefetch hints and [`crate::anon::populate_write`], never to be dereferenced.
    pub fn as_ptr(&self) -> *const T {
        self.ptr.as_ptr()
    }
}

impl<T: Copy> std::ops::Deref for SlabVec<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: the first `len` slots of this vector's part were written by `push`, are
        // aligned for T, and live as long as `self._map` (no capacity: `len` is 0 and the
        // pointer dangling but aligned, as an empty slice allows); the borrow of self
        // keeps them.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> std::ops::DerefMut for SlabVec<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in deref, and `&mut self` makes this the only access to the part.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Copy> std::fmt::Debug for SlabVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlabVec")
            .field("len", &self.len)
            .field("cap", &self.cap)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_apart_and_bounded() {
        let mut parts = slab::<[u32; 3]>(5, 7).unwrap();
        for (i, p) in parts.iter_mut().enumerate() {
            for k in 0..7u32 {
                p.push([i as u32, k, 9]).unwrap();
            }
            assert_eq!(p.push([0; 3]), Err([0; 3]));
            assert_eq!(p.len(), 7);
            assert_eq!(p.capacity(), 7);
        }
        for (i, p) in parts.iter().enumerate() {
            assert!(p
                .iter()
                .enumerate()
                .all(|(k, v)| *v == [i as u32, k as u32, 9]));
        }
        parts[2][3] = [1, 1, 1];
        assert_eq!(parts[2][3], [1, 1, 1]);
        assert_eq!(parts[3][3], [3, 3, 9]);
        // The mapping starts on a 2 MiB boundary and outlives any one part.
        assert_eq!(parts[0].as_ptr() as usize % HUGE, 0);
        let last = parts.pop().unwrap();
        drop(parts);
        assert_eq!(last[6], [4, 6, 9]);
        let heads = shared(3, 1000, || std::sync::atomic::AtomicU32::new(7));
        let again = heads[1].clone();
        drop(heads);
        assert_eq!(again.len(), 1000);
        again[999].store(3, std::sync::atomic::Ordering::Relaxed);
        assert!(again[..999]
            .iter()
            .all(|a| a.load(std::sync::atomic::Ordering::Relaxed) == 7));
        assert_eq!(again[999].load(std::sync::atomic::Ordering::Relaxed), 3);
        let empty = slab::<u64>(0, 0).unwrap();
        assert!(empty.is_empty());
        let mut none = slab::<u64>(3, 0).unwrap();
        assert_eq!(none.len(), 3);
        assert_eq!(none[1].push(5), Err(5));
        assert!(none[1].is_empty() && none[1].iter().next().is_none());
    }
}
