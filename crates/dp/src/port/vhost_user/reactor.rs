//! One event loop (`qs-vhost`) for the control plane of every vhost-user port of a switch.
//! The switch's vhost-user driver makes it ([`Reactor::new`]), runs [`EventLoop::run`] on a
//! thread of its own spawn helper and ends it with [`Reactor::stop`].
//!
//! It owns every listening socket (server mode) and every frontend connection, and a
//! timer heap; it sleeps in `epoll_wait` until a socket is readable, a timer is due, a port
//! is added or removed (a command eventfd), or a guest mapping faulted (the `SIGBUS`
//! eventfd of [`qswitch_sys::guestmap`]). Nothing polls: an idle daemon with any number of
//! ports and no frontends sleeps, and a port costs no thread.
//!
//! - **Server mode**: the listener is in epoll while the port has no frontend; a connection
//!   is accepted and the listener taken out of epoll (a second frontend waits in the
//!   backlog until the first is gone).
//! - **Client mode**: connecting is a timer: at once, then every [`RETRY`] while the
//!   frontend's socket is missing, and [`RECONNECT`] after a disconnect. The connect is
//!   non-blocking (a listener with a full backlog cannot stall the loop).
//! - **Deadlines**: a frontend must complete its handshake (`SET_OWNER`) within
//!   [`HANDSHAKE_DEADLINE`] of connecting, or it is dropped (and the next one in the backlog
//!   accepted). A message is handed to the `vhost` crate's (blocking) parser only once it is
//!   completely in the socket buffer (its header peeked, `FIONREAD` counted), so parsing
//!   never waits; a message still incomplete [`MESSAGE_DEADLINE`] after its first byte
//!   arrived ends the connection. Connected sockets are non-blocking: a frontend that does
//!   not read its replies loses them, it cannot stall the loop.
//! - **Faulted guest memory**: the port is stopped (rings marked broken, connection
//!   closed, memory unmapped); the frontend may reconnect. The fault eventfd is the
//!   process's, so the ports are also looked at on every watchdog tick (another switch's
//!   loop may have drained the event).
//! - **Call watchdog**: a worker signals a guest with one `write` on the frontend's call
//!   eventfd, which blocks if the frontend saturated the counter and cleared `O_NONBLOCK`
//!   (there is no non-blocking write the peer cannot turn off). Each worker announces a
//!   call write in a per-thread slot (two relaxed stores per call, none per frame), listed
//!   in the loop's [`CallSlots`] the first time the thread signals one of its ports; every
//!   [`WATCHDOG`] the loop interrupts a thread seen in the same write twice
//!   ([`qswitch_sys::interrupt`]); the write fails with `EINTR` and the ring's call fd is
//!   dropped. So a worker waits at most two watchdog periods, and ring locks are never held
//!   longer.
//! - **Kick storms**: a transmit ring whose kicks bring no frames more than
//!   [`super::KICK_STORM`] times a second has its kick fd taken out of the worker's epoll
//!   (`rings::arm`); the watchdog tick puts it back.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex as StdMutex, Weak};
use std::time::{Duration, Instant};

use qswitch_sys::epoll::{Epoll, Event};
use qswitch_sys::eventfd::EventFd;
use vhost::vhost_user::message::FrontendReq;
use vhost::vhost_user::{BackendReqHandler, Error as VhostError};

use super::{peek_send_rarp, peek_vring_enable, Handler, Settings, VhostState};

/// A frontend must send `SET_OWNER` within this long after connecting.
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);
/// A message must arrive whole within this long after its first byte.
pub const MESSAGE_DEADLINE: Duration = Duration::from_secs(1);
/// Client mode: retry interval while the frontend's socket is not there.
pub const RETRY: Duration = Duration::from_secs(1);
/// Client mode: delay before reconnecting after a disconnect.
pub const RECONNECT: Duration = Duration::from_millis(50);
/// Call watchdog period.
pub const WATCHDOG: Duration = Duration::from_millis(100);
/// How often an incomplete message is looked at again (it is out of epoll meanwhile).
const PARTIAL_RECHECK: Duration = Duration::from_millis(5);
/// Messages handled per connection per wake-up (fairness between ports).
const MESSAGES_PER_WAKE: usize = 32;
/// A header size above this is not waited for: the parser refuses it.
const MAX_BODY: usize = 64 << 10;

const WAKE: u64 = u64::MAX;
const FAULTS: u64 = u64::MAX - 1;
const LISTENER: u64 = 0;
const CONN: u64 = 1;

/// Tests only: `QSWITCH_TEST_PANIC=qs-vhost` in the environment of the process when the
/// loop starts makes it panic at its first frontend connection (the daemon's test that a
/// panicking thread stops it).
pub const TEST_PANIC_ENV: &str = "QSWITCH_TEST_PANIC";

/// A handle on the vhost-user event loop.
#[derive(Debug, Clone)]
pub struct Reactor {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Commands for the loop; `None` once the loop has ended (commands are then refused).
    cmds: StdMutex<Option<Vec<Cmd>>>,
    wake: EventFd,
    next_id: AtomicU64,
    stop: AtomicBool,
    settings: Settings,
    calls: Arc<CallSlots>,
    ring_start: Arc<RingStartHook>,
    /// Watchdog ticks, and ports looked at by them, so far.
    watchdog_looks: [AtomicU64; 2],
}

#[derive(Debug)]
enum Cmd {
    Add(Box<PortSetup>),
    Remove(u64, mpsc::Sender<()>),
}

/// What [`Reactor::on_ring_start`] set, if anything.
#[derive(Default)]
pub(crate) struct RingStartHook(std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>);

impl RingStartHook {
    pub(crate) fn call(&self) {
        if let Some(f) = self.0.get() {
            f();
        }
    }
}

impl std::fmt::Debug for RingStartHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "RingStartHook(set)"
        } else {
            "RingStartHook"
        })
    }
}

/// What the loop needs to serve one port.
#[derive(Debug)]
pub(crate) struct PortSetup {
    pub(crate) id: u64,
    pub(crate) dev: Arc<VhostState>,
    pub(crate) socket: PathBuf,
    /// Server mode: the bound, non-blocking listener. Client mode: None.
    pub(crate) listener: Option<UnixListener>,
}

/// The event loop itself, to run on a thread of its own ([`EventLoop::run`]).
pub struct EventLoop(Loop);

impl EventLoop {
    /// Serves the ports until [`Reactor::stop`]. Every port still served is then
    /// disconnected, and later commands are refused.
    pub fn run(mut self) {
        if std::env::var_os(TEST_PANIC_ENV).is_some_and(|v| v == "qs-vhost") {
            self.0.test_panic = true;
        }
        self.0.run();
    }
}

impl Reactor {
    /// A new event loop with `settings` for its ports, and its handle. Nothing runs until
    /// [`EventLoop::run`] is called.
    pub fn new(settings: Settings) -> io::Result<(Reactor, EventLoop)> {
        qswitch_sys::interrupt::install();
        let shared = Arc::new(Shared {
            cmds: StdMutex::new(Some(Vec::new())),
            wake: EventFd::new()?,
            next_id: AtomicU64::new(1),
            stop: AtomicBool::new(false),
            settings,
            calls: Arc::new(CallSlots::default()),
            ring_start: Arc::default(),
            watchdog_looks: [AtomicU64::new(0), AtomicU64::new(0)],
        });
        let epoll = Epoll::new()?;
        epoll.add(shared.wake.as_raw_fd(), WAKE)?;
        epoll.add(qswitch_sys::guestmap::fault_events()?.as_raw_fd(), FAULTS)?;
        let l = Loop {
            shared: shared.clone(),
            epoll,
            ports: HashMap::new(),
            timers: BinaryHeap::new(),
            gen: 0,
            watchdog: HashMap::new(),
            watchdog_armed: false,
            watched: BTreeSet::new(),
            test_panic: false,
        };
        Ok((Reactor { shared }, EventLoop(l)))
    }

    /// The settings of the loop's ports.
    pub fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    /// Where the workers announce their call writes to this loop's watchdog.
    pub(crate) fn calls(&self) -> Arc<CallSlots> {
        self.shared.calls.clone()
    }

    /// Has `f` called whenever a ring of one of the loop's ports starts (the switch wakes
    /// its workers: one whose queues are all dormant, see `Port::rx_dormant`, sleeps without
    /// a timeout), and when a port's wake-up fds are made at its first connection (the
    /// workers register the new `Port::rx_fd` before they next sleep). The first hook set
    /// stays.
    pub fn on_ring_start(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.shared.ring_start.0.set(Box::new(f));
    }

    pub(crate) fn ring_start_hook(&self) -> Arc<RingStartHook> {
        self.shared.ring_start.clone()
    }

    /// Asks the loop to end (it returns from [`EventLoop::run`] at once).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _ = self.shared.wake.notify();
    }

    /// Watchdog ticks so far, and the ports they looked at in all: ports no frontend is
    /// connected to are not looked at, so an idle loop's second number stays put.
    pub fn watchdog_looks(&self) -> (u64, u64) {
        let l = &self.shared.watchdog_looks;
        (l[0].load(Ordering::Relaxed), l[1].load(Ordering::Relaxed))
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.shared.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues `cmd`; dropped (its sender with it) once the loop has ended.
    fn send(&self, cmd: Cmd) {
        if let Some(cmds) = self
            .shared
            .cmds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            cmds.push(cmd);
        }
        let _ = self.shared.wake.notify();
    }

    /// Hands a port to the loop.
    pub(crate) fn add(&self, setup: PortSetup) {
        self.send(Cmd::Add(Box::new(setup)));
    }

    /// Takes a port out of the loop (its connection closed, its listener dropped) and
    /// waits until that is done (at once if the loop has ended).
    pub(crate) fn remove(&self, id: u64) {
        let (tx, rx) = mpsc::channel();
        self.send(Cmd::Remove(id, tx));
        let _ = rx.recv_timeout(Duration::from_secs(10));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Watchdog,
    Connect(u64),
    Handshake(u64, u64),
    Recheck(u64, u64),
}

struct Conn {
    req: BackendReqHandler<StdMutex<Handler>>,
    handler: Arc<StdMutex<Handler>>,
    stream: UnixStream,
    gen: u64,
    partial_since: Option<Instant>,
    in_epoll: bool,
}

struct Port {
    dev: Arc<VhostState>,
    socket: PathBuf,
    listener: Option<UnixListener>,
    listening: bool,
    conn: Option<Conn>,
    warned: bool,
}

struct Loop {
    shared: Arc<Shared>,
    epoll: Epoll,
    ports: HashMap<u64, Port>,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// Connection generation (stale timers are ignored).
    gen: u64,
    /// Call watchdog: the sequence number each thread showed at the last look.
    watchdog: HashMap<i32, u32>,
    watchdog_armed: bool,
    /// The ports the watchdog tick looks at: every port connected since the tick last saw
    /// it disconnected with its kicks unmuted. A port no frontend ever connected to has no
    /// guest memory, no rings and no kicks, so an idle host's many unconnected ports cost
    /// the tick nothing, and with none watched (and no call ever signalled) there is no
    /// tick at all.
    watched: BTreeSet<u64>,
    /// Panic at the next connection ([`TEST_PANIC_ENV`]).
    test_panic: bool,
}

/// The loop's end, by [`Reactor::stop`] or a panic: later commands are refused (a waiting
/// `remove` returns), the pending ones dropped, every port disconnected.
impl Drop for Loop {
    fn drop(&mut self) {
        let pending = self
            .shared
            .cmds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(pending);
        let ids: Vec<u64> = self.ports.keys().copied().collect();
        for id in ids {
            if let Some(mut p) = self.ports.remove(&id) {
                self.drop_conn(&mut p, None);
            }
        }
    }
}

enum Pending {
    Complete,
    Nothing,
    Partial,
    Closed,
}

/// Whether a whole message waits on `s`.
fn pending(s: &UnixStream) -> Pending {
    let mut hdr = [0u8; 12];
    match qswitch_sys::fd::peek(s, &mut hdr) {
        Ok(0) => Pending::Closed,
        Ok(n) if n < hdr.len() => Pending::Partial,
        Ok(_) => {
            let size = u32::from_ne_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]) as usize;
            if size > MAX_BODY {
                return Pending::Complete;
            }
            match qswitch_sys::fd::readable_bytes(s) {
                Ok(n) if n >= hdr.len() + size => Pending::Complete,
                Ok(_) => Pending::Partial,
                Err(_) => Pending::Closed,
            }
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Pending::Nothing,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Pending::Nothing,
        Err(_) => Pending::Closed,
    }
}

fn token(id: u64, kind: u64) -> u64 {
    (id << 1) | kind
}

impl Loop {
    fn run(&mut self) {
        let mut events = [Event::EMPTY; 64];
        while !self.shared.stop.load(Ordering::Relaxed) {
            let timeout = match self.timers.peek() {
                Some(Reverse((at, _))) => {
                    let d = at.saturating_duration_since(Instant::now());
                    // Round up so a timer is never polled for early.
                    i32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
                }
                None => -1,
            };
            let n = self.epoll.wait(&mut events, timeout).unwrap_or(0);
            for ev in &events[..n] {
                match ev.token() {
                    WAKE => self.commands(),
                    FAULTS => self.faults(),
                    t => {
                        let id = t >> 1;
                        if t & 1 == LISTENER {
                            self.accept(id);
                        } else {
                            self.readable(id);
                        }
                    }
                }
            }
            self.timers_due();
        }
    }

    fn commands(&mut self) {
        let _ = self.shared.wake.drain();
        let cmds = std::mem::take(
            self.shared
                .cmds
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(Vec::new),
        );
        for c in cmds {
            match c {
                Cmd::Add(s) => {
                    let PortSetup {
                        id,
                        dev,
                        socket,
                        listener,
                    } = *s;
                    let client = listener.is_none();
                    self.ports.insert(
                        id,
                        Port {
                            dev,
                            socket,
                            listener,
                            listening: false,
                            conn: None,
                            warned: false,
                        },
                    );
                    if client {
                        self.timers
                            .push(Reverse((Instant::now(), Timer::Connect(id))));
                    } else {
                        self.listen(id);
                    }
                }
                Cmd::Remove(id, ack) => {
                    if let Some(mut p) = self.ports.remove(&id) {
                        self.drop_conn(&mut p, None);
                        if let Some(l) = p.listener.take() {
                            if p.listening {
                                let _ = self.epoll.delete(l.as_raw_fd());
                            }
                        }
                    }
                    let _ = ack.send(());
                }
            }
        }
    }

    fn listen(&mut self, id: u64) {
        let Some(p) = self.ports.get_mut(&id) else {
            return;
        };
        if let Some(l) = &p.listener {
            if !p.listening && self.epoll.add(l.as_raw_fd(), token(id, LISTENER)).is_ok() {
                p.listening = true;
            }
        }
    }

    fn accept(&mut self, id: u64) {
        let Some(p) = self.ports.get_mut(&id) else {
            return;
        };
        let Some(l) = &p.listener else {
            return;
        };
        match l.accept() {
            Ok((s, _)) => {
                let _ = self.epoll.delete(l.as_raw_fd());
                p.listening = false;
                self.connected(id, s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => tracing::warn!(port = %p.dev.name, error = %e, "accept failed"),
        }
    }

    fn connect(&mut self, id: u64) {
        let Some(p) = self.ports.get_mut(&id) else {
            return;
        };
        if p.conn.is_some() {
            return;
        }
        match qswitch_sys::fd::connect_unix_nonblocking(&p.socket) {
            Ok(s) => {
                p.warned = false;
                self.connected(id, s);
            }
            Err(e) => {
                if !p.warned {
                    tracing::info!(port = %p.dev.name, socket = %p.socket.display(), error = %e,
                        "frontend not there yet; retrying every second");
                    p.warned = true;
                }
                self.timers
                    .push(Reverse((Instant::now() + RETRY, Timer::Connect(id))));
            }
        }
    }

    /// Starts serving a new connection on port `id`.
    fn connected(&mut self, id: u64, stream: UnixStream) {
        let Some(p) = self.ports.get_mut(&id) else {
            return;
        };
        // The port's kick epolls and inject eventfd are made now, not with the port (an idle
        // port holds only its listening socket), and before the port shows as connected.
        let wake = p.dev.wake_fds().map_err(|e| {
            tracing::warn!(port = %p.dev.name, error = %e, "cannot make the port's wake-up fds");
        });
        let ok = wake
            .ok()
            .and_then(|_| stream.try_clone().ok())
            .filter(|peek| {
                stream.set_nonblocking(true).is_ok()
                    && self.epoll.add(peek.as_raw_fd(), token(id, CONN)).is_ok()
            });
        let Some(peek) = ok else {
            tracing::warn!(port = %p.dev.name, "cannot serve a new connection");
            let client = p.listener.is_none();
            if client {
                self.timers
                    .push(Reverse((Instant::now() + RETRY, Timer::Connect(id))));
            } else {
                self.listen(id);
            }
            return;
        };
        tracing::info!(port = %p.dev.name, "frontend connected");
        if self.test_panic {
            panic!("{TEST_PANIC_ENV}=qs-vhost: a panic injected at a frontend connection");
        }
        p.dev.connected.store(true, Ordering::Relaxed);
        self.watched.insert(id);
        self.gen += 1;
        let handler = Arc::new(StdMutex::new(Handler::new(p.dev.clone())));
        p.conn = Some(Conn {
            req: BackendReqHandler::from_stream(stream, handler.clone()),
            handler,
            stream: peek,
            gen: self.gen,
            partial_since: None,
            in_epoll: true,
        });
        self.timers.push(Reverse((
            Instant::now() + HANDSHAKE_DEADLINE,
            Timer::Handshake(id, self.gen),
        )));
    }

    /// Ends port `p`'s connection (if any): the rings stop, the memory is unmapped.
    fn drop_conn(&mut self, p: &mut Port, why: Option<&str>) {
        let Some(c) = p.conn.take() else {
            return;
        };
        if c.in_epoll {
            let _ = self.epoll.delete(c.stream.as_raw_fd());
        }
        let _ = c.stream.shutdown(std::net::Shutdown::Both);
        drop(c);
        p.dev.disconnect();
        if let Some(why) = why {
            tracing::info!(port = %p.dev.name, "frontend disconnected: {why}");
        }
    }

    /// After a connection ended: listen again, or reconnect later.
    fn end(&mut self, id: u64, why: &str) {
        let Some(mut p) = self.ports.remove(&id) else {
            return;
        };
        self.drop_conn(&mut p, Some(why));
        let client = p.listener.is_none();
        self.ports.insert(id, p);
        if client {
            self.timers
                .push(Reverse((Instant::now() + RECONNECT, Timer::Connect(id))));
        } else {
            self.listen(id);
        }
    }

    fn readable(&mut self, id: u64) {
        for _ in 0..MESSAGES_PER_WAKE {
            let Some(c) = self.ports.get_mut(&id).and_then(|p| p.conn.as_mut()) else {
                return;
            };
            match pending(&c.stream) {
                Pending::Nothing => return,
                Pending::Closed => return self.end(id, "connection closed"),
                Pending::Partial => {
                    let now = Instant::now();
                    let since = *c.partial_since.get_or_insert(now);
                    if now.duration_since(since) >= MESSAGE_DEADLINE {
                        return self.end(id, "message not completed within the deadline");
                    }
                    if c.in_epoll {
                        let _ = self.epoll.delete(c.stream.as_raw_fd());
                        c.in_epoll = false;
                    }
                    let gen = c.gen;
                    self.timers
                        .push(Reverse((now + PARTIAL_RECHECK, Timer::Recheck(id, gen))));
                    return;
                }
                Pending::Complete => {
                    c.partial_since = None;
                    if !c.in_epoll
                        && self
                            .epoll
                            .add(c.stream.as_raw_fd(), token(id, CONN))
                            .is_ok()
                    {
                        c.in_epoll = true;
                    }
                    if let Err(why) = handle_one(c) {
                        return self.end(id, &why);
                    }
                }
            }
        }
    }

    fn faults(&mut self) {
        if let Ok(events) = qswitch_sys::guestmap::fault_events() {
            let _ = events.drain();
        }
        let all: Vec<u64> = self.ports.keys().copied().collect();
        self.stop_faulted(&all);
    }

    /// Stops those of `ids` whose guest memory faulted. On a fault event (every port), and
    /// on every watchdog tick (the watched ports: only a connected port has guest memory):
    /// the fault eventfd is the process's (the `SIGBUS` handler's), and the loop of another
    /// switch in the process may have drained it first.
    fn stop_faulted(&mut self, ids: &[u64]) {
        let faulted: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| self.ports.get(id).is_some_and(|p| p.dev.mem_faulted()))
            .collect();
        for id in faulted {
            if let Some(p) = self.ports.get(&id) {
                tracing::warn!(port = %p.dev.name,
                    "guest memory faulted (its file shrank under the mapping); port stopped");
                p.dev.stop_rings("guest memory faulted; port stopped");
            }
            self.end(id, "guest memory faulted");
        }
    }

    fn timers_due(&mut self) {
        let now = Instant::now();
        if !self.watchdog_armed && (self.shared.calls.seen() || !self.watched.is_empty()) {
            self.watchdog_armed = true;
            self.timers.push(Reverse((now + WATCHDOG, Timer::Watchdog)));
        }
        while let Some(Reverse((at, t))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            match t {
                Timer::Watchdog => {
                    self.call_watchdog();
                    let watched: Vec<u64> = self.watched.iter().copied().collect();
                    let looks = &self.shared.watchdog_looks;
                    looks[0].fetch_add(1, Ordering::Relaxed);
                    looks[1].fetch_add(watched.len() as u64, Ordering::Relaxed);
                    self.stop_faulted(&watched);
                    for id in watched {
                        let Some(p) = self.ports.get(&id) else {
                            self.watched.remove(&id);
                            continue;
                        };
                        if p.dev.kicks_muted.load(Ordering::Acquire) != 0 {
                            p.dev.unmute_kicks();
                        } else if p.conn.is_none() {
                            self.watched.remove(&id);
                        }
                    }
                    if self.shared.calls.seen() || !self.watched.is_empty() {
                        self.timers.push(Reverse((now + WATCHDOG, Timer::Watchdog)));
                    } else {
                        self.watchdog_armed = false;
                    }
                }
                Timer::Connect(id) => self.connect(id),
                Timer::Handshake(id, gen) => {
                    let late = self
                        .ports
                        .get(&id)
                        .and_then(|p| p.conn.as_ref())
                        .is_some_and(|c| {
                            c.gen == gen
                                && !c
                                    .handler
                                    .lock()
                                    .map(|h| h.handshake_done())
                                    .unwrap_or(false)
                        });
                    if late {
                        self.end(id, "no handshake (SET_OWNER) within the deadline");
                    }
                }
                Timer::Recheck(id, gen) => {
                    let current = self
                        .ports
                        .get(&id)
                        .and_then(|p| p.conn.as_ref())
                        .is_some_and(|c| c.gen == gen);
                    if current {
                        self.readable(id);
                    }
                }
            }
        }
    }

    fn call_watchdog(&mut self) {
        let mut slots = self.shared.calls.lock();
        slots.retain(|w| w.strong_count() > 0);
        let mut seen = HashMap::with_capacity(slots.len());
        for s in slots.iter().filter_map(Weak::upgrade) {
            let seq = s.seq.load(Ordering::Relaxed);
            if seq & 1 == 1 && self.watchdog.get(&s.tid) == Some(&seq) {
                s.interrupted.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    tid = s.tid,
                    "a worker is blocked writing a guest's call eventfd; interrupting it"
                );
                let _ = qswitch_sys::interrupt::interrupt(s.tid);
            }
            seen.insert(s.tid, seq);
        }
        self.watchdog = seen;
    }
}

/// Handles one complete message. Err: the connection must end.
fn handle_one(c: &mut Conn) -> Result<(), String> {
    let enable = peek_vring_enable(&c.stream);
    let rarp = peek_send_rarp(&c.stream);
    let log_base = peek_request(&c.stream) == Some(FrontendReq::SET_LOG_BASE as u32);
    match c.req.handle_request() {
        Ok(()) => Ok(()),
        // The vhost crate reads SEND_RARP whole, then refuses it as unknown: qswitch
        // handles it here (the frontend expects no reply).
        Err(VhostError::InvalidMessage) if rarp.is_some() => {
            if let (Some(mac), Ok(h)) = (rarp, c.handler.lock()) {
                h.send_rarp(mac);
            }
            Ok(())
        }
        // A refused dirty log gets no reply, and the frontend waits for one: end the
        // connection so that it sees the failure (QEMU then fails the migration).
        Err(e) if log_base => Err(format!("dirty log refused: {e}")),
        // QEMU 7.2 enables (and, after a reconnect, re-enables) rings before SET_FEATURES;
        // the vhost crate refuses that. Remember it and apply it once PROTOCOL_FEATURES is
        // acked, or the rings would stay disabled.
        Err(VhostError::InactiveFeature(_)) if enable.is_some() => {
            if let (Some((index, on)), Ok(mut h)) = (enable, c.handler.lock()) {
                tracing::debug!(vring = index, on, "early vring enable deferred");
                h.defer_enable(index, on);
            }
            Ok(())
        }
        // The request was read whole and refused; the connection is still in step. QEMU
        // 7.2, for one, disables extra queue pairs before SET_FEATURES, which the vhost
        // crate refuses: nothing to act on, rings start disabled anyway. SocketRetry: a
        // reply did not fit in the socket (the frontend does not read them).
        Err(
            e @ (VhostError::InactiveFeature(_)
            | VhostError::InactiveOperation(_)
            | VhostError::InvalidParam
            | VhostError::InvalidOperation(_)
            | VhostError::SocketRetry(_)),
        ) => {
            tracing::debug!(error = %e, "request refused");
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}

/// The request code of the next message waiting on `s`.
fn peek_request(s: &UnixStream) -> Option<u32> {
    let mut b = [0u8; 4];
    match qswitch_sys::fd::peek(s, &mut b) {
        Ok(4) => Some(u32::from_ne_bytes(b)),
        _ => None,
    }
}

/// A worker thread's call-write announcement (see the module docs).
#[derive(Debug)]
struct CallSlot {
    tid: i32,
    /// Odd while the thread is in a call write.
    seq: AtomicU32,
    /// Bumped by the watchdog before it interrupts the thread.
    interrupted: AtomicU32,
}

/// The call slots of the threads that signal this loop's guests (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct CallSlots(StdMutex<Vec<Weak<CallSlot>>>);

impl CallSlots {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<CallSlot>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn seen(&self) -> bool {
        !self.lock().is_empty()
    }
}

thread_local! {
    /// The calling thread's slot (per-thread state only: its id and its call-write
    /// sequence), and the lists it is in. Each switch's loop keeps its own list
    /// ([`CallSlots`]); a thread that signals the guests of two switches is in both. The
    /// `Weak`s keep the lists' allocations, so a list is never mistaken for a new one at
    /// the same address.
    static CALL_SLOT: (Arc<CallSlot>, RefCell<Vec<Weak<CallSlots>>>) = (
        Arc::new(CallSlot {
            tid: qswitch_sys::thread::gettid(),
            seq: AtomicU32::new(0),
            interrupted: AtomicU32::new(0),
        }),
        RefCell::new(Vec::new()),
    );
}

/// Signals a guest through its call eventfd. False if the write blocked and the watchdog
/// interrupted it: the caller must stop using this fd.
pub(crate) fn signal_call(calls: &Arc<CallSlots>, call: &File) -> bool {
    CALL_SLOT.with(|(s, joined)| {
        let mut joined = joined.borrow_mut();
        if !joined
            .iter()
            .any(|j| std::ptr::eq(j.as_ptr(), Arc::as_ptr(calls)))
        {
            joined.retain(|j| j.strong_count() > 0);
            joined.push(Arc::downgrade(calls));
            calls.lock().push(Arc::downgrade(s));
        }
        drop(joined);
        let seq = s.seq.load(Ordering::Relaxed);
        let kicked = s.interrupted.load(Ordering::Relaxed);
        s.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        let ok = loop {
            match qswitch_sys::eventfd::signal_foreign(call) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    // Another signal: try again. The watchdog: give up on this fd.
                    if s.interrupted.load(Ordering::Relaxed) != kicked {
                        break false;
                    }
                }
                _ => break true,
            }
        };
        s.seq.store(seq.wrapping_add(2), Ordering::Relaxed);
        ok
    })
}
