//! The runner's clocks over one agent process (PROTOCOL.md 4.1 step 4), and
//! what each does when it rings:
//!
//! - the **idle watchdog**: no output line (or event) for
//!   `--agent-idle-timeout` → interrupt; the turn fails `agent_hung`;
//! - the **terminal watchdog**: the terminal event came but the process is
//!   still alive after the terminal grace (a server: after its settle time)
//!   → stop its tree, keep the outcome;
//! - the **two-stage interrupt**: the CLI's own protocol interrupt at once,
//!   SIGINT to the process group at half the grace (the supervisor sends
//!   SIGKILL at its end); an adapter without a protocol interrupt, or whose
//!   terminal event already came, gets the signals at once.
//!
//! The drive loop sleeps on one timer, [`Watchdog::next`] (the earliest
//! armed deadline), and hands what rang to [`Watchdog::ring`]; the adapter's
//! notes and the runner's requests reach the clocks through the other
//! methods.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{AdapterCommand, AgentTimings, Launch};
use crate::concurrency::lock;
use crate::process::supervisor::Control;
use crate::timings::Timings;

/// Which deadline of the [`Watchdog`] came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Alarm {
    /// The idle timeout after the last output seen when the deadline was
    /// computed (output that came since then only postpones it).
    Idle,
    /// Half the grace after the protocol interrupt: the signals' turn.
    Signal,
    /// The terminal grace is over and the process still runs.
    Terminal,
    /// The wrap-up's time before the turn's time cap came.
    WrapUp,
}

/// The clocks of one agent process and the two channels they act on (the
/// adapter's commands, the supervisor's control).
pub(super) struct Watchdog {
    idle_timeout: Option<Duration>,
    /// When the agent last printed a line or the adapter last saw an
    /// event; shared with the output callback, which runs on the readers.
    last_output: Arc<Mutex<Instant>>,
    hung: Option<Duration>,
    /// The terminal grace, or for a server its settle time.
    terminal_wait: Duration,
    server: bool,
    terminal_seen: bool,
    terminal_at: Option<Instant>,
    protocol: bool,
    protocol_sent: bool,
    /// When to signal, and the SIGINT → SIGKILL grace left by then.
    signal_at: Option<(Instant, Duration)>,
    signalled: bool,
    interrupt_grace: Duration,
    stop_grace: Duration,
    /// When to send the wrap-up ([`AdapterCommand::WrapUp`]), until sent.
    wrap_up_at: Option<Instant>,
    commands: mpsc::UnboundedSender<AdapterCommand>,
    control: mpsc::UnboundedSender<Control>,
}

impl Watchdog {
    /// The clocks of a process started as `launch` says, the idle clock
    /// running from now.
    pub(super) fn new(
        launch: &Launch,
        agent: &AgentTimings,
        timings: &Timings,
        commands: mpsc::UnboundedSender<AdapterCommand>,
        control: mpsc::UnboundedSender<Control>,
    ) -> Self {
        Watchdog {
            idle_timeout: agent.idle_timeout,
            last_output: Arc::new(Mutex::new(Instant::now())),
            hung: None,
            terminal_wait: if launch.server {
                agent.server_settle
            } else {
                agent.terminal_grace
            },
            server: launch.server,
            terminal_seen: false,
            terminal_at: None,
            protocol: launch.protocol_interrupt,
            protocol_sent: false,
            signal_at: None,
            signalled: false,
            interrupt_grace: timings.interrupt_grace,
            stop_grace: timings.stop_grace,
            wrap_up_at: None,
            commands,
            control,
        }
    }

    /// The same clocks with the wrap-up sent at `at` (unless the turn has
    /// ended or is being stopped by then).
    pub(super) fn with_wrap_up(mut self, at: Option<Instant>) -> Self {
        self.wrap_up_at = at;
        self
    }

    /// The same clocks, the idle one being `clock` (what the output
    /// callback of an already started process resets), running from now.
    pub(super) fn with_output_clock(mut self, clock: Arc<Mutex<Instant>>) -> Self {
        *lock(&clock) = Instant::now();
        self.last_output = clock;
        self
    }

    /// The idle clock (tests set it back).
    #[cfg(test)]
    pub(super) fn output_clock(&self) -> Arc<Mutex<Instant>> {
        self.last_output.clone()
    }

    /// Output that did not come as a line (an event stream) was seen.
    pub(super) fn activity(&self) {
        *lock(&self.last_output) = Instant::now();
    }

    /// The idle timeout, when the idle watchdog fired.
    pub(super) fn hung(&self) -> Option<Duration> {
        self.hung
    }

    /// The adapter saw the terminal event: the idle watchdog is off, the
    /// terminal watchdog armed (once).
    pub(super) fn terminal(&mut self) {
        if !self.terminal_seen {
            self.terminal_seen = true;
            self.terminal_at = Some(Instant::now() + self.terminal_wait);
        }
    }

    /// Interrupts with the interrupt grace (an interrupt request, the idle
    /// watchdog, an adapter giving up).
    pub(super) fn interrupt(&mut self) {
        self.escalate(self.interrupt_grace);
    }

    /// Stops gracefully, with the stop grace (the first stop signal).
    pub(super) fn stop(&mut self) {
        self.escalate(self.stop_grace);
    }

    /// Whether the CLI's protocol interrupt was sent.
    pub(super) fn protocol_sent(&self) -> bool {
        self.protocol_sent
    }

    /// SIGKILL to the process group now (the second stop signal).
    pub(super) fn kill(&self) {
        let _ = self.control.send(Control::Kill);
    }

    /// The two-stage interrupt with `grace`: the protocol interrupt now and
    /// the signals at half of it, or the signals now.
    fn escalate(&mut self, grace: Duration) {
        if self.signalled {
            // A shorter grace (a stop after an interrupt) still applies.
            let _ = self.control.send(Control::Interrupt { grace });
            return;
        }
        if self.protocol && !self.terminal_seen {
            if !self.protocol_sent {
                self.protocol_sent = true;
                let _ = self.commands.send(AdapterCommand::ProtocolInterrupt);
            }
            let half = grace / 2;
            let at = Instant::now() + half;
            let rest = grace.saturating_sub(half);
            self.signal_at = Some(match self.signal_at {
                Some((t, g)) if t <= at => (t, g.min(rest)),
                _ => (at, rest),
            });
        } else {
            self.signalled = true;
            self.signal_at = None;
            let _ = self.control.send(Control::Interrupt { grace });
        }
    }

    /// The terminal event came and the process must go: its stop signal
    /// now, SIGKILL after the stop grace (unless already signalled).
    pub(super) fn stop_tree(&mut self) {
        if !self.signalled {
            self.signalled = true;
            self.signal_at = None;
            self.terminal_at = None;
            let _ = self.control.send(Control::Interrupt {
                grace: self.stop_grace,
            });
        }
    }

    /// The earliest armed deadline, if any. The idle watchdog is off once
    /// the runner has begun to stop the agent or its terminal event came.
    pub(super) fn next(&self) -> Option<(Instant, Alarm)> {
        let stopping = self.protocol_sent || self.signalled;
        let idle = match self.idle_timeout {
            Some(t) if !stopping && !self.terminal_seen => {
                Some((*lock(&self.last_output) + t, Alarm::Idle))
            }
            _ => None,
        };
        let signal = self.signal_at.map(|(t, _)| (t, Alarm::Signal));
        let terminal = self.terminal_at.map(|t| (t, Alarm::Terminal));
        let wrap_up = self
            .wrap_up_at
            .filter(|_| !stopping && !self.terminal_seen)
            .map(|t| (t, Alarm::WrapUp));
        [idle, signal, terminal, wrap_up]
            .into_iter()
            .flatten()
            .min_by_key(|(t, _)| *t)
    }

    /// Acts on `alarm`, which [`Watchdog::next`] named and whose time came.
    pub(super) fn ring(&mut self, alarm: Alarm) {
        match alarm {
            Alarm::Idle => {
                let last = *lock(&self.last_output);
                if let Some(t) = self.idle_timeout
                    && Instant::now() >= last + t
                    && self.hung.is_none()
                {
                    tracing::warn!(idle = %humantime::format_duration(t), "no output from the agent; interrupting it (agent_hung)");
                    self.hung = Some(t);
                    self.interrupt();
                }
            }
            Alarm::Signal => {
                if let Some((_, grace)) = self.signal_at.take() {
                    tracing::info!(
                        grace = %humantime::format_duration(grace),
                        "the agent is still running after its protocol interrupt; its stop signal (SIGINT, or SIGTERM for opencode) to its process group"
                    );
                    self.signalled = true;
                    let _ = self.control.send(Control::Interrupt { grace });
                }
            }
            Alarm::WrapUp => {
                self.wrap_up_at = None;
                if !(self.protocol_sent || self.signalled || self.terminal_seen) {
                    tracing::info!("the turn's time cap is near; the wrap-up message to the agent");
                    let _ = self.commands.send(AdapterCommand::WrapUp);
                }
            }
            Alarm::Terminal => {
                self.terminal_at = None;
                if !self.signalled {
                    if !self.server {
                        tracing::warn!(
                            "the agent sent its terminal event but is still running; stopping its process tree"
                        );
                    }
                    self.stop_tree();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{ExitRule, StdinMode};

    struct Rig {
        dog: Watchdog,
        commands: mpsc::UnboundedReceiver<AdapterCommand>,
        control: mpsc::UnboundedReceiver<Control>,
    }

    const SEC: Duration = Duration::from_secs(1);

    fn rig(protocol: bool, server: bool) -> Rig {
        let launch = Launch {
            args: Vec::new(),
            env: Vec::new(),
            stdin: StdinMode::Bytes(Vec::new()),
            protocol_interrupt: protocol,
            server,
            exit_rule: ExitRule::NeedsTerminal,
            stop_signal: rustix::process::Signal::INT,
            wrap_up: true,
        };
        let agent = AgentTimings {
            idle_timeout: Some(2 * SEC),
            terminal_grace: 10 * SEC,
            server_settle: SEC / 2,
            ..AgentTimings::default()
        };
        let timings = Timings {
            interrupt_grace: 10 * SEC,
            stop_grace: 4 * SEC,
            ..Timings::default()
        };
        let (ctx, commands) = mpsc::unbounded_channel();
        let (ktx, control) = mpsc::unbounded_channel();
        Rig {
            dog: Watchdog::new(&launch, &agent, &timings, ctx, ktx),
            commands,
            control,
        }
    }

    fn near(a: Instant, b: Instant) -> bool {
        a.max(b).duration_since(a.min(b)) < SEC / 10
    }

    #[test]
    fn the_protocol_interrupt_comes_first_and_the_signals_at_half_the_grace() {
        let mut r = rig(true, false);
        let (idle_at, alarm) = r.dog.next().unwrap();
        assert_eq!(alarm, Alarm::Idle);
        assert!(near(idle_at, Instant::now() + 2 * SEC));
        r.dog.interrupt();
        assert_eq!(r.commands.try_recv(), Ok(AdapterCommand::ProtocolInterrupt));
        assert!(r.control.try_recv().is_err());
        // The idle watchdog is off once stopping; the signals are armed.
        let (at, alarm) = r.dog.next().unwrap();
        assert_eq!(alarm, Alarm::Signal);
        assert!(near(at, Instant::now() + 5 * SEC));
        // A stop during the interrupt: no second protocol interrupt; the
        // earlier deadline and the shorter grace win.
        r.dog.stop();
        assert!(r.commands.try_recv().is_err());
        let (at, _) = r.dog.next().unwrap();
        assert!(near(at, Instant::now() + 2 * SEC));
        r.dog.interrupt();
        assert_eq!(r.dog.next().unwrap().0, at);
        r.dog.ring(Alarm::Signal);
        assert_eq!(
            r.control.try_recv(),
            Ok(Control::Interrupt { grace: 2 * SEC })
        );
        assert_eq!(r.dog.next(), None);
        // Once signalled, another interrupt goes straight to the signals.
        r.dog.interrupt();
        assert_eq!(
            r.control.try_recv(),
            Ok(Control::Interrupt { grace: 10 * SEC })
        );
    }

    #[test]
    fn without_a_protocol_interrupt_or_after_the_terminal_event_the_signals_come_at_once() {
        let mut r = rig(false, false);
        r.dog.interrupt();
        assert!(r.commands.try_recv().is_err());
        assert_eq!(
            r.control.try_recv(),
            Ok(Control::Interrupt { grace: 10 * SEC })
        );
        let mut r = rig(true, false);
        r.dog.terminal();
        r.dog.stop();
        assert!(r.commands.try_recv().is_err());
        assert_eq!(
            r.control.try_recv(),
            Ok(Control::Interrupt { grace: 4 * SEC })
        );
    }

    #[test]
    fn the_terminal_watchdog_replaces_the_idle_one_and_stops_the_tree_once() {
        let mut r = rig(true, false);
        r.dog.terminal();
        let (at, alarm) = r.dog.next().unwrap();
        assert_eq!(alarm, Alarm::Terminal);
        assert!(near(at, Instant::now() + 10 * SEC));
        r.dog.terminal();
        assert_eq!(r.dog.next().unwrap().0, at);
        r.dog.ring(Alarm::Terminal);
        assert_eq!(
            r.control.try_recv(),
            Ok(Control::Interrupt { grace: 4 * SEC })
        );
        assert_eq!(r.dog.next(), None);
        // A server settles for its own, shorter time.
        let mut r = rig(true, true);
        r.dog.terminal();
        assert!(near(r.dog.next().unwrap().0, Instant::now() + SEC / 2));
    }

    #[test]
    fn the_idle_watchdog_fires_only_when_the_output_is_still_old() {
        let mut r = rig(true, false);
        // Output since the deadline was computed: nothing happens.
        r.dog.ring(Alarm::Idle);
        assert_eq!(r.dog.hung(), None);
        assert!(r.commands.try_recv().is_err());
        *lock(&r.dog.output_clock()) = Instant::now().checked_sub(3 * SEC).unwrap();
        r.dog.ring(Alarm::Idle);
        assert_eq!(r.dog.hung(), Some(2 * SEC));
        assert_eq!(r.commands.try_recv(), Ok(AdapterCommand::ProtocolInterrupt));
        // Activity resets the clock.
        let mut r = rig(true, false);
        *lock(&r.dog.output_clock()) = Instant::now().checked_sub(3 * SEC).unwrap();
        r.dog.activity();
        r.dog.ring(Alarm::Idle);
        assert_eq!(r.dog.hung(), None);
    }

    #[tokio::test]
    async fn the_wrap_up_goes_once_at_its_time_and_never_once_the_turn_ends_or_stops() {
        let at = Instant::now() + SEC;
        let mut r = rig(true, false);
        r.dog = r.dog.with_wrap_up(Some(at));
        assert_eq!(r.dog.next(), Some((at, Alarm::WrapUp)));
        r.dog.ring(Alarm::WrapUp);
        assert_eq!(r.commands.try_recv(), Ok(AdapterCommand::WrapUp));
        assert_eq!(r.dog.next().map(|(_, a)| a), Some(Alarm::Idle));
        // Not after the terminal event, nor once the runner stops the agent.
        for end in [Watchdog::terminal, Watchdog::interrupt] {
            let mut r = rig(true, false);
            r.dog = r.dog.with_wrap_up(Some(at));
            end(&mut r.dog);
            while r.commands.try_recv().is_ok() {}
            assert_ne!(r.dog.next().map(|(_, a)| a), Some(Alarm::WrapUp));
            r.dog.ring(Alarm::WrapUp);
            assert!(r.commands.try_recv().is_err());
        }
    }

    #[test]
    fn a_tree_stopped_at_its_terminal_event_is_signalled_once_at_once() {
        let mut r = rig(true, false);
        // An interrupt armed the signals for half its grace; the terminal
        // event with a stop now signals at once, with the stop grace.
        r.dog.interrupt();
        assert_eq!(r.commands.try_recv(), Ok(AdapterCommand::ProtocolInterrupt));
        r.dog.terminal();
        r.dog.stop_tree();
        match r.control.try_recv() {
            Ok(Control::Interrupt { grace }) => assert_eq!(grace, 4 * SEC),
            other => panic!("{other:?}"),
        }
        assert_eq!(r.dog.next(), None, "nothing else is armed");
        r.dog.stop_tree();
        assert!(r.control.try_recv().is_err(), "signalled once");
    }
}
