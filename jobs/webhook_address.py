"""Where a webhook may be sent: public addresses only, decided on the addresses DNS gives.

A job's submitter names its webhook URL, and the workers POST to it from inside the fleet's network,
so an unchecked URL lets a submitter reach what only the fleet can reach: the instance metadata
service (169.254.169.254, fd00:ec2::254), Redis on 127.0.0.1:6379, a VPC's private hosts. A
destination is refused unless every address its host resolves to is global unicast (Python's
`ipaddress` `is_global`: not loopback, private, link-local, shared 100.64/10, reserved, unspecified
or multicast; an IPv4-mapped or NAT64 IPv6 address is judged by its IPv4 address).

The check runs at submit (`check_webhook_url`: a refused URL is a one-line error, nothing written)
and again at every send (`resolve_webhook`), whose answer is the address the sender connects to:
the host is resolved once per try and the connection goes to the address that was checked, so a
name that answers a public address at the check and a private one at the connect (DNS rebinding)
reaches nothing. FREIGHT_NOTIFY_ALLOW (addresses or CIDR networks, comma separated) opts addresses
in: an on-prem receiver at 10.2.3.4, or 127.0.0.1 for tests.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host, port) -> the addresses it resolves to, as text (socket.getaddrinfo's shape, reduced)
Resolver = Callable[[str, int], Sequence[str]]

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class WebhookAddressError(ValueError):
    """A webhook URL whose host is unusable or resolves to an address that may not be reached."""


def parse_allow(text: str) -> tuple[IPNetwork, ...]:
    """FREIGHT_NOTIFY_ALLOW's networks: "10.2.3.4, 192.168.0.0/16, ::1" (a bare address is /32 or
    /128); ValueError naming the entry that is neither."""
    networks = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an IP address or CIDR network (e.g. 10.0.0.0/8)") from None
    return tuple(networks)


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (IPv4 and IPv6), by the system's resolver."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _judged(address: IPAddress) -> IPAddress:
    """The address whose kind decides: an IPv4-mapped (::ffff:a.b.c.d) or NAT64 (64:ff9b::a.b.c.d)
    IPv6 address reaches that IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def refusal(address: str, allow: Iterable[IPNetwork]) -> str | None:
    """What kind of address `address` is when it may not be reached ("a loopback address"); None
    when it may: global unicast, or in `allow`."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # fe80::1%eth0: the zone goes
    except ValueError:
        return "not an IP address"
    if any(ip in net or _judged(ip) in net for net in allow):
        return None
    judged = _judged(ip)
    if judged.is_global and not judged.is_multicast:
        return None
    kind = (
        "loopback" if judged.is_loopback
        else "link-local" if judged.is_link_local
        else "multicast" if judged.is_multicast
        else "unspecified" if judged.is_unspecified
        else "private"
    )  # fmt: skip
    return f"a {kind} address" + (" (where instance metadata lives)" if kind == "link-local" else "")


@dataclass(frozen=True)
class WebhookDestination:
    """Where one try connects: the URL's parts and the checked address to connect to."""

    url: SplitResult
    host: str
    port: int
    address: str


def _parts(url: str) -> tuple[SplitResult, str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookAddressError(f"webhook URL is malformed: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise WebhookAddressError("webhook URL needs http:// or https:// and a host")
    return parts, parts.hostname, port or (443 if parts.scheme.lower() == "https" else 80)


def resolve_webhook(url: str, allow: Iterable[IPNetwork], resolver: Resolver = system_resolver) -> WebhookDestination:
    """The address one try of `url` connects to: the host resolved now, every address it gives
    checked (one refused address refuses the URL: a resolver may answer either); WebhookAddressError
    (one line) when the host does not resolve or an address may not be reached."""
    parts, host, port = _parts(url)
    allow = tuple(allow)
    try:
        addresses = list(resolver(host, port))
    except (OSError, UnicodeError) as exc:
        raise WebhookAddressError(f"webhook host {host!r} does not resolve: {exc}") from None
    if not addresses:
        raise WebhookAddressError(f"webhook host {host!r} resolves to no address")
    for address in addresses:
        why = refusal(address, allow)
        if why is not None:
            shown = f"{host} is" if host == address else f"{host} resolves to {address},"
            raise WebhookAddressError(
                f"webhook host {shown} {why}: freight sends only to public addresses; add the "
                "address or its network to FREIGHT_NOTIFY_ALLOW (comma separated) to send to it"
            )
    return WebhookDestination(parts, host, port, addresses[0])


def check_webhook_url(url: str, allow: Iterable[IPNetwork], resolver: Resolver = system_resolver) -> None:
    """Submit's check of a webhook URL (see the module docstring); WebhookAddressError when refused."""
    resolve_webhook(url, allow, resolver)
