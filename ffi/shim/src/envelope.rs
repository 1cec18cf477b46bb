//! The envelope: what a device-buffer send puts on the user's communicator and tag in
//! place of the data, so that the MPI library's own matching decides which receive
//! gets the message. It carries gpulmt's RTS cookie; gpulmt then moves the payload.
//!
//! A fixed-size record, `ENVELOPE_BYTES` long (all integers little-endian):
//!
//! ```text
//!   0  magic       16 bytes  MAGIC
//!  16  kind        u32       KIND_LMT
//!  20  cookie_len  u32       bytes of cookie used (at most COOKIE_CAP)
//!  24  total       u64       bytes of the message
//!  32  job_hash    u64       FNV-1a of world rank 0's gpulmt job id (one for the job)
//!  40  world_rank  i32       sender's rank in MPI_COMM_WORLD
//!  44  sender      u32       sender's rank in the shim's gpulmt context (its world rank)
//!  48  cookie      160 bytes gpulmt's RTS
//! ```
//!
//! A receiver recognises an envelope by its size and then by its magic and job hash:
//! a user's host message of exactly `ENVELOPE_BYTES` bytes that is not an envelope is
//! delivered as data (it costs one extra copy of 208 bytes).

/// Bytes of an envelope on the wire.
pub const ENVELOPE_BYTES: usize = 48 + COOKIE_CAP;
/// Room for the RTS cookie: gpulmt's largest, an RTS with a region (gpulmt-ffi's
/// GPULMT_COOKIE_MAX, 155 bytes), rounded up to 8.
pub const COOKIE_CAP: usize = 160;
const _: () = assert!(
    COOKIE_CAP >= 1 + 1 + 8 + 4 + 8 + 1 + gpulmt_protocols_region_bytes(),
    "an RTS with a region must fit the envelope"
);

/// Bytes of a region on the wire (gpulmt's protocol crate, through gpulmt).
const fn gpulmt_protocols_region_bytes() -> usize {
    gpulmt::device::IPC_HANDLE_BYTES + 8 + 8 + 4 + 8 + 8
}
/// First 16 bytes of every envelope (PNG-style: a high byte, a name, line-ending and
/// EOF bytes that text never holds in this order, and a version).
pub const MAGIC: [u8; 16] = *b"\x89gpulmtENV\r\n\x1a\n\x02\x00";
/// The payload moves through gpulmt's LMT (the only kind so far).
pub const KIND_LMT: u32 = 1;

/// A decoded envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub kind: u32,
    pub total: u64,
    pub job_hash: u64,
    pub world_rank: i32,
    pub sender: u32,
    pub cookie: Vec<u8>,
}

impl Envelope {
    /// Encodes; `None` when the cookie does not fit.
    pub fn encode(&self) -> Option<[u8; ENVELOPE_BYTES]> {
        if self.cookie.len() > COOKIE_CAP {
            return None;
        }
        let mut b = [0u8; ENVELOPE_BYTES];
        b[..16].copy_from_slice(&MAGIC);
        b[16..20].copy_from_slice(&self.kind.to_le_bytes());
        b[20..24].copy_from_slice(&(self.cookie.len() as u32).to_le_bytes());
        b[24..32].copy_from_slice(&self.total.to_le_bytes());
        b[32..40].copy_from_slice(&self.job_hash.to_le_bytes());
        b[40..44].copy_from_slice(&self.world_rank.to_le_bytes());
        b[44..48].copy_from_slice(&self.sender.to_le_bytes());
        b[48..48 + self.cookie.len()].copy_from_slice(&self.cookie);
        Some(b)
    }

    /// Decodes `bytes` if they are an envelope of the job `job_hash`.
    pub fn decode(bytes: &[u8], job_hash: u64) -> Option<Envelope> {
        if bytes.len() != ENVELOPE_BYTES || bytes[..16] != MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        let cookie_len = u32_at(20) as usize;
        let e = Envelope {
            kind: u32_at(16),
            total: u64_at(24),
            job_hash: u64_at(32),
            world_rank: u32_at(40) as i32,
            sender: u32_at(44),
            cookie: bytes.get(48..48 + cookie_len.min(COOKIE_CAP + 1))?.to_vec(),
        };
        (e.kind == KIND_LMT && cookie_len <= COOKIE_CAP && e.job_hash == job_hash).then_some(e)
    }
}

/// FNV-1a of a job id: ties an envelope to the gpulmt job of this node.
pub fn job_hash(job: &str) -> u64 {
    job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope {
        Envelope {
            kind: KIND_LMT,
            total: 1 << 24,
            job_hash: job_hash("mpi1x2"),
            world_rank: 3,
            sender: 1,
            cookie: (0..155).collect(),
        }
    }

    #[test]
    fn round_trips_and_rejects_what_is_not_an_envelope() {
        let e = sample();
        let b = e.encode().unwrap();
        assert_eq!(Envelope::decode(&b, e.job_hash), Some(e.clone()));
        // Another job's envelope, a flipped magic byte, another size, another kind.
        assert_eq!(Envelope::decode(&b, job_hash("other")), None);
        let mut bad = b;
        bad[3] ^= 1;
        assert_eq!(Envelope::decode(&bad, e.job_hash), None);
        assert_eq!(Envelope::decode(&b[..ENVELOPE_BYTES - 1], e.job_hash), None);
        let mut kind = b;
        kind[16] = 9;
        assert_eq!(Envelope::decode(&kind, e.job_hash), None);
        let mut long = b;
        long[20] = 200;
        assert_eq!(Envelope::decode(&long, e.job_hash), None);
        // User data of the same size.
        assert_eq!(Envelope::decode(&[0u8; ENVELOPE_BYTES], e.job_hash), None);
    }

    #[test]
    fn cookies_longer_than_the_room_are_refused() {
        let mut e = sample();
        e.cookie = vec![0; COOKIE_CAP + 1];
        assert!(e.encode().is_none());
    }
}
