//! A map keyed by inode number that never stops requests to grow.
//!
//! A hash table grows by moving every entry into a table twice the size at
//! once: at a million inodes that is about 30 ms during one request, and
//! the namespace keeps several tables of that size (inodes, name hints,
//! idle leases), which all grow at the same count. Once large, the map
//! splits its entries over `SHARDS` tables that each grow on their own,
//! a 64th of the work at a time.

use std::collections::hash_map::{Entry, HashMap};
use std::hash::BuildHasherDefault;

use super::{Ino, InoHasher};

type Table<V> = HashMap<Ino, V, BuildHasherDefault<InoHasher>>;

/// Tables of a large map.
const SHARDS: usize = 64;
/// A map splits once it holds this many entries (moving them takes a
/// fraction of a millisecond, once).
const SPLIT_AT: usize = 1 << 13;

/// A map keyed by inode number.
#[derive(Clone)]
pub struct InoMap<V> {
    shards: Vec<Table<V>>,
    len: usize,
}

impl<V> Default for InoMap<V> {
    fn default() -> Self {
        InoMap { shards: Vec::new(), len: 0 }
    }
}

impl<V: std::fmt::Debug> std::fmt::Debug for InoMap<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<V> InoMap<V> {
    /// A map with room for `n` entries (the hasher argument is the
    /// default's; kept so it reads like a `HashMap`'s).
    pub fn with_capacity_and_hasher(n: usize, _: BuildHasherDefault<InoHasher>) -> Self {
        let shards = if n >= SPLIT_AT {
            (0..SHARDS).map(|_| Table::with_capacity_and_hasher(n / SHARDS + 1, Default::default())).collect()
        } else {
            vec![Table::with_capacity_and_hasher(n, Default::default())]
        };
        InoMap { shards, len: 0 }
    }

    /// Which table holds `ino` (top bits of a multiplication other than
    /// the tables' own hash).
    fn shard(&self, ino: &Ino) -> usize {
        if self.shards.len() <= 1 {
            return 0;
        }
        (ino.0.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 58) as usize % self.shards.len()
    }

    /// Make room for one more entry: the first table, or the split.
    fn grow(&mut self) {
        if self.shards.is_empty() {
            self.shards.push(Table::default());
        } else if self.shards.len() == 1 && self.len >= SPLIT_AT {
            let all = std::mem::take(&mut self.shards[0]);
            self.shards = (0..SHARDS)
                .map(|_| Table::with_capacity_and_hasher(2 * all.len() / SHARDS, Default::default()))
                .collect();
            for (k, v) in all {
                let i = self.shard(&k);
                self.shards[i].insert(k, v);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, ino: &Ino) -> Option<&V> {
        self.shards.get(self.shard(ino))?.get(ino)
    }

    pub fn get_mut(&mut self, ino: &Ino) -> Option<&mut V> {
        let i = self.shard(ino);
        self.shards.get_mut(i)?.get_mut(ino)
    }

    pub fn contains_key(&self, ino: &Ino) -> bool {
        self.get(ino).is_some()
    }

    pub fn insert(&mut self, ino: Ino, v: V) -> Option<V> {
        self.grow();
        let i = self.shard(&ino);
        let old = self.shards[i].insert(ino, v);
        self.len += usize::from(old.is_none());
        old
    }

    pub fn remove(&mut self, ino: &Ino) -> Option<V> {
        let i = self.shard(ino);
        let old = self.shards.get_mut(i)?.remove(ino)?;
        self.len -= 1;
        Some(old)
    }

    /// The entry of `ino` (counted when it is filled).
    pub fn entry(&mut self, ino: Ino) -> InoEntry<'_, V> {
        self.grow();
        let i = self.shard(&ino);
        InoEntry { entry: self.shards[i].entry(ino), len: &mut self.len }
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&Ino, &mut V) -> bool) {
        for t in &mut self.shards {
            t.retain(&mut keep);
        }
        self.len = self.shards.iter().map(HashMap::len).sum();
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Ino, &V)> {
        self.shards.iter().flat_map(|t| t.iter())
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.shards.iter_mut().flat_map(|t| t.values_mut())
    }
}

impl<V> IntoIterator for InoMap<V> {
    type Item = (Ino, V);
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<Table<V>>>;
    fn into_iter(self) -> Self::IntoIter {
        self.shards.into_iter().flatten()
    }
}

/// An entry of an [`InoMap`]: a `HashMap` entry that keeps the map's count
/// right when it is filled.
pub struct InoEntry<'a, V> {
    entry: Entry<'a, Ino, V>,
    len: &'a mut usize,
}

impl<'a, V> InoEntry<'a, V> {
    pub fn or_insert_with(self, f: impl FnOnce() -> V) -> &'a mut V {
        if matches!(self.entry, Entry::Vacant(_)) {
            *self.len += 1;
        }
        self.entry.or_insert_with(f)
    }

    pub fn or_insert(self, v: V) -> &'a mut V {
        self.or_insert_with(|| v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_map_splits_and_keeps_every_entry_and_its_count() {
        let mut m: InoMap<u64> = InoMap::default();
        let n = 3 * SPLIT_AT as u64;
        for i in 0..n {
            assert_eq!(m.insert(Ino(i), i), None);
        }
        assert_eq!(m.shards.len(), SHARDS);
        assert_eq!(m.insert(Ino(5), 50), Some(5), "a replaced value is not counted again");
        assert_eq!(m.len(), n as usize);
        for i in (0..n).step_by(2) {
            assert_eq!(m.remove(&Ino(i)), Some(i));
        }
        assert_eq!(m.remove(&Ino(0)), None);
        *m.entry(Ino(1)).or_insert(0) += 1;
        *m.entry(Ino(0)).or_insert(7) += 1;
        assert_eq!((m.get(&Ino(1)), m.get(&Ino(0)), m.get(&Ino(2))), (Some(&2), Some(&8), None));
        assert_eq!(m.len(), n as usize / 2 + 1);
        m.retain(|k, _| k.0 % 3 != 0);
        assert_eq!(m.len(), m.iter().count());
        assert_eq!(m.len(), (0..n).filter(|i| (i % 2 == 1 || *i == 0) && i % 3 != 0).count());
        assert!(m.shards.iter().all(|t| t.len() < 2 * m.len() / SHARDS), "entries spread over the tables");
        let total: u64 = m.into_iter().map(|(k, _)| k.0).sum();
        assert_eq!(total, (0..n).filter(|i| i % 2 == 1 && i % 3 != 0).sum::<u64>());
    }
}
