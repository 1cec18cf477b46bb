//! The table of live requests: a slab indexed by the low 32 bits of a request id,
//! with a generation in the high bits so that a stale or forged id (a request
//! already completed, an id from C code) is rejected instead of aliasing a newer
//! request. Lookups are an index and a compare: this sits on the eager hot path.

/// A slab of `T` keyed by generation-tagged ids.
#[derive(Debug)]
pub(crate) struct RequestTable<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for RequestTable<T> {
    fn default() -> Self {
        Self { slots: Vec::new(), free: Vec::new(), live: 0 }
    }
}

fn split(id: u64) -> (usize, u32) {
    ((id & 0xffff_ffff) as usize, (id >> 32) as u32)
}

impl<T> RequestTable<T> {
    /// Stores `v`; returns its id (never 0).
    pub fn insert(&mut self, v: T) -> u64 {
        self.live += 1;
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[idx as usize];
        // Generations start at 1 so that id 0 is never valid.
        slot.0 = slot.0.wrapping_add(1).max(1);
        slot.1 = Some(v);
        ((slot.0 as u64) << 32) | idx as u64
    }

    pub fn get(&self, id: u64) -> Option<&T> {
        let (i, g) = split(id);
        self.slots.get(i).filter(|s| s.0 == g).and_then(|s| s.1.as_ref())
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        let (i, g) = split(id);
        self.slots.get_mut(i).filter(|s| s.0 == g).and_then(|s| s.1.as_mut())
    }

    pub fn remove(&mut self, id: u64) -> Option<T> {
        let (i, g) = split(id);
        let s = self.slots.get_mut(i).filter(|s| s.0 == g)?;
        let v = s.1.take()?;
        self.free.push(i as u32);
        self.live -= 1;
        Some(v)
    }

    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_ids_miss_after_reuse() {
        let mut t = RequestTable::default();
        let a = t.insert(1);
        assert_ne!(a, 0);
        assert_eq!(t.remove(a), Some(1));
        let b = t.insert(2);
        // Same slot, new generation: the old id must not see the new value.
        assert_eq!(a & 0xffff_ffff, b & 0xffff_ffff);
        assert_eq!(t.get(a), None);
        assert_eq!(t.remove(a), None);
        assert_eq!(t.get(b), Some(&2));
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(0), None);
        assert_eq!(t.get(u64::MAX), None);
    }
}
