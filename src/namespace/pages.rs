//! The stored pages of one file, compact for small files.
//!
//! A page keeps only its bytes up to the last one written: a 14-byte lease
//! body costs 14 bytes, not 4 KiB, and bytes past a page's stored length
//! read as zeros (a page stored by `fallocate` may hold none). A file with
//! at most one stored page keeps it inline, without a tree node; more pages
//! go into a `BTreeMap`.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use super::PAGE;

/// One page: its first `len()` bytes; the rest of the 4 KiB read as zeros.
pub type Page = Box<[u8]>;

/// Pages by index.
#[derive(Debug, Default, Clone)]
pub enum PageMap {
    #[default]
    Empty,
    One(u64, Page),
    Many(BTreeMap<u64, Page>),
}

impl PageMap {
    /// Pages stored.
    pub fn len(&self) -> usize {
        match self {
            PageMap::Empty => 0,
            PageMap::One(..) => 1,
            PageMap::Many(m) => m.len(),
        }
    }

    pub fn get(&self, idx: u64) -> Option<&Page> {
        match self {
            PageMap::Empty => None,
            PageMap::One(i, p) => (*i == idx).then_some(p),
            PageMap::Many(m) => m.get(&idx),
        }
    }

    pub fn contains(&self, idx: u64) -> bool {
        self.get(idx).is_some()
    }

    /// The page at `idx`, stored (empty) if it was a hole, holding at least
    /// `min_len` bytes. Appending writes grow it by doubling, so a file
    /// written a few bytes at a time costs no quadratic copying.
    pub fn page_mut(&mut self, idx: u64, min_len: usize) -> &mut Page {
        if !self.contains(idx) {
            self.insert(idx, Box::default());
        }
        let page = match self {
            PageMap::One(_, p) => p,
            PageMap::Many(m) => m.get_mut(&idx).expect("inserted above"),
            PageMap::Empty => unreachable!("inserted above"),
        };
        if page.len() < min_len {
            let want = min_len.max((page.len() * 2).min(PAGE));
            let mut grown = vec![0u8; want];
            grown[..page.len()].copy_from_slice(page);
            *page = grown.into_boxed_slice();
        }
        page
    }

    /// Store `page` at `idx`, replacing what was there.
    pub fn insert(&mut self, idx: u64, page: Page) {
        match std::mem::take(self) {
            PageMap::Empty => *self = PageMap::One(idx, page),
            PageMap::One(i, _) if i == idx => *self = PageMap::One(idx, page),
            PageMap::One(i, p) => *self = PageMap::Many(BTreeMap::from([(i, p), (idx, page)])),
            PageMap::Many(mut m) => {
                m.insert(idx, page);
                *self = PageMap::Many(m);
            }
        }
    }

    /// Remove the page at `idx`; true when one was stored.
    pub fn remove(&mut self, idx: u64) -> bool {
        match self {
            PageMap::Empty => false,
            PageMap::One(i, _) => {
                let hit = *i == idx;
                if hit {
                    *self = PageMap::Empty;
                }
                hit
            }
            PageMap::Many(m) => {
                let hit = m.remove(&idx).is_some();
                self.settle();
                hit
            }
        }
    }

    /// Remove every page at or after `keep`; returns their indices.
    pub fn split_off(&mut self, keep: u64) -> Vec<u64> {
        match self {
            PageMap::Empty => Vec::new(),
            PageMap::One(i, _) => {
                let i = *i;
                if i >= keep {
                    *self = PageMap::Empty;
                    vec![i]
                } else {
                    Vec::new()
                }
            }
            PageMap::Many(m) => {
                let gone: Vec<u64> = m.split_off(&keep).into_keys().collect();
                self.settle();
                gone
            }
        }
    }

    /// Stored pages with indices in `r`, in order.
    pub fn range(&self, r: RangeInclusive<u64>) -> Box<dyn Iterator<Item = (u64, &Page)> + '_> {
        match self {
            PageMap::Empty => Box::new(std::iter::empty()),
            PageMap::One(i, p) => Box::new(r.contains(i).then_some((*i, p)).into_iter()),
            PageMap::Many(m) => Box::new(m.range(r).map(|(i, p)| (*i, p))),
        }
    }

    /// Stored page indices, in order.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.range(0..=u64::MAX).map(|(i, _)| i)
    }

    /// Mutable access to a stored page.
    pub fn get_mut(&mut self, idx: u64) -> Option<&mut Page> {
        match self {
            PageMap::Empty => None,
            PageMap::One(i, p) => (*i == idx).then_some(p),
            PageMap::Many(m) => m.get_mut(&idx),
        }
    }

    /// Back to the inline forms once the tree holds one page or none.
    fn settle(&mut self) {
        if let PageMap::Many(m) = self {
            if m.len() <= 1 {
                *self = match m.pop_first() {
                    Some((i, p)) => PageMap::One(i, p),
                    None => PageMap::Empty,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_stays_inline_and_many_go_to_the_tree_and_back() {
        let mut m = PageMap::default();
        m.page_mut(3, 14)[..2].copy_from_slice(b"ab");
        assert!(matches!(m, PageMap::One(3, _)));
        assert_eq!(m.get(3).unwrap().len(), 14);
        m.page_mut(7, 1);
        assert!(matches!(m, PageMap::Many(_)));
        assert_eq!(m.keys().collect::<Vec<_>>(), vec![3, 7]);
        assert_eq!(m.range(4..=9).map(|(i, _)| i).collect::<Vec<_>>(), vec![7]);
        assert!(m.remove(7));
        assert!(matches!(m, PageMap::One(3, _)));
        assert_eq!(&m.get(3).unwrap()[..2], b"ab");
        assert_eq!(m.split_off(4), Vec::<u64>::new());
        assert_eq!(m.split_off(3), vec![3]);
        assert!(matches!(m, PageMap::Empty));
        assert!(!m.remove(3));
    }

    #[test]
    fn appending_grows_by_doubling_up_to_a_page() {
        let mut m = PageMap::default();
        let mut sizes = Vec::new();
        for n in 1..=PAGE {
            let len = m.page_mut(0, n).len();
            if sizes.last() != Some(&len) {
                sizes.push(len);
            }
        }
        assert_eq!(sizes, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]);
    }
}
