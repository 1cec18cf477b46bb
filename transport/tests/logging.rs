//! The library leaves the process's global log subscriber to the application: creating
//! a context installs none, so an application may install its own afterwards, and that
//! one then receives gpulmt's events. (Its own test binary: the global subscriber is
//! process-wide and can be set once.)

use std::sync::{Arc, Mutex};

use gpulmt::config::{Config, DeviceChoice};
use gpulmt::{Context, JobInfo};
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};

/// An application's subscriber: records the target and message of every event.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(String, String)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: LayerContext<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        self.0.lock().unwrap().push((event.metadata().target().to_owned(), m.0));
    }
}

fn solo(tag: &str) -> JobInfo {
    JobInfo { job: format!("logtest{}{tag}", std::process::id()), rank: 0, size: 1 }
}

fn sim_config() -> Config {
    let mut cfg = Config::from_lookup(|_| None).unwrap();
    cfg.device = DeviceChoice::Sim;
    cfg
}

#[test]
fn contexts_leave_the_global_subscriber_to_the_application() {
    assert!(!tracing::dispatcher::has_been_set(), "nothing in this test binary sets one before the test");

    // Every way of making a context: none may take the global default for itself.
    let ctx = Context::init_with(sim_config(), solo("a")).unwrap();
    assert!(!tracing::dispatcher::has_been_set(), "Context::init_with installed a global subscriber");
    ctx.finalize().unwrap();
    let ctx = Context::init_plugin_rings(sim_config(), solo("b")).unwrap();
    assert!(!tracing::dispatcher::has_been_set(), "Context::init_plugin_rings installed a global subscriber");
    ctx.finalize().unwrap();

    // The application installs its own afterwards; that must succeed, and it is the one
    // that gets gpulmt's events from then on.
    let recorder = Recorder::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(recorder.clone()))
        .expect("the application's subscriber is refused: the library installed one");
    let ctx = Context::init_with(sim_config(), solo("c")).unwrap();
    ctx.finalize().unwrap();
    let events = recorder.0.lock().unwrap().clone();
    let ours = |msg: &str| events.iter().any(|(target, m)| target.starts_with("gpulmt") && m == msg);
    assert!(ours("gpulmt rank ready"), "init's event did not reach the application's subscriber: {events:?}");
    assert!(ours("traffic of this rank"), "finalize's event did not reach the application's subscriber: {events:?}");

    // gpulmt::logging::init, as binaries call it, leaves the application's subscriber in place.
    gpulmt::logging::init("warn");
    let before = recorder.0.lock().unwrap().len();
    tracing::warn!(target: "gpulmt::test", "after logging::init");
    assert_eq!(recorder.0.lock().unwrap().len(), before + 1, "logging::init replaced the application's subscriber");
}
