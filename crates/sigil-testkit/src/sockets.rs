//! Where a process's TCP sockets point, read from `/proc`: the guard the
//! real tiers use to show that a server they started (kube-apiserver above
//! all) reached no address off this machine. It reads; it never blocks or
//! rewrites traffic. Linux only, like the machine CI runs on.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The remote ends of every TCP socket process `pid` holds open (listening
/// sockets, whose remote end is the unspecified address, included).
pub fn tcp_peers(pid: u32) -> Vec<SocketAddr> {
    let inodes: BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    ["tcp", "tcp6"]
        .iter()
        .map(|t| std::fs::read_to_string(format!("/proc/{pid}/net/{t}")).unwrap_or_default())
        .collect::<String>()
        .lines()
        .filter_map(parse_line)
        .filter(|(_, inode)| inodes.contains(inode))
        .map(|(peer, _)| peer)
        .collect()
}

/// Whether `addr` stays on this machine: loopback (127.0.0.0/8, ::1, a
/// v4-mapped loopback) or unspecified (a listener's remote end).
pub fn is_local(addr: &SocketAddr) -> bool {
    match addr.ip() {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified(),
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| v4.is_loopback() || v4.is_unspecified())
        }
    }
}

/// One row of `/proc/net/tcp{,6}`: (remote address, socket inode).
fn parse_line(line: &str) -> Option<(SocketAddr, u64)> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let (addr, port) = f.get(2)?.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(
            u32::from_str_radix(addr, 16).ok()?.swap_bytes(),
        )),
        32 => {
            // Four 32-bit words, each in the kernel's (little-endian) order.
            let mut octets = [0u8; 16];
            for (i, chunk) in octets.chunks_mut(4).enumerate() {
                let w = u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?;
                chunk.copy_from_slice(&w.swap_bytes().to_be_bytes());
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some((SocketAddr::new(ip, port), f.get(9)?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_rows() {
        let v4 = "   0: 0100007F:1F90 0A00000A:01BB 01 00000000:00000000 00:00000000 00000000     0        0 4242 1";
        assert_eq!(
            parse_line(v4),
            Some(("10.0.0.10:443".parse().unwrap(), 4242))
        );
        let v6 = "   1: 00000000000000000000000001000000:1F90 0000000000000000FFFF00000100007F:0050 01 00000000:00000000 00:00000000 00000000     0        0 7 1";
        let (peer, inode) = parse_line(v6).unwrap();
        assert_eq!(
            (peer.to_string().as_str(), inode),
            ("[::ffff:127.0.0.1]:80", 7)
        );
        assert!(is_local(&peer));
        assert!(!is_local(&"10.0.0.10:443".parse().unwrap()));
        assert!(parse_line("  sl  local_address rem_address   st").is_none());
    }

    #[test]
    fn sees_a_connection_this_process_made() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to = listener.local_addr().unwrap();
        let _c = std::net::TcpStream::connect(to).unwrap();
        let peers = tcp_peers(std::process::id());
        assert!(peers.contains(&to), "{peers:?}");
        assert!(peers.iter().all(is_local), "{peers:?}");
    }
}
