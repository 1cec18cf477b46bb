//! MPI message matching: posted receives against arriving messages.
//!
//! A message matches a receive when the source and tag agree, either side of the
//! receive possibly a wildcard. MPI's non-overtaking rule says two messages from one
//! sender that both match a receive are matched in the order they were sent; since
//! each sender's packets arrive in order (FIFO rings) it suffices to scan both queues
//! front to back.

use std::collections::VecDeque;

use crate::{Rank, ReqId, Tag};

/// Tags from here up belong to the transport's own collectives (barrier, ...). A
/// wildcard receive never matches them, so library traffic cannot be stolen by a
/// user's ANY_TAG receive (MPI gives collectives their own context for this).
pub const RESERVED_TAG_BASE: Tag = i32::MAX - 16;

/// What a posted receive accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Selector {
    /// None = any source.
    pub source: Option<Rank>,
    /// None = any tag.
    pub tag: Option<Tag>,
}

impl Selector {
    pub fn accepts(&self, source: Rank, tag: Tag) -> bool {
        self.source.is_none_or(|s| s == source)
            && match self.tag {
                Some(t) => t == tag,
                None => tag < RESERVED_TAG_BASE,
            }
    }
}

/// Queues of posted receives and of messages that arrived before their receive.
#[derive(Debug)]
pub struct Matcher<U> {
    posted: VecDeque<(ReqId, Selector)>,
    unexpected: VecDeque<(Rank, Tag, U)>,
}

impl<U> Default for Matcher<U> {
    fn default() -> Self {
        Self { posted: VecDeque::new(), unexpected: VecDeque::new() }
    }
}

impl<U> Matcher<U> {
    /// A new receive: returns the earliest unexpected message it matches, or queues it.
    pub fn post(&mut self, req: ReqId, sel: Selector) -> Option<(Rank, Tag, U)> {
        if let Some(i) = self.unexpected.iter().position(|(s, t, _)| sel.accepts(*s, *t)) {
            return self.unexpected.remove(i);
        }
        self.posted.push_back((req, sel));
        None
    }

    /// A new message, if a posted receive accepts it: removes and returns the
    /// earliest such receive (the message is then the caller's to deliver).
    pub fn take_posted(&mut self, source: Rank, tag: Tag) -> Option<ReqId> {
        let i = self.posted.iter().position(|(_, sel)| sel.accepts(source, tag))?;
        self.posted.remove(i).map(|(req, _)| req)
    }

    /// The earliest posted receive that would take a message from `source` with `tag`.
    pub fn first_posted(&self, source: Rank, tag: Tag) -> Option<ReqId> {
        self.posted.iter().find(|(_, sel)| sel.accepts(source, tag)).map(|(req, _)| *req)
    }

    /// A new message: returns the earliest posted receive that accepts it, with the
    /// message handed back, or keeps the message as unexpected (None).
    pub fn arrive(&mut self, source: Rank, tag: Tag, msg: U) -> Option<(ReqId, U)> {
        if let Some(req) = self.take_posted(source, tag) {
            return Some((req, msg));
        }
        self.unexpected.push_back((source, tag, msg));
        None
    }

    /// The earliest unexpected message a receive with `sel` would match (MPI_Iprobe).
    pub fn probe(&self, sel: Selector) -> Option<&(Rank, Tag, U)> {
        self.unexpected.iter().find(|(s, t, _)| sel.accepts(*s, *t))
    }

    /// Removes a posted receive that has not matched yet (MPI_Cancel); false if it matched.
    pub fn cancel(&mut self, req: ReqId) -> bool {
        match self.posted.iter().position(|(r, _)| *r == req) {
            Some(i) => {
                self.posted.remove(i);
                true
            }
            None => false,
        }
    }

    /// Removes the posted receives that can only match `source` (it died), returning them.
    pub fn drain_posted_from(&mut self, source: Rank) -> Vec<ReqId> {
        self.drain_posted_where(|sel| sel.source == Some(source))
    }

    /// Removes the posted receives whose selector `doomed` accepts, returning them.
    pub fn drain_posted_where(&mut self, mut doomed: impl FnMut(&Selector) -> bool) -> Vec<ReqId> {
        let mut out = Vec::new();
        self.posted.retain(|(r, sel)| {
            let d = doomed(sel);
            if d {
                out.push(*r);
            }
            !d
        });
        out
    }

    /// Drops the unexpected messages from `source` that `keep` rejects.
    pub fn retain_unexpected(&mut self, mut keep: impl FnMut(Rank, &U) -> bool) {
        self.unexpected.retain(|(s, _, u)| keep(*s, u));
    }

    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }

    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(source: Option<Rank>, tag: Option<Tag>) -> Selector {
        Selector { source, tag }
    }

    #[test]
    fn wildcards_and_order() {
        let mut m: Matcher<u32> = Matcher::default();
        assert_eq!(m.arrive(1, 5, 100), None);
        assert_eq!(m.arrive(2, 5, 200), None);
        assert_eq!(m.arrive(1, 6, 300), None);
        // ANY_TAG from 1 takes the first message from 1, not the later one.
        assert_eq!(m.post(ReqId(1), sel(Some(1), None)), Some((1, 5, 100)));
        // ANY_SOURCE tag 5 takes rank 2's message.
        assert_eq!(m.post(ReqId(2), sel(None, Some(5))), Some((2, 5, 200)));
        assert_eq!(m.post(ReqId(3), sel(Some(2), None)), None);
        assert_eq!(m.arrive(2, 9, 400), Some((ReqId(3), 400)));
        assert_eq!(m.unexpected_len(), 1);
    }

    #[test]
    fn posted_receives_match_in_post_order() {
        let mut m: Matcher<u32> = Matcher::default();
        assert_eq!(m.post(ReqId(1), sel(None, None)), None);
        assert_eq!(m.post(ReqId(2), sel(Some(0), Some(1))), None);
        assert_eq!(m.arrive(0, 1, 1), Some((ReqId(1), 1)));
        assert_eq!(m.arrive(0, 1, 2), Some((ReqId(2), 2)));
    }

    #[test]
    fn wildcards_skip_reserved_tags() {
        let mut m: Matcher<u32> = Matcher::default();
        assert_eq!(m.arrive(1, RESERVED_TAG_BASE, 1), None);
        assert_eq!(m.post(ReqId(1), sel(None, None)), None);
        assert_eq!(m.post(ReqId(2), sel(Some(1), Some(RESERVED_TAG_BASE))), Some((1, RESERVED_TAG_BASE, 1)));
    }

    #[test]
    fn cancel_and_drain() {
        let mut m: Matcher<u32> = Matcher::default();
        m.post(ReqId(1), sel(Some(3), None));
        m.post(ReqId(2), sel(None, None));
        m.post(ReqId(3), sel(Some(4), None));
        assert!(m.cancel(ReqId(3)));
        assert!(!m.cancel(ReqId(3)));
        assert_eq!(m.drain_posted_from(3), vec![ReqId(1)]);
        assert_eq!(m.posted_len(), 1);
    }
}
