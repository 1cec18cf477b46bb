//! Sleeps that end on time whatever signals arrive, for the waits of the shared-memory
//! layer (a rank waiting for the job segment or at a barrier, a simulated handle open).
//!
//! `std::thread::sleep` restarts an interrupted `nanosleep` with the time the kernel says
//! is left, and that time counts from the timer's *hard* expiry, which lies a timer slack
//! (50 us by default) beyond the requested one: every interruption pushes the end out by
//! the slack. Under an interval timer as fast as the slack (a profiler's 20 kHz SIGPROF
//! or SIGALRM) such a sleep never ends, nor the wait around it. These sleeps aim at an
//! absolute time on the monotonic clock instead, so an interruption only costs a
//! restart toward the same end.

use std::time::{Duration, Instant};

/// Sleeps until `deadline` or for `most`, whichever comes first, then returns (at once
/// if the deadline has passed). Signals that interrupt the sleep do not delay its end.
pub fn sleep_toward(deadline: Instant, most: Duration) {
    let now = Instant::now();
    let Some(left) = deadline.checked_duration_since(now) else { return };
    let span = left.min(most);
    if span.is_zero() {
        return;
    }
    // SAFETY: zeroed timespec is a valid out-buffer for clock_gettime.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: ts is a valid out-pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        // No monotonic clock (never on Linux): one sleep of the span, uninterrupted or not.
        std::thread::sleep(span);
        return;
    }
    let nanos = ts.tv_nsec as u64 + span.subsec_nanos() as u64;
    ts.tv_sec = ts.tv_sec.saturating_add(
        span.as_secs().min(i64::MAX as u64 / 2) as libc::time_t + (nanos / 1_000_000_000) as libc::time_t,
    );
    ts.tv_nsec = (nanos % 1_000_000_000) as libc::c_long;
    loop {
        // SAFETY: ts is a valid absolute time; the remainder pointer may be null for
        // TIMER_ABSTIME.
        let rc =
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
        // clock_nanosleep returns the error instead of setting errno; EINTR: the same end.
        if rc != libc::EINTR {
            return;
        }
    }
}

/// Sleeps for `d` (as [`sleep_toward`] with the deadline `d` from now).
pub fn sleep_for(d: Duration) {
    sleep_toward(Instant::now() + d, d);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    static ALARMS: AtomicU64 = AtomicU64::new(0);

    extern "C" fn on_alarm(_: libc::c_int) {
        ALARMS.fetch_add(1, Ordering::Relaxed);
    }

    /// A 20 kHz interval timer interrupts the sleep about every 50 us: it still ends on
    /// time (std's sleep restarts from the slack-shifted remainder and may not end at all).
    /// The timer signals this test's thread only, so the other tests of the process run on
    /// undisturbed.
    #[test]
    fn ends_on_time_under_a_fast_interval_timer() {
        // SAFETY: a zeroed sigaction and sigevent are valid; the handler only does an atomic
        // add, which is async-signal-safe; no SA_RESTART, so sleeps really are interrupted.
        // The timer is deleted before the test returns.
        let timer = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut()), 0);
            let mut ev: libc::sigevent = std::mem::zeroed();
            ev.sigev_notify = libc::SIGEV_THREAD_ID;
            ev.sigev_signo = libc::SIGALRM;
            ev.sigev_notify_thread_id = libc::gettid();
            let mut timer: libc::timer_t = std::mem::zeroed();
            assert_eq!(libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut timer), 0);
            let tick = libc::timespec { tv_sec: 0, tv_nsec: 50_000 };
            let it = libc::itimerspec { it_interval: tick, it_value: tick };
            assert_eq!(libc::timer_settime(timer, 0, &it, std::ptr::null_mut()), 0);
            timer
        };
        let before = ALARMS.load(Ordering::Relaxed);
        let t0 = Instant::now();
        for _ in 0..50 {
            sleep_for(Duration::from_micros(200));
        }
        sleep_toward(Instant::now() + Duration::from_millis(20), Duration::from_secs(1));
        let took = t0.elapsed();
        // SAFETY: the timer made above, deleted once.
        unsafe { libc::timer_delete(timer) };
        assert!(took >= Duration::from_millis(30), "slept only {took:?}");
        // About 30 ms; std::thread::sleep takes 1.7-2.4 s here (each interruption moves
        // its end out by the timer slack), and longer sleeps may not end at all.
        assert!(took < Duration::from_secs(1), "sleeps of 30 ms under a 20 kHz timer took {took:?}");
        assert!(ALARMS.load(Ordering::Relaxed) > before, "the timer never fired");
    }

    #[test]
    fn a_passed_deadline_returns_at_once() {
        let t0 = Instant::now();
        sleep_toward(t0, Duration::from_secs(10));
        sleep_toward(t0 + Duration::from_millis(5), Duration::ZERO);
        assert!(t0.elapsed() < Duration::from_secs(1));
    }
}
