//! Who is at the other end of a connection to the agent API proxy
//! (PROTOCOL.md 3, issue 32): a proxy token serves only the processes of
//! the turn it was made for, wherever else it was read.
//!
//! The client's end of a loopback TCP connection is a socket of the
//! runner's network namespace: `/proc/net/tcp` gives its inode by its two
//! addresses, and a process holds it if one of its descriptors links to
//! `socket:[inode]`. The turn's processes are the runner's tree outside
//! its own process group (the agent, everything it started, the orphans
//! the runner adopted as their child subreaper); the turn starts only once
//! nothing of an earlier turn is left in that tree (`turn`'s leftover
//! sweep), so a process that outlived its turn cannot be among them. A
//! sidecar sharing the Pod's loopback, a `kubectl exec` shell or another
//! host process is not.
//!
//! Cost: one read of `/proc/net/tcp` per request, and per new connection a
//! `/proc` scan and a `readlink` per descriptor of the turn's processes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::process::tree::{self, Runner};

/// The inode of the client's socket of the IPv4 connection from `client`
/// to `server` (as the server sees them), from `/proc/net/tcp`. `None` if
/// no such socket is listed (the client closed it, or it is another
/// namespace's).
///
/// A dual-stack client (an `AF_INET6` socket connected to
/// `::ffff:127.0.0.1`, as the JVM makes by default) is listed in
/// `/proc/net/tcp6` with v4-mapped addresses: looked for there too.
pub fn client_socket(client: SocketAddr, server: SocketAddr) -> Option<u64> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|table| {
            let text = std::fs::read_to_string(table).ok()?;
            inode_in(&text, client, server)
        })
}

/// The inode of the line of `table` (`/proc/net/tcp`'s text) whose local
/// address is `local` and remote address `remote`.
fn inode_in(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (l, r, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
        (parse_addr(l)? == local && parse_addr(r)? == remote)
            .then(|| inode.parse().ok())
            .flatten()
    })
}

/// `0100007F:1F90` → `127.0.0.1:8080`: the kernel prints an IPv4 address
/// as one 32-bit value in host byte order, an IPv6 one as four, the port
/// as a number. A v4-mapped IPv6 address comes back as the IPv4 one.
fn parse_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = ip.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(bytes);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The pid of a process of the turn (the runner's tree outside its own
/// process group) that holds socket `inode`, if one does.
pub fn turn_process_holding(inode: u64, runner: Runner) -> Option<i32> {
    let link = format!("socket:[{inode}]");
    let procs = tree::scan();
    tree::turn_members(&procs, runner, &[])
        .into_iter()
        .filter(|p| !p.zombie)
        .map(|p| p.pid)
        .find(|pid| holds(*pid, &link))
}

/// Whether a descriptor of `pid` links to `link`.
fn holds(pid: i32, link: &str) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten()
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == link))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:A0F6 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0 100 0 0 10 0
   1: 0100007F:D431 0100007F:A0F6 01 00000000:00000000 00:00000000 00000000  1000        0 2222 1 0 20 4 30 10 -1
   2: 0100007F:A0F6 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3333 1 0 20 4 30 10 -1
";

    #[test]
    fn the_clients_end_is_found_by_both_addresses() {
        let server: SocketAddr = "127.0.0.1:41206".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:54321".parse().unwrap();
        assert_eq!(inode_in(TABLE, client, server), Some(2222));
        // The server's own end is the other line.
        assert_eq!(inode_in(TABLE, server, client), Some(3333));
        let elsewhere: SocketAddr = "127.0.0.1:54322".parse().unwrap();
        assert_eq!(inode_in(TABLE, elsewhere, server), None);
    }

    #[test]
    fn a_dual_stack_client_is_found_in_tcp6() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let mapped: SocketAddr = format!("[::ffff:127.0.0.1]:{}", server.port())
            .parse()
            .unwrap();
        let stream = match std::net::TcpStream::connect(mapped) {
            Ok(s) => s,
            Err(e) => {
                hosted_boot_test_support::skip(format!(
                    "no dual-stack socket to {mapped}: {e} (IPv6 with v4-mapped addresses)"
                ));
                return;
            }
        };
        let (_, client) = listener.accept().unwrap();
        assert!(stream.local_addr().unwrap().is_ipv6());
        assert!(client.is_ipv4(), "the server sees {client}");
        assert!(client_socket(client, server).is_some());
    }

    #[test]
    fn a_socket_of_this_process_is_found_and_its_own_tree_is_not_a_turn() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let stream = std::net::TcpStream::connect(server).unwrap();
        let client = stream.local_addr().unwrap();
        let inode = client_socket(client, server).expect("the client's socket is listed");
        assert!(holds(
            rustix::process::getpid().as_raw_nonzero().get(),
            &format!("socket:[{inode}]")
        ));
        // This process is the runner here: its own group is never a turn.
        assert_eq!(turn_process_holding(inode, Runner::current()), None);
    }
}
