//! Which rank owns which rows, and what each rank needs to solve its rows: the rows'
//! entries, who consumes each solved value (gio), and the level-by-level exchange of
//! the inter-k baseline (which values go to whom after which level, and where they
//! land in the receiver's inbox).
//!
//! Every rank holds the whole matrix and computes the same global plan, so a sender
//! knows where its values land at each receiver without asking.
//!
//! The symmetric array `xbuf` of every rank (f64 words, [`RankPlan::xbuf_len`]):
//! - `[0, n)`: x, by global row. A rank writes its own rows there; in gio mode the
//!   producers of its remote dependencies put theirs there too;
//! - `[n, n + inbox)`: the inbox, the remote values it consumes. inter-k: in the order of
//!   (level, source rank, row), each (level, source) chunk one put. gio, from sources on
//!   other nodes ([`Stream`]): by source, then row;
//! - then the outbox, its own values that others consume. inter-k: in the order of
//!   (level, consumer, row), each (level, consumer) chunk the source of one put. gio, to
//!   consumers on other nodes: by consumer, then row (the staging of a stream's puts).
//!
//! A rank's flags (u64 words): one per global row (gio: `flags[j] >= epoch` when `x[j]` is
//! final here), then one per rank (gio: how many values of the current solve the rank's
//! stream has delivered here, counted on from earlier solves).

use super::matrix::Csr;

/// Rows over ranks in blocks of `block` rows, dealt round-robin (block-cyclic); one block
/// per rank (`ceil(n / ranks)` rows) is the contiguous distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dist {
    pub ranks: u32,
    pub block: usize,
}

impl Dist {
    /// Contiguous blocks of rows, or blocks of `cyclic` rows dealt round-robin.
    pub fn new(n: usize, ranks: u32, cyclic: Option<usize>) -> Dist {
        Dist { ranks, block: cyclic.unwrap_or_else(|| n.div_ceil(ranks as usize)).max(1) }
    }

    pub fn owner(&self, row: usize) -> u32 {
        ((row / self.block) % self.ranks as usize) as u32
    }
}

/// One put of the inter-k exchange: `count` values from `outbox` (positions in the
/// sender's outbox) to `inbox` (positions in the receiver's) of rank `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub peer: u32,
    pub outbox: usize,
    pub inbox: usize,
    pub count: usize,
}

/// gio's values for a consumer on another node (its heap reached through the queues and
/// the proxies, each put a packet): rather than a put per value, a stream of the rows the
/// consumer reads, in row order, shipped in batches of whatever is solved: each batch is
/// staged in the outbox and put with the stream's count (`flags[n + source]` at the
/// consumer), the puts ordered by a fence.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stream {
    pub peer: u32,
    /// The local rows (indices into `RankPlan::rows`), increasing.
    pub rows: Vec<u32>,
    /// Where the stream's values are staged in this rank's xbuf, and where they land in
    /// the peer's.
    pub stage: usize,
    pub dst: usize,
}

/// One rank's part of the solve.
#[derive(Clone, Debug, Default)]
pub struct RankPlan {
    pub n: usize,
    /// This rank's rows (global indices), increasing: the order in which gio takes them.
    pub rows: Vec<u32>,
    /// Local row `k`'s off-diagonal entries are `ptr[k]..ptr[k + 1]` of `col` / `val`.
    pub ptr: Vec<u32>,
    /// gio: where each column's value is read in `xbuf` (`x[j]`; from another node the
    /// stream's slot in the inbox).
    pub col: Vec<u32>,
    /// gio: the flag word each column waits for (`j`, or `n + source` for a stream), and
    /// the value it waits for there: `epoch * tmul + tbase` (wrapping).
    pub fidx: Vec<u32>,
    pub tmul: Vec<u32>,
    pub tbase: Vec<u64>,
    /// The same columns as `xbuf` positions for inter-k: remote ones in the inbox.
    pub col_interk: Vec<u32>,
    pub val: Vec<f64>,
    pub diag: Vec<f64>,
    pub b: Vec<f64>,
    /// gio: local row `k`'s value goes to ranks `cons[cptr[k]..cptr[k + 1]]` (whose heaps
    /// this rank maps: one put_signal each), and through `streams` to the others.
    pub cptr: Vec<u32>,
    pub cons: Vec<u32>,
    pub streams: Vec<Stream>,
    /// inter-k: local row `k`'s value is also written to outbox positions
    /// `opos[optr[k]..optr[k + 1]]` (one per consuming rank).
    pub optr: Vec<u32>,
    pub opos: Vec<u32>,
    /// inter-k: local rows by level (increasing rows within a level); level `l` is
    /// `by_level[lptr[l]..lptr[l + 1]]`.
    pub by_level: Vec<u32>,
    pub lptr: Vec<usize>,
    /// inter-k: after level `l`, the puts of `sends[l]`, and the sources whose chunks of
    /// level `l` arrive (`recvs[l]`, ranks).
    pub sends: Vec<Vec<Chunk>>,
    pub recvs: Vec<Vec<u32>>,
    /// The largest inbox and outbox of any rank (the symmetric array's layout).
    pub inbox_max: usize,
    pub outbox_max: usize,
    pub levels: usize,
}

impl RankPlan {
    /// Words of the symmetric `xbuf` (see the module's documentation).
    pub fn xbuf_len(&self) -> usize {
        self.n + self.inbox_max + self.outbox_max
    }

    /// Where the outbox starts in `xbuf`.
    pub fn outbox_at(&self) -> usize {
        self.n + self.inbox_max
    }

    /// Local rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Local row `k`'s entries: (gio columns, inter-k columns, values).
    pub fn entries(&self, k: usize) -> (&[u32], &[u32], &[f64]) {
        let r = self.ptr[k] as usize..self.ptr[k + 1] as usize;
        (&self.col[r.clone()], &self.col_interk[r.clone()], &self.val[r])
    }

    /// Entry range of local row `k`.
    pub fn range(&self, k: usize) -> std::ops::Range<usize> {
        self.ptr[k] as usize..self.ptr[k + 1] as usize
    }

    /// The plan of rank `me` for `m` distributed by `dist`; `off_node(rank)`: whether
    /// `rank`'s heap is out of this rank's reach but through the queues (gio streams).
    pub fn new(m: &Csr, b: &[f64], dist: Dist, me: u32, off_node: &dyn Fn(u32) -> bool) -> RankPlan {
        let (n, ranks) = (m.n, dist.ranks as usize);
        let level = m.levels();
        let levels = level.iter().max().map_or(0, |&l| l as usize + 1);
        // needs[c][s]: the rows of s that c consumes, as (level, row), sorted and unique.
        let mut needs = vec![vec![Vec::<(u32, u32)>::new(); ranks]; ranks];
        for i in 0..n {
            let c = dist.owner(i) as usize;
            for &j in m.offdiag(i).0 {
                let s = dist.owner(j as usize) as usize;
                if s != c {
                    needs[c][s].push((level[j as usize], j));
                }
            }
        }
        for v in needs.iter_mut().flatten() {
            v.sort_unstable();
            v.dedup();
        }
        // gio streams: the rows of s that c reads, in row order, at the inbox offset of
        // every source before s (whatever their node: every rank computes the same).
        let stream_rows = |c: usize, s: usize| {
            let mut v: Vec<u32> = needs[c][s].iter().map(|&(_, j)| j).collect();
            v.sort_unstable();
            v
        };
        let stream_at = |c: usize, s: usize| n + (0..s).map(|q| needs[c][q].len()).sum::<usize>();
        // Inbox positions at consumer c: (level, source, row) order.
        let inbox_of = |c: usize| {
            let mut v: Vec<(u32, usize, u32)> =
                (0..ranks).flat_map(|s| needs[c][s].iter().map(move |&(l, j)| (l, s, j))).collect();
            v.sort_unstable();
            v
        };
        let inbox_max = (0..ranks).map(|c| inbox_of(c).len()).max().unwrap_or(0);
        let outbox_max = (0..ranks).map(|s| (0..ranks).map(|c| needs[c][s].len()).sum::<usize>()).max().unwrap_or(0);

        let mut p = RankPlan { n, levels, inbox_max, outbox_max, ..RankPlan::default() };
        let me_u = me as usize;
        p.rows = (0..n).filter(|&i| dist.owner(i) == me).map(|i| i as u32).collect();
        let local_of = |i: u32| p.rows.binary_search(&i).expect("a local row");
        // This rank's inbox: where each remote column lands.
        let my_inbox = inbox_of(me_u);
        let inbox_pos = |j: u32| {
            let key = (level[j as usize], dist.owner(j as usize) as usize, j);
            n + my_inbox.binary_search(&key).expect("every remote column is in the inbox")
        };
        let streams_in: Vec<(usize, Vec<u32>)> = (0..ranks)
            .map(|s| {
                if s != me_u && off_node(s as u32) {
                    (stream_at(me_u, s), stream_rows(me_u, s))
                } else {
                    (0, Vec::new())
                }
            })
            .collect();
        p.ptr.push(0);
        let mut consumers = vec![Vec::<u32>::new(); p.rows.len()];
        for i in 0..n {
            let c = dist.owner(i);
            for &j in m.offdiag(i).0 {
                if c != me && dist.owner(j as usize) == me && !off_node(c) {
                    consumers[local_of(j)].push(c);
                }
            }
        }
        for (k, &i) in p.rows.iter().enumerate() {
            let (cols, vals) = m.offdiag(i as usize);
            for (&j, &a) in cols.iter().zip(vals) {
                let s = dist.owner(j as usize);
                let (at, rows) = &streams_in[s as usize];
                match rows.binary_search(&j) {
                    Ok(q) if s != me => {
                        let len = rows.len() as u64;
                        p.col.push((at + q) as u32);
                        p.fidx.push((n + s as usize) as u32);
                        p.tmul.push(len as u32);
                        p.tbase.push((q as u64 + 1).wrapping_sub(len));
                    }
                    _ => {
                        p.col.push(j);
                        p.fidx.push(j);
                        p.tmul.push(1);
                        p.tbase.push(0);
                    }
                }
                let local = s == me;
                p.col_interk.push(if local { j } else { inbox_pos(j) as u32 });
                p.val.push(a);
            }
            p.ptr.push(p.col.len() as u32);
            p.diag.push(m.diag(i as usize));
            p.b.push(b[i as usize]);
            let cs = &mut consumers[k];
            cs.sort_unstable();
            cs.dedup();
        }
        p.cptr.push(0);
        for cs in &consumers {
            p.cons.extend_from_slice(cs);
            p.cptr.push(p.cons.len() as u32);
        }
        // Levels of the local rows.
        let mut order: Vec<(u32, u32)> =
            p.rows.iter().enumerate().map(|(k, &i)| (level[i as usize], k as u32)).collect();
        order.sort_unstable();
        p.by_level = order.iter().map(|&(_, k)| k).collect();
        p.lptr = vec![0; levels + 1];
        for &(l, _) in &order {
            p.lptr[l as usize + 1] += 1;
        }
        for l in 0..levels {
            p.lptr[l + 1] += p.lptr[l];
        }
        // The outbox: (level, consumer, row) order; each (level, consumer) chunk one put
        // into the consumer's inbox at the chunk's place there.
        let mut out: Vec<(u32, u32, u32)> =
            (0..ranks).flat_map(|c| needs[c][me_u].iter().map(move |&(l, j)| (l, c as u32, j))).collect();
        out.sort_unstable();
        let mut slots = vec![Vec::<u32>::new(); p.rows.len()];
        p.sends = vec![Vec::new(); levels];
        let inboxes: Vec<Vec<(u32, usize, u32)>> = (0..ranks).map(inbox_of).collect();
        for (pos, &(l, c, j)) in out.iter().enumerate() {
            slots[local_of(j)].push(pos as u32);
            let sends = &mut p.sends[l as usize];
            match sends.last_mut() {
                Some(ch) if ch.peer == c => ch.count += 1,
                _ => {
                    let at = inboxes[c as usize].partition_point(|&k| k < (l, me_u, 0));
                    sends.push(Chunk { peer: c, outbox: pos, inbox: at, count: 1 });
                }
            }
        }
        let mut stage = p.outbox_at();
        for c in (0..ranks).filter(|&c| c != me_u && off_node(c as u32)) {
            let rows: Vec<u32> = stream_rows(c, me_u).iter().map(|&j| local_of(j) as u32).collect();
            let len = rows.len();
            if len > 0 {
                p.streams.push(Stream { peer: c as u32, rows, stage, dst: stream_at(c, me_u) });
            }
            stage += len;
        }
        p.optr.push(0);
        for s in &slots {
            p.opos.extend_from_slice(s);
            p.optr.push(p.opos.len() as u32);
        }
        p.recvs = vec![Vec::new(); levels];
        for &(l, s, _) in &my_inbox {
            if p.recvs[l as usize].last() != Some(&(s as u32)) {
                p.recvs[l as usize].push(s as u32);
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::super::matrix::{reference, rhs, row_value, Shape};
    use super::*;

    fn matrix() -> Csr {
        Csr::generate(&Shape { n: 700, offdiag: 4, band: 8, far_eighths: 3, seed: 3 })
    }

    #[test]
    fn distributions_own_every_row_once() {
        let d = Dist::new(10, 3, None);
        assert_eq!((0..10).map(|i| d.owner(i)).collect::<Vec<_>>(), [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]);
        let c = Dist::new(10, 3, Some(2));
        assert_eq!((0..10).map(|i| c.owner(i)).collect::<Vec<_>>(), [0, 0, 1, 1, 2, 2, 0, 0, 1, 1]);
    }

    /// The inter-k exchange simulated in one process: each level's rows computed from the
    /// rank's xbuf, each chunk copied from the sender's outbox into the receiver's inbox.
    /// Every rank ends with the reference's values, and every chunk a rank expects arrives.
    #[test]
    fn the_level_exchange_delivers_every_remote_value_where_it_is_read() {
        let m = matrix();
        let b = rhs(m.n, 3);
        let want = reference(&m, &b);
        for dist in [Dist::new(m.n, 3, None), Dist::new(m.n, 4, Some(16))] {
            let plans: Vec<RankPlan> = (0..dist.ranks).map(|r| RankPlan::new(&m, &b, dist, r, &|_| false)).collect();
            let mut xbuf: Vec<Vec<f64>> = plans.iter().map(|p| vec![f64::NAN; p.xbuf_len()]).collect();
            let levels = plans[0].levels;
            for l in 0..levels {
                for (r, p) in plans.iter().enumerate() {
                    for &k in &p.by_level[p.lptr[l]..p.lptr[l + 1]] {
                        let k = k as usize;
                        let (_, cols, vals) = p.entries(k);
                        let x = &xbuf[r];
                        let v = row_value(p.b[k], vals, cols, p.diag[k], |j| x[j as usize]);
                        xbuf[r][p.rows[k] as usize] = v;
                        for o in p.optr[k]..p.optr[k + 1] {
                            xbuf[r][p.outbox_at() + p.opos[o as usize] as usize] = v;
                        }
                    }
                }
                let mut arrived = vec![Vec::new(); plans.len()];
                for (s, p) in plans.iter().enumerate() {
                    for ch in &p.sends[l] {
                        let (c, n) = (ch.peer as usize, p.n);
                        for q in 0..ch.count {
                            xbuf[c][n + ch.inbox + q] = xbuf[s][p.outbox_at() + ch.outbox + q];
                        }
                        arrived[c].push(s as u32);
                    }
                }
                for (c, p) in plans.iter().enumerate() {
                    assert_eq!(arrived[c], p.recvs[l], "level {l}: rank {c} waits for what arrives");
                }
            }
            for (r, p) in plans.iter().enumerate() {
                for &i in &p.rows {
                    assert_eq!(xbuf[r][i as usize].to_bits(), want[i as usize].to_bits(), "row {i}");
                }
            }
            let remote: usize = plans.iter().map(|p| p.cons.len()).sum();
            assert!(remote > 100, "{remote} remote values: the ranks depend on each other");
        }
    }

    /// gio's consumers: a rank consumes a row exactly when one of its rows has it as a
    /// remote column.
    #[test]
    fn consumers_are_the_ranks_reading_a_row() {
        let m = matrix();
        let b = rhs(m.n, 3);
        let dist = Dist::new(m.n, 3, Some(10));
        let plans: Vec<RankPlan> = (0..3).map(|r| RankPlan::new(&m, &b, dist, r, &|_| false)).collect();
        for p in &plans {
            for (k, &i) in p.rows.iter().enumerate() {
                let cons = &p.cons[p.cptr[k] as usize..p.cptr[k + 1] as usize];
                for (c, q) in plans.iter().enumerate() {
                    let reads = c as u32 != dist.owner(i as usize) && q.col.contains(&i);
                    assert_eq!(cons.contains(&(c as u32)), reads, "row {i} to rank {c}");
                }
            }
        }
    }

    /// gio with ranks on two nodes (even and odd ranks): run the protocol in row order in
    /// one process, mapped consumers getting each value at x[i] with its flag, streams
    /// delivering each value at once in stream order. Every wait a column makes is met when
    /// its row is solved, every read finds the value, and the result is the reference's.
    #[test]
    fn gio_streams_deliver_where_off_node_columns_read() {
        let m = matrix();
        let b = rhs(m.n, 3);
        let want = reference(&m, &b);
        let node = |r: u32| r % 2;
        for dist in [Dist::new(m.n, 4, None), Dist::new(m.n, 4, Some(8))] {
            let plans: Vec<RankPlan> =
                (0..4).map(|r| RankPlan::new(&m, &b, dist, r, &|c| node(c) != node(r))).collect();
            let mut xbuf: Vec<Vec<f64>> = plans.iter().map(|p| vec![f64::NAN; p.xbuf_len()]).collect();
            let mut flags: Vec<Vec<u64>> = plans.iter().map(|_| vec![0; m.n + 4]).collect();
            let epoch = 1u64;
            for i in 0..m.n {
                let r = dist.owner(i) as usize;
                let p = &plans[r];
                let k = p.rows.binary_search(&(i as u32)).unwrap();
                for e in p.range(k) {
                    let need = epoch.wrapping_mul(p.tmul[e] as u64).wrapping_add(p.tbase[e]);
                    assert!(flags[r][p.fidx[e] as usize] >= need, "row {i} entry {e} waits for nothing that came");
                }
                let (cols, _, vals) = p.entries(k);
                let v = row_value(p.b[k], vals, cols, p.diag[k], |j| xbuf[r][j as usize]);
                xbuf[r][i] = v;
                flags[r][i] = epoch;
                for &c in &p.cons[p.cptr[k] as usize..p.cptr[k + 1] as usize] {
                    assert_eq!(node(c), node(r as u32), "per-value puts go to mapped ranks only");
                    xbuf[c as usize][i] = v;
                    flags[c as usize][i] = epoch;
                }
                for st in &p.streams {
                    if let Ok(q) = st.rows.binary_search(&(k as u32)) {
                        xbuf[st.peer as usize][st.dst + q] = v;
                        flags[st.peer as usize][m.n + r] = q as u64 + 1;
                    }
                }
            }
            let mut streamed = 0;
            for (r, p) in plans.iter().enumerate() {
                for &i in &p.rows {
                    assert_eq!(xbuf[r][i as usize].to_bits(), want[i as usize].to_bits(), "row {i}");
                }
                for st in &p.streams {
                    assert_ne!(node(st.peer), node(r as u32));
                    assert!(st.stage >= p.outbox_at() && st.stage + st.rows.len() <= p.xbuf_len());
                    assert!(st.dst >= p.n && st.dst + st.rows.len() <= p.outbox_at());
                    streamed += st.rows.len();
                }
            }
            assert!(streamed > 100, "{streamed} values streamed across the nodes");
        }
    }
}
