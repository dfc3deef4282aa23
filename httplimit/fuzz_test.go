package httplimit_test

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/hybridlimit/hybridlimit/httplimit"
)

// FuzzClientIP feeds ClientIP arbitrary remote addresses, forwarded
// header lines and trusted-proxy lists, and checks what a client must not
// be able to do with them: a request from a peer that is not a trusted
// proxy is keyed on the peer whatever its headers say; every key is a
// canonical address (or, with IPv6Bits, a canonical prefix) that is either
// the peer or an entry of the forwarded header; nothing panics. Its seeds
// run with the normal tests; to fuzz:
//
//	go test -run '^$' -fuzz FuzzClientIP -fuzztime 60s ./httplimit/
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:443", "203.0.113.7, 10.0.0.2", "", "10.0.0.0/8", 0)
	f.Add("192.0.2.1:80", "1.2.3.4", "5.6.7.8", "", 0)
	f.Add("[2001:db8::1]:80", "2001:db8:1::5, [2001:db8::2]:80", "", "2001:db8::/48", 64)
	f.Add("[2001:db8::1]:80", "[2001:db8:1::5], [::1]:, [", "[2001:db8::3]", "2001:db8::/48", 0)
	f.Add("[::ffff:10.0.0.1]:1", "::ffff:198.51.100.1", "", "10.0.0.0/8", 0)
	f.Add("10.1.2.3", "garbage, 10.9.9.9", "", "10.0.0.0/8", 0)
	f.Add("[fe80::1%eth0]:80", "fe80::2%eth1", "", "fe80::/10", 127)
	f.Add("not an address", "1.1.1.1", "", "0.0.0.0/0", 0)
	f.Fuzz(func(t *testing.T, remote, line1, line2, trustedList string, v6bits int) {
		trusted, err := httplimit.ParsePrefixes(trustedList)
		if err != nil {
			return
		}
		key, err := httplimit.ClientIP(httplimit.IPOptions{TrustedProxies: trusted, IPv6Bits: v6bits})
		if err != nil {
			if v6bits >= 0 && v6bits <= 127 {
				t.Fatalf("ClientIP refused IPv6Bits %d: %v", v6bits, err)
			}
			return
		}
		bare := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		withHeader := &http.Request{RemoteAddr: remote, Header: http.Header{"X-Forwarded-For": {line1, line2}}}
		k0, err0 := key(bare)
		k1, err1 := key(withHeader)
		if (err0 == nil) != (err1 == nil) {
			t.Fatalf("the header changed whether there is a key: %v, %v", err0, err1)
		}
		if err0 != nil {
			return
		}
		for _, k := range []string{k0, k1} {
			if k == "" {
				t.Fatal("empty key")
			}
			if strings.Contains(k, "/") {
				p, err := netip.ParsePrefix(k)
				if err != nil || p.String() != k || !p.Addr().Is6() {
					t.Fatalf("key %q is not a canonical IPv6 prefix", k)
				}
				continue
			}
			a, err := netip.ParseAddr(k)
			if err != nil || a.String() != k || a.Zone() != "" || a.Is4In6() {
				t.Fatalf("key %q is not a canonical unzoned address", k)
			}
		}
		peer := peerOf(remote)
		trustedPeer := false
		for _, p := range trusted {
			trustedPeer = trustedPeer || p.Contains(peer)
		}
		if !trustedPeer && k1 != k0 {
			t.Fatalf("an untrusted peer %q chose its key with its header: %q, not %q", remote, k1, k0)
		}
		if k1 != k0 && !inHeader(k1, line1, line2, v6bits) {
			t.Fatalf("key %q is neither the peer's (%q) nor in the header", k1, k0)
		}
	})
}

// peerOf parses a RemoteAddr as ClientIP does: host and port, or a bare
// address.
func peerOf(remote string) netip.Addr {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, _ := netip.ParseAddr(host)
	return a.Unmap().WithZone("")
}

// inHeader reports whether key is the address, or the IPv6 prefix of
// bits, of one of the lines' entries.
func inHeader(key, line1, line2 string, bits int) bool {
	for _, f := range strings.Split(line1+","+line2, ",") {
		f = strings.TrimSpace(f)
		a, err := netip.ParseAddr(f)
		if err != nil && strings.HasPrefix(f, "[") && strings.HasSuffix(f, "]") {
			a, err = netip.ParseAddr(f[1 : len(f)-1])
		}
		if err != nil {
			ap, err := netip.ParseAddrPort(f)
			if err != nil {
				continue
			}
			a = ap.Addr()
		}
		a = a.Unmap().WithZone("")
		if a.String() == key {
			return true
		}
		if p, err := a.Prefix(bits); err == nil && a.Is6() && p.String() == key {
			return true
		}
	}
	return false
}
