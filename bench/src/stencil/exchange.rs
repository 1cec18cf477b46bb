//! The halo exchange of Stencil2D over gpulmt, and the record of which protocol
//! carried each neighbour's halos.
//!
//! An exchange has two phases, as in SHOC: north/south first, `h` whole rows each
//! way (contiguous, sent and received in place in the field), then west/east, `h`
//! columns of every row (ghost rows included, so the corners just received travel on
//! to the diagonal neighbours), packed into contiguous buffers on the comm queue,
//! exchanged, and unpacked into the ghost columns. Where the bytes are while gpulmt
//! moves them is the [`Carrier`]: device memory (gpulmt's copy engines move them
//! between GPUs) or host staging buffers (device -> host and host -> device copies
//! around messages between host buffers, the seed's shared-memory baseline).

use std::collections::BTreeMap;
use std::mem::size_of;

use gpulmt::{Context, Protocol, Request, Tag};

use super::compute::Compute;
use super::grid::{Decomp, Side};
use super::kernel::Real;
use super::{Result, StencilError};

/// Tags of halo messages: base + the direction the message travels. A rank sends to
/// its north neighbour with tag `North` and receives from it with tag `South`, so the
/// two messages of a pair can never match each other's receive, and messages of one
/// direction stay in order from one exchange to the next (gpulmt keeps MPI's
/// non-overtaking order), so no exchange number is needed.
const HALO_TAG_BASE: Tag = 100;

fn travel_tag(side: Side) -> Tag {
    HALO_TAG_BASE + side.index() as Tag
}

/// Moves a field's halos between neighbours once per batch of `halo` steps.
///
/// The time loop calls [`start`](Self::start), then runs only compute that reads no
/// ghost cell a neighbour provides (the overlap mode's interior, or nothing), then
/// calls [`finish`](Self::finish). This split is the seam for the intra-kernel mode
/// of the GIO issue: there the stencil kernel itself stores its edge layers into the
/// neighbours' mapped ghost cells, so `start` fences and signals and `finish` waits
/// for the neighbours' signals; the time loop, the report and the check stay as they
/// are.
pub trait HaloExchange<T: Real> {
    /// Starts the exchange of the halos of `field` (the array the next step reads).
    /// Everything `field`'s edge layers depend on must be complete.
    fn start(&mut self, ctx: &mut Context, dev: &mut dyn Compute<T>, field: usize) -> Result<()>;

    /// Completes it: when this returns, every ghost cell of `field` a neighbour
    /// provides holds its value, and compute-queue work queued from now on sees them.
    fn finish(&mut self, ctx: &mut Context, dev: &mut dyn Compute<T>, field: usize) -> Result<()> {
        if self.finish_on_comm(ctx, dev, field)? {
            dev.compute_after_comm()?;
        }
        Ok(())
    }

    /// Completes it for the comm queue only: comm-queue work queued from now on sees
    /// every ghost cell, the compute queue is not ordered after it (the overlap mode
    /// computes the boundary on the comm queue and waits for that queue on the host: a
    /// queue waiting for another's event cost about 1.5 us of device time a step on
    /// 2x H200, a third of what overlapping still lost). Returns whether anything was
    /// queued on the comm queue (a rank without neighbours queues nothing).
    fn finish_on_comm(&mut self, ctx: &mut Context, dev: &mut dyn Compute<T>, field: usize) -> Result<bool>;

    /// Which protocols the halos received from each side took so far.
    fn tally(&self) -> &ProtocolTally;

    /// Marks the exchange's device memory for freeing (the caller commits).
    fn release(self: Box<Self>, ctx: &mut Context) -> Result<()>;
}

/// Where a message's bytes are while gpulmt moves them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carrier {
    /// Sent from and received into device memory: rows in place in the field,
    /// columns in device pack buffers.
    Device,
    /// Staged through host buffers with `copy_sync` on both sides of the message.
    HostStaged,
}

/// One neighbour's link.
struct Link<T> {
    side: Side,
    peer: u32,
    /// Elements per message (the same both ways: the neighbour's block has the same
    /// extent along the shared edge).
    len: usize,
    /// West/east: device buffers of the packed columns, (sent, received).
    pack: Option<(usize, usize)>,
    /// Staged mode: host buffers, (sent, received).
    host: Option<(Vec<T>, Vec<T>)>,
}

impl<T: Real> Link<T> {
    fn bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// Device addresses of what is sent and where what arrives goes, for `field`.
    fn device_ends(&self, d: &Decomp, field: usize) -> (usize, usize) {
        match self.pack {
            Some(ends) => ends,
            None => {
                let (sent, received) = d.halo_layers(self.side);
                let row = |r: usize| field + r * d.pitch() * size_of::<T>();
                (row(sent), row(received))
            }
        }
    }
}

/// The two-phase exchange of whole messages between neighbour pairs, for both
/// carriers (the `staged`, `inter-k` and `inter-k-overlap` modes).
pub struct PairwiseExchange<T> {
    d: Decomp,
    links: Vec<Link<T>>,
    /// The first phase's requests, between `start` and `finish`.
    in_flight: Vec<Request>,
    /// Protocol counters when the phase in flight was posted.
    counted_from: [u64; PROTOCOLS.len()],
    tally: ProtocolTally,
}

impl<T: Real> PairwiseExchange<T> {
    /// Allocates the message buffers of every side with a neighbour.
    pub fn new(ctx: &mut Context, d: &Decomp, carrier: Carrier) -> Result<Self> {
        let mut links = Vec::new();
        for side in Side::ALL {
            let Some(peer) = d.neighbour(side) else { continue };
            let len = d.message_len(side);
            let bytes = len * size_of::<T>();
            let pack = match side {
                Side::West | Side::East => Some((ctx.mem_alloc(bytes)?, ctx.mem_alloc(bytes)?)),
                Side::North | Side::South => None,
            };
            let host = (carrier == Carrier::HostStaged).then(|| (vec![T::default(); len], vec![T::default(); len]));
            links.push(Link { side, peer, len, pack, host });
        }
        Ok(PairwiseExchange {
            d: d.clone(),
            links,
            in_flight: Vec::new(),
            counted_from: [0; PROTOCOLS.len()],
            tally: ProtocolTally::default(),
        })
    }

    /// Posts the receives and sends of the phase of `sides`.
    fn post(
        &mut self,
        ctx: &mut Context,
        dev: &mut dyn Compute<T>,
        field: usize,
        sides: [Side; 2],
    ) -> Result<Vec<Request>> {
        let (d, h) = (&self.d, self.d.halo);
        let esize = size_of::<T>();
        self.counted_from = protocol_counts(ctx);
        let phase = |l: &&mut Link<T>| sides.contains(&l.side);
        // Columns are packed first, and completely: the copy engines that move them do
        // not wait for the comm queue.
        let mut packed = false;
        for link in self.links.iter_mut().filter(phase) {
            if let Some((sent, _)) = link.pack {
                let (first, _) = d.halo_layers(link.side);
                dev.copy_block(sent, h, field + first * esize, d.pitch(), d.padded_rows(), h)?;
                packed = true;
            }
        }
        if packed {
            dev.sync_comm()?;
        }
        let mut reqs = Vec::with_capacity(4);
        // Receives before sends: a receive posted before its message arrives lets
        // gpulmt choose the protocol on the first packet.
        for link in self.links.iter_mut().filter(phase) {
            let (_, received) = link.device_ends(d, field);
            let buf = match &mut link.host {
                Some((_, staged)) => staged.as_mut_ptr() as usize,
                None => received,
            };
            let from_tag = travel_tag(link.side.opposite());
            // SAFETY: the buffer (the field's ghost layers, a pack buffer or a staging
            // vector) stays allocated and untouched until `complete` waits for it.
            reqs.push(unsafe { ctx.irecv(buf as *mut u8, link.bytes(), Some(link.peer), Some(from_tag))? });
        }
        for link in self.links.iter_mut().filter(phase) {
            let (sent, _) = link.device_ends(d, field);
            let bytes = link.bytes();
            let buf = match &mut link.host {
                Some((staged, _)) => {
                    // SAFETY: `sent` is `bytes` of the field's edge layers (or a pack buffer),
                    // device memory of this context; `staged` is a vector of `bytes`.
                    unsafe { ctx.copy_sync(staged.as_mut_ptr() as usize, sent, bytes)? };
                    staged.as_ptr() as usize
                }
                None => sent,
            };
            // SAFETY: as for the receives; the field's edge layers are not written
            // before `complete` returns (the next step writes the other array).
            reqs.push(unsafe { ctx.isend(buf as *const u8, bytes, link.peer, travel_tag(link.side))? });
        }
        Ok(reqs)
    }

    /// Waits for the phase of `sides` and puts what arrived into the field.
    fn complete(
        &mut self,
        ctx: &mut Context,
        dev: &mut dyn Compute<T>,
        field: usize,
        sides: [Side; 2],
        reqs: Vec<Request>,
    ) -> Result<()> {
        let statuses = ctx.wait_all(reqs)?;
        let (d, h) = (&self.d, self.d.halo);
        let phase: Vec<&Link<T>> = self.links.iter().filter(|l| sides.contains(&l.side)).collect();
        // The receives were posted first, in link order.
        for (link, status) in phase.iter().zip(&statuses) {
            if status.len as usize != link.bytes() {
                return Err(StencilError::Protocol(format!(
                    "rank {} sent {} bytes of {} halo where {} were expected: do all ranks run the same problem?",
                    link.peer,
                    status.len,
                    link.side.name(),
                    link.bytes()
                )));
            }
        }
        let present: Vec<Side> = phase.iter().map(|l| l.side).collect();
        self.tally.record(&present, &self.counted_from, &protocol_counts(ctx));
        for link in phase {
            let (_, received) = link.device_ends(d, field);
            if let Some((_, staged)) = &link.host {
                // SAFETY: `received` is the link's bytes of the field's ghost layers (or an
                // unpack buffer), device memory of this context; its receive has completed.
                unsafe { ctx.copy_sync(received, staged.as_ptr() as usize, link.bytes())? };
            }
            if let Some((_, unpacked_from)) = link.pack {
                let (_, first) = d.halo_layers(link.side);
                dev.copy_block(field + first * size_of::<T>(), d.pitch(), unpacked_from, h, d.padded_rows(), h)?;
            }
        }
        Ok(())
    }
}

impl<T: Real> HaloExchange<T> for PairwiseExchange<T> {
    fn start(&mut self, ctx: &mut Context, dev: &mut dyn Compute<T>, field: usize) -> Result<()> {
        debug_assert!(self.in_flight.is_empty(), "start called twice without finish");
        self.in_flight = self.post(ctx, dev, field, Side::VERTICAL)?;
        Ok(())
    }

    fn finish_on_comm(&mut self, ctx: &mut Context, dev: &mut dyn Compute<T>, field: usize) -> Result<bool> {
        let vertical = std::mem::take(&mut self.in_flight);
        self.complete(ctx, dev, field, Side::VERTICAL, vertical)?;
        let horizontal = self.post(ctx, dev, field, Side::HORIZONTAL)?;
        self.complete(ctx, dev, field, Side::HORIZONTAL, horizontal)?;
        Ok(!self.links.is_empty())
    }

    fn tally(&self) -> &ProtocolTally {
        &self.tally
    }

    fn release(self: Box<Self>, ctx: &mut Context) -> Result<()> {
        for (sent, received) in self.links.iter().filter_map(|l| l.pack) {
            ctx.mem_free(sent)?;
            ctx.mem_free(received)?;
        }
        Ok(())
    }
}

/// No exchange at all (`--no-exchange`, diagnostics): the ghost cells keep what they
/// hold, so the time loop's compute can be timed without communication.
#[derive(Default)]
pub struct NoExchange {
    tally: ProtocolTally,
}

impl<T: Real> HaloExchange<T> for NoExchange {
    fn start(&mut self, _: &mut Context, _: &mut dyn Compute<T>, _: usize) -> Result<()> {
        Ok(())
    }

    fn finish_on_comm(&mut self, _: &mut Context, _: &mut dyn Compute<T>, _: usize) -> Result<bool> {
        Ok(false)
    }

    fn tally(&self) -> &ProtocolTally {
        &self.tally
    }

    fn release(self: Box<Self>, _: &mut Context) -> Result<()> {
        Ok(())
    }
}

/// The protocols of gpulmt's counters, in a fixed order.
pub const PROTOCOLS: [Protocol; 5] = [Protocol::Get, Protocol::Put, Protocol::Coop, Protocol::Shm, Protocol::SelfCopy];

/// gpulmt's rendezvous counters (receives per protocol) now.
pub fn protocol_counts(ctx: &Context) -> [u64; PROTOCOLS.len()] {
    let stats = ctx.stats();
    PROTOCOLS.map(|p| stats.protocol_count(p))
}

/// Per side of a rank: how many of the halos received from that neighbour took each
/// protocol. gpulmt counts rendezvous receives per protocol, not per peer, so each
/// phase's counter increase is attributed to the phase's receives: exactly when the
/// phase has one receive or all its receives took the same protocol (the usual case;
/// both messages of a phase have the same size). A phase whose receives took different
/// protocols counts under the joined label, e.g. `get+put`, on each of its sides.
/// Receives that moved no counter were eager.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProtocolTally {
    by_side: [BTreeMap<String, u64>; 4],
}

impl ProtocolTally {
    /// Records one phase with receives from `sides`, counters `before` and `after` it.
    pub fn record(&mut self, sides: &[Side], before: &[u64; PROTOCOLS.len()], after: &[u64; PROTOCOLS.len()]) {
        if sides.is_empty() {
            return;
        }
        let mut labels: Vec<String> = Vec::new();
        let mut rendezvous = 0;
        for (i, p) in PROTOCOLS.iter().enumerate() {
            let n = after[i].saturating_sub(before[i]);
            if n > 0 {
                labels.push(p.to_string());
                rendezvous += n;
            }
        }
        if rendezvous < sides.len() as u64 {
            labels.push("eager".into());
        }
        let label = labels.join("+");
        for side in sides {
            *self.by_side[side.index()].entry(label.clone()).or_default() += 1;
        }
    }

    /// Counts per protocol label for the halos received from `side`.
    /// Counts `n` halos from `side` under `label` (modes that move halos without
    /// gpulmt's messages, such as `gio`).
    pub fn count(&mut self, side: Side, label: &str, n: u64) {
        *self.by_side[side.index()].entry(label.to_string()).or_default() += n;
    }

    pub fn side(&self, side: Side) -> &BTreeMap<String, u64> {
        &self.by_side[side.index()]
    }

    /// `get x12, eager x1`, or `-` when nothing was received.
    pub fn describe(&self, side: Side) -> String {
        let m = self.side(side);
        if m.is_empty() {
            return "-".into();
        }
        m.iter().map(|(p, n)| format!("{p} x{n}")).collect::<Vec<_>>().join(", ")
    }

    /// A one-line text form (`N:get=12,eager=1;S:shm=13`), for gathering to rank 0.
    pub fn encode(&self) -> String {
        Side::ALL
            .iter()
            .filter(|s| !self.side(**s).is_empty())
            .map(|s| {
                let counts: Vec<String> = self.side(*s).iter().map(|(p, n)| format!("{p}={n}")).collect();
                format!("{}:{}", s.letter(), counts.join(","))
            })
            .collect::<Vec<_>>()
            .join(";")
    }

    pub fn decode(text: &str) -> Option<ProtocolTally> {
        let mut t = ProtocolTally::default();
        for part in text.split(';').filter(|p| !p.is_empty()) {
            let (side, counts) = part.split_once(':')?;
            let mut letters = side.chars();
            let side = Side::from_letter(letters.next()?)?;
            for kv in counts.split(',') {
                let (p, n) = kv.split_once('=')?;
                t.by_side[side.index()].insert(p.to_string(), n.parse().ok()?);
            }
        }
        Some(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_attributes_phases() {
        let mut t = ProtocolTally::default();
        let zero = [0; 5];
        // One receive, one GET.
        t.record(&[Side::North], &zero, &[1, 0, 0, 0, 0]);
        // Two receives, both GET.
        t.record(&[Side::North, Side::South], &[1, 0, 0, 0, 0], &[3, 0, 0, 0, 0]);
        // Two receives, GET and PUT: ambiguous, joined.
        t.record(&[Side::West, Side::East], &zero, &[1, 1, 0, 0, 0]);
        // Two eager receives.
        t.record(&[Side::West, Side::East], &zero, &zero);
        assert_eq!(t.describe(Side::North), "get x2");
        assert_eq!(t.describe(Side::South), "get x1");
        assert_eq!(t.describe(Side::West), "eager x1, get+put x1");
        let back = ProtocolTally::decode(&t.encode()).unwrap();
        assert_eq!(back, t);
        assert_eq!(ProtocolTally::decode(""), Some(ProtocolTally::default()));
    }
}
