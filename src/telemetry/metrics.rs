//! The runner's metrics (issue 40 item 2), recorded where the work is done
//! and exported with the traces' OTLP exporter. With metrics off every
//! function here is one load of an empty cell.
//!
//! Attribute values are from closed sets only (route names, outcomes,
//! PROTOCOL error codes, event states): no run id, path or message, so no
//! metric label can hold a secret and cardinality stays fixed.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

#[cfg(feature = "otel")]
use opentelemetry::KeyValue;
#[cfg(feature = "otel")]
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _};
#[cfg(feature = "otel")]
use opentelemetry_sdk::metrics::SdkMeterProvider;
#[cfg(not(feature = "otel"))]
use stub::{Counter, Histogram, KeyValue};

/// Without the `otel` feature: instruments that record nothing, never
/// made (the cell below stays empty), so that the recording sites read
/// the same in both builds.
#[cfg(not(feature = "otel"))]
mod stub {
    pub struct Histogram<T>(std::marker::PhantomData<T>);
    impl<T> Histogram<T> {
        pub fn record(&self, _: T, _: &[KeyValue]) {}
    }
    pub struct Counter<T>(std::marker::PhantomData<T>);
    impl<T> Counter<T> {
        pub fn add(&self, _: T, _: &[KeyValue]) {}
    }
    #[derive(Clone)]
    pub struct KeyValue;
    impl KeyValue {
        pub fn new<K, V>(_: K, _: V) -> Self {
            KeyValue
        }
    }
}

#[cfg_attr(not(feature = "otel"), allow(dead_code))]
struct Instruments {
    turn_duration: Histogram<f64>,
    first_output: Histogram<f64>,
    requests: Counter<u64>,
    retries: Counter<u64>,
    events: Counter<u64>,
    pushed_bytes: Counter<u64>,
    harvest_files: Counter<u64>,
}

static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();

/// When the coordinator last answered a read (ms since the epoch; 0 never).
static LAST_READ_MS: AtomicU64 = AtomicU64::new(0);

/// Creates the instruments on `provider`'s meter (once).
#[cfg(feature = "otel")]
pub(super) fn install(provider: &SdkMeterProvider) {
    let meter = provider.meter("hosted-boot");
    observe(&meter);
    let _ = INSTRUMENTS.set(Instruments {
        turn_duration: meter
            .f64_histogram("hosted_boot.turn.duration")
            .with_unit("s")
            .with_description("A turn's duration, from turn_started to turn_completed, by outcome")
            .build(),
        first_output: meter
            .f64_histogram("hosted_boot.turn.first_output")
            .with_unit("s")
            .with_description("Time from turn_started to the agent's first output")
            .build(),
        requests: meter
            .u64_counter("hosted_boot.coordinator.requests")
            .with_description("Coordinator requests (each attempt), by route and result")
            .build(),
        retries: meter
            .u64_counter("hosted_boot.coordinator.retries")
            .with_description("Coordinator request attempts that were retried, by route")
            .build(),
        events: meter
            .u64_counter("hosted_boot.events")
            .with_description("Run events by state: spooled, sent, undelivered")
            .build(),
        pushed_bytes: meter
            .u64_counter("hosted_boot.git.pushed_bytes")
            .with_unit("By")
            .with_description("Bytes the runner's git pushes sent (packs and their negotiation)")
            .build(),
        harvest_files: meter
            .u64_counter("hosted_boot.harvest.files")
            .with_description("Files the harvests changed")
            .build(),
    });
}

/// The gauges read at each export: the runner's RSS and CPU time
/// (`process.*` of the semantic conventions), the redactions applied, and
/// the age of the last successful coordinator read.
#[cfg(feature = "otel")]
fn observe(meter: &Meter) {
    meter
        .i64_observable_gauge("process.memory.usage")
        .with_unit("By")
        .with_description("The runner's resident memory")
        .with_callback(|gauge| {
            if let Some(rss) = resident_bytes() {
                gauge.observe(rss, &[]);
            }
        })
        .build();
    meter
        .f64_observable_counter("process.cpu.time")
        .with_unit("s")
        .with_description("The runner's CPU time")
        .with_callback(|counter| {
            // SAFETY: getrusage writes the struct it is given, nothing else.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
                return;
            }
            let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
            counter.observe(secs(usage.ru_utime), &[KeyValue::new("cpu.mode", "user")]);
            counter.observe(secs(usage.ru_stime), &[KeyValue::new("cpu.mode", "system")]);
        })
        .build();
    meter
        .u64_observable_counter("hosted_boot.redactions")
        .with_description(
            "Secrets replaced by [REDACTED] in what the runner sent, spooled or logged",
        )
        .with_callback(|counter| counter.observe(crate::redact::applied(), &[]))
        .build();
    meter
        .f64_observable_gauge("hosted_boot.coordinator.last_read_age")
        .with_unit("s")
        .with_description("Seconds since the coordinator last answered a read")
        .with_callback(|gauge| {
            let ms = LAST_READ_MS.load(Ordering::Relaxed);
            if ms > 0 {
                let now = epoch_ms(SystemTime::now());
                gauge.observe(now.saturating_sub(ms) as f64 / 1000.0, &[]);
            }
        })
        .build();
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// RSS from `/proc/self/statm` (pages × page size).
#[cfg(feature = "otel")]
fn resident_bytes() -> Option<i64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: i64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * i64::try_from(rustix::param::page_size()).ok()?)
}

/// A turn ended: its duration and outcome (`succeeded`, `failed`,
/// `interrupted`, or `stopped` and `fatal` for a turn the runner's stop or
/// a fatal error ended) and its error code when it has one.
pub fn turn_ended(duration: Duration, outcome: &'static str, error_code: Option<&'static str>) {
    if let Some(m) = INSTRUMENTS.get() {
        let mut attrs = vec![KeyValue::new("outcome", outcome)];
        if let Some(code) = error_code {
            attrs.push(KeyValue::new("error.code", code));
        }
        m.turn_duration.record(duration.as_secs_f64(), &attrs);
    }
}

/// One attempt of a coordinator request: its route (the call's name, one
/// of the route table's) and its result (`ok`, `refused`, `retried`). An
/// answer is the last successful read of the coordinator.
pub fn request(route: &str, result: &'static str) {
    if result == "ok" {
        LAST_READ_MS.store(epoch_ms(SystemTime::now()), Ordering::Relaxed);
    }
    if let Some(m) = INSTRUMENTS.get() {
        let route = KeyValue::new("route", route.to_string());
        m.requests
            .add(1, &[route.clone(), KeyValue::new("result", result)]);
        if result == "retried" {
            m.retries.add(1, &[route]);
        }
    }
}

/// `count` run events reached `state` (`spooled`, `sent`, `undelivered`).
pub fn events(state: &'static str, count: u64) {
    if let Some(m) = INSTRUMENTS.get()
        && count > 0
    {
        m.events.add(count, &[KeyValue::new("state", state)]);
    }
}

/// A harvest's result changed `files` files.
pub fn harvested(files: u64) {
    if let Some(m) = INSTRUMENTS.get() {
        m.harvest_files.add(files, &[]);
    }
}

/// A push request of the git transport sent `bytes` bytes.
pub fn pushed(bytes: u64) {
    if let Some(m) = INSTRUMENTS.get() {
        m.pushed_bytes.add(bytes, &[]);
    }
}

/// When the current turn's `turn_started` was acknowledged, until the
/// agent's first output line takes it.
static TURN_STARTED: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

/// The turn was acknowledged (`turn_started`): its first output is timed
/// from now.
pub fn turn_started() {
    if INSTRUMENTS.get().is_some() {
        *crate::concurrency::lock(&TURN_STARTED) = Some(std::time::Instant::now());
    }
}

/// An output line of the agent: the first since `turn_started` is timed.
pub fn agent_output() {
    if let Some(m) = INSTRUMENTS.get()
        && let Some(at) = crate::concurrency::lock(&TURN_STARTED).take()
    {
        m.first_output.record(at.elapsed().as_secs_f64(), &[]);
    }
}
