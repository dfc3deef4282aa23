package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// A KeyFunc returns the rate-limit key of a request: requests with the same
// key share one quota. An error makes the middleware answer with
// Options.ErrorHandler (by default 400 Bad Request) without calling the
// wrapped handler. A KeyFunc must be safe for concurrent use.
type KeyFunc func(r *http.Request) (string, error)

// ErrNoKey is wrapped by the errors of the provided key functions when the
// request does not carry what they key on (a missing header, an unparsable
// remote address).
var ErrNoKey = errors.New("httplimit: request has no rate-limit key")

// IPOptions configures ClientIP. The zero value keys on the connection's
// remote address and ignores every forwarded header.
type IPOptions struct {
	// TrustedProxies are the networks of the reverse proxies whose
	// forwarded header is believed. A forwarded header is read only when
	// the connection comes from one of them, and only its entries appended
	// by trusted proxies are followed: the client is the rightmost entry
	// that is not itself a trusted proxy. Anyone else's header is ignored,
	// since trusting it blindly would let any client pick its own key.
	// Addresses are compared unmapped: an IPv4 network may be given as
	// IPv4 (10.0.0.0/8) or IPv4-mapped IPv6 (::ffff:10.0.0.0/104), and
	// matches IPv4 peers either way.
	TrustedProxies []netip.Prefix
	// Header is the name of the forwarded header (a header field name, as
	// Header accepts), holding a comma-separated list of addresses, each
	// proxy appending the address it received the request from
	// (X-Forwarded-For, the default, or a single-address header such as
	// X-Real-IP). An entry may carry a port, and an IPv6 address may be in
	// brackets (see ForwardedClient). RFC 7239's Forwarded header, whose
	// entries are not bare addresses, is refused.
	Header string
	// IPv6Bits, if between 1 and 127, keys IPv6 clients on their /IPv6Bits
	// network instead of their full address (64 keys a client's whole
	// subnet, which one host usually controls). 0 keys full addresses.
	IPv6Bits int
}

// ClientIP returns a KeyFunc keying requests on the client's IP address:
// the connection's remote address (Request.RemoteAddr) or, when that is a
// trusted proxy, the client named by the forwarded header (see IPOptions).
// IPv4-mapped IPv6 addresses are keyed as IPv4. It returns an error for an
// invalid IPOptions.
func ClientIP(opts IPOptions) (KeyFunc, error) {
	if opts.IPv6Bits < 0 || opts.IPv6Bits > 127 {
		return nil, fmt.Errorf("httplimit: IPOptions.IPv6Bits is %d, want 0 (full address) to 127", opts.IPv6Bits)
	}
	trusted := make([]netip.Prefix, len(opts.TrustedProxies)) // the caller's slice stays as it is
	for i, p := range opts.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("httplimit: IPOptions.TrustedProxies[%d] is not a valid prefix", i)
		}
		trusted[i] = p.Masked()
	}
	header := opts.Header
	if header == "" {
		header = "X-Forwarded-For"
	}
	if !isToken(header) {
		return nil, fmt.Errorf("httplimit: IPOptions.Header is %q, want a header field name: %s", opts.Header, tokenChars)
	}
	header = http.CanonicalHeaderKey(header)
	if header == "Forwarded" {
		return nil, fmt.Errorf("httplimit: IPOptions.Header is %q, want a header of bare addresses such as X-Forwarded-For or X-Real-IP (the RFC 7239 Forwarded syntax is not parsed)", opts.Header)
	}
	k := &ipKeyer{trusted: trusted, header: header, v6bits: opts.IPv6Bits}
	return k.key, nil
}

// ParsePrefixes parses a comma-separated list of CIDR prefixes or single
// addresses (a single address is its own /32 or /128), for
// IPOptions.TrustedProxies. An empty string gives an empty list.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if strings.Contains(f, "/") {
			p, err := netip.ParsePrefix(f)
			if err != nil {
				return nil, fmt.Errorf("httplimit: trusted proxy %q: %w", f, err)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, fmt.Errorf("httplimit: trusted proxy %q: %w", f, err)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

type ipKeyer struct {
	trusted []netip.Prefix
	header  string
	v6bits  int
}

// isTrusted reports whether a (unmapped) lies in one of trusted. A prefix
// written as IPv4-mapped IPv6 (::ffff:10.0.0.0/104) holds the IPv4
// addresses it maps, since addresses are compared unmapped.
func isTrusted(trusted []netip.Prefix, a netip.Addr) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
		if a.Is4() && p.Addr().Is4In6() && p.Bits() >= 96 &&
			netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Contains(a) {
			return true
		}
	}
	return false
}

func (k *ipKeyer) key(r *http.Request) (string, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr // some servers and tests set a bare address
	}
	peer, err := netip.ParseAddr(host)
	if err != nil {
		return "", fmt.Errorf("%w: remote address %q is not an IP address", ErrNoKey, r.RemoteAddr)
	}
	dotted := peer.Is4() // ParseAddr accepts only canonical dotted quads
	peer = peer.Unmap().WithZone("")
	client := peer
	if len(k.trusted) > 0 && isTrusted(k.trusted, peer) {
		client = forwarded(r.Header[k.header], peer, k.trusted)
	}
	if client == peer && dotted {
		return host, nil // already canonical: no allocation
	}
	return k.format(client), nil
}

// ForwardedClient returns the client of a request that came from the
// address peer carrying the forwarded header lines (each a comma-separated
// list of addresses as in X-Forwarded-For: IPv4 with or without a port,
// "192.0.2.1" or "192.0.2.1:80"; IPv6 bare, in brackets or in brackets
// with a port, "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:80"), by
// ClientIP's rule: peer itself unless it is in trusted; otherwise the
// rightmost address that is not itself in trusted, walking the entries from
// the right past trusted proxies. An unparsable entry stops the walk at the
// last trusted address. The result is unmapped (an IPv4-mapped IPv6 address
// becomes IPv4) and has no zone. Other transports use it to key on the same
// client as ClientIP: package grpclimit reads the lines from gRPC metadata.
func ForwardedClient(peer netip.Addr, lines []string, trusted []netip.Prefix) netip.Addr {
	peer = peer.Unmap().WithZone("")
	if !isTrusted(trusted, peer) {
		return peer
	}
	return forwarded(lines, peer, trusted)
}

// forwarded walks the forwarded header from the right, past trusted
// proxies, and returns the first address that is not one: the client. An
// unparsable entry stops the walk at the last trusted address.
func forwarded(lines []string, peer netip.Addr, trusted []netip.Prefix) netip.Addr {
	client := peer
	for i := len(lines) - 1; i >= 0; i-- {
		s := lines[i]
		for s != "" {
			var f string
			if j := strings.LastIndexByte(s, ','); j >= 0 {
				f, s = s[j+1:], s[:j]
			} else {
				f, s = s, ""
			}
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			a, ok := parseForwarded(f)
			if !ok {
				return client
			}
			client = a
			if !isTrusted(trusted, a) {
				return client
			}
		}
	}
	return client
}

// parseForwarded parses one forwarded entry: an address, possibly with a
// port ("192.0.2.1", "192.0.2.1:80", "2001:db8::1", "[2001:db8::1]",
// "[2001:db8::1]:80"). Brackets hold an IPv6 address only, as in a URL.
func parseForwarded(f string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(f); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if len(f) > 2 && f[0] == '[' && f[len(f)-1] == ']' {
		a, err := netip.ParseAddr(f[1 : len(f)-1])
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(f); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	return netip.Addr{}, false
}

func (k *ipKeyer) format(a netip.Addr) string {
	if a.Is6() && k.v6bits > 0 {
		p, _ := a.Prefix(k.v6bits)
		return p.String()
	}
	return a.String()
}

// Header returns a KeyFunc keying requests on the value of the request
// header name (an API key, a tenant id; case-insensitive). A request
// without it, or with an empty value, gets an error wrapping ErrNoKey.
// Header returns an error if name is not a header field name (RFC 9110: a
// non-empty token of letters, digits and !#$%&'*+-.^_`|~), which no
// request could carry.
func Header(name string) (KeyFunc, error) {
	if !isToken(name) {
		return nil, fmt.Errorf("httplimit: Header(name=%q): want a header field name: %s", name, tokenChars)
	}
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		if v := r.Header[name]; len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", fmt.Errorf("%w: header %s is missing", ErrNoKey, name)
	}, nil
}

// tokenChars describes an RFC 9110 token, for error messages.
const tokenChars = "letters, digits and !#$%&'*+-.^_`|~"

// isToken reports whether s is an RFC 9110 token: a header field name.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// MethodPath returns a KeyFunc keying requests on their method and URL
// path ("GET /users/42"): one quota per resource, shared by all clients.
// Combine it with ClientIP for one quota per client and resource.
func MethodPath() KeyFunc {
	return func(r *http.Request) (string, error) {
		return r.Method + " " + r.URL.Path, nil
	}
}

// Pattern returns a KeyFunc keying requests on the http.ServeMux pattern
// that matched them (Request.Pattern, such as "GET /users/{id}"): one quota
// per route, whatever the path's variables. The pattern is only known once
// the mux has routed the request, so wrap the route's handler, not the
// mux; a request without a pattern gets an error wrapping ErrNoKey.
func Pattern() KeyFunc {
	return func(r *http.Request) (string, error) {
		if r.Pattern == "" {
			return "", fmt.Errorf("%w: request was not routed by a ServeMux pattern (wrap the route's handler, not the mux)", ErrNoKey)
		}
		return r.Pattern, nil
	}
}

// Combine returns a KeyFunc keying requests on the keys of all fns
// together (for example a client IP and a route). Each part is
// length-prefixed, so that no two different combinations give the same
// key whatever bytes the parts hold. The first error is returned.
func Combine(fns ...KeyFunc) KeyFunc {
	fns = append([]KeyFunc(nil), fns...)
	return func(r *http.Request) (string, error) {
		var buf [128]byte
		b := buf[:0]
		for _, fn := range fns {
			k, err := fn(r)
			if err != nil {
				return "", err
			}
			b = strconv.AppendInt(b, int64(len(k)), 10)
			b = append(b, ':')
			b = append(b, k...)
		}
		return string(b), nil
	}
}
