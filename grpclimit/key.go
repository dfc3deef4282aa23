package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/hybridlimit/hybridlimit/httplimit"
)

// A KeyFunc returns the rate-limit key of a call: calls with the same key
// share one quota. ctx is the call's context (peer.FromContext and
// metadata.FromIncomingContext read it) and method its full method name
// ("/package.Service/Method"). An error fails the call with
// Options.ErrorHandler (by default codes.InvalidArgument) without running
// its handler; so does an empty key (a *KeyError wrapping
// hybridlimit.ErrEmptyKey), rather than one quota shared by every such
// call. A KeyFunc must be safe for
// concurrent use.
type KeyFunc func(ctx context.Context, method string) (string, error)

// ErrNoKey is wrapped by the errors of the provided key functions when the
// call does not carry what they key on (a missing metadata value, a peer
// that is not an IP address). Or moves on to its next key function on
// such an error.
var ErrNoKey = errors.New("grpclimit: call has no rate-limit key")

// KeyError is the error passed to Options.ErrorHandler when the key
// function fails.
type KeyError struct{ Err error }

// Error returns the key function's error text.
func (e *KeyError) Error() string { return "grpclimit: rate-limit key: " + e.Err.Error() }

// Unwrap returns the key function's error.
func (e *KeyError) Unwrap() error { return e.Err }

// DefaultForwardedMetadata is IPOptions.Metadata's default.
const DefaultForwardedMetadata = "x-forwarded-for"

// IPOptions configures PeerIP. The zero value keys on the connection's
// peer address and ignores every forwarded metadata value.
type IPOptions struct {
	// TrustedProxies are the networks of the proxies (L7 load balancers,
	// Envoy) whose forwarded metadata is believed
	// (httplimit.ParsePrefixes parses a list). The forwarded metadata is
	// read only when the connection comes from one of them, and only its
	// entries appended by trusted proxies are followed: the client is the
	// rightmost entry that is not itself a trusted proxy. Anyone else's
	// metadata is ignored, since trusting it blindly would let any client
	// pick its own key.
	TrustedProxies []netip.Prefix
	// Metadata is the key of the forwarded metadata, holding a
	// comma-separated list of addresses, each proxy appending the address
	// it received the call from: default DefaultForwardedMetadata. An
	// entry may carry a port, and an IPv6 address may be in brackets (see
	// httplimit.ForwardedClient). Keys are case-insensitive. RFC 7239's
	// forwarded, whose entries are not bare addresses, is refused, as are
	// binary keys (ending in -bin) and the names Metadata refuses.
	Metadata string
	// IPv6Bits, if between 1 and 127, keys IPv6 clients on their
	// /IPv6Bits network instead of their full address (64 keys a client's
	// whole subnet, which one host usually controls). 0 keys full
	// addresses.
	IPv6Bits int
}

// PeerIP returns a KeyFunc keying calls on the client's IP address, without
// its port: the connection's peer address or, when that is a trusted proxy,
// the client named by the forwarded metadata, by httplimit.ClientIP's rule
// (see IPOptions and httplimit.ForwardedClient). IPv4-mapped IPv6 addresses
// are keyed as IPv4. A call whose peer is not an IP address (a Unix socket)
// gets an error wrapping ErrNoKey. PeerIP returns an error for an invalid
// IPOptions.
func PeerIP(opts IPOptions) (KeyFunc, error) {
	if opts.IPv6Bits < 0 || opts.IPv6Bits > 127 {
		return nil, fmt.Errorf("grpclimit: IPOptions.IPv6Bits is %d, want 0 (full address) to 127", opts.IPv6Bits)
	}
	trusted := make([]netip.Prefix, len(opts.TrustedProxies))
	for i, p := range opts.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("grpclimit: IPOptions.TrustedProxies[%d] is not a valid prefix", i)
		}
		trusted[i] = p.Masked()
	}
	name := strings.ToLower(opts.Metadata)
	if name == "" {
		name = DefaultForwardedMetadata
	}
	if why := keyProblem(name); why != "" {
		return nil, fmt.Errorf("grpclimit: IPOptions.Metadata is %q: %s; want %s", opts.Metadata, why, wantKey)
	}
	if name == "forwarded" {
		return nil, fmt.Errorf("grpclimit: IPOptions.Metadata is %q, want a key of bare addresses such as x-forwarded-for or x-real-ip (the RFC 7239 forwarded syntax is not parsed)", opts.Metadata)
	}
	if strings.HasSuffix(name, "-bin") {
		return nil, fmt.Errorf("grpclimit: IPOptions.Metadata is %q, want a text key (not ending in -bin)", opts.Metadata)
	}
	bits := opts.IPv6Bits
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", fmt.Errorf("%w: the call has no peer", ErrNoKey)
		}
		a, ok := ipOf(p.Addr)
		if !ok {
			return "", fmt.Errorf("%w: peer address %q is not an IP address", ErrNoKey, p.Addr.String())
		}
		if len(trusted) > 0 {
			a = httplimit.ForwardedClient(a, metadata.ValueFromIncomingContext(ctx, name), trusted)
		}
		if a.Is6() && bits > 0 {
			p, _ := a.Prefix(bits)
			return p.String(), nil
		}
		return a.String(), nil
	}, nil
}

// ipOf returns the IP address of a peer, unmapped and without zone.
func ipOf(addr net.Addr) (netip.Addr, bool) {
	var a netip.Addr
	switch t := addr.(type) {
	case *net.TCPAddr:
		a = t.AddrPort().Addr()
	default:
		if ap, err := netip.ParseAddrPort(addr.String()); err == nil {
			a = ap.Addr()
		} else if b, err := netip.ParseAddr(addr.String()); err == nil {
			a = b
		}
	}
	return a.Unmap().WithZone(""), a.IsValid()
}

// Metadata returns a KeyFunc keying calls on the first value of the request
// metadata name (case-insensitive): an API key, a tenant id. A call without
// it, or with an empty value, gets an error wrapping ErrNoKey, which fails
// the call (codes.InvalidArgument by default); to key such calls on
// something else instead, use Or:
//
//	apiKey, err := grpclimit.Metadata("x-api-key")
//	if err != nil { ... }
//	// API key, or the peer's IP for anonymous calls:
//	grpclimit.Or(apiKey, peerIP)
//	// API key, or one quota shared by all anonymous calls:
//	grpclimit.Or(apiKey, func(context.Context, string) (string, error) {
//		return "anonymous", nil
//	})
//
// Metadata returns an error naming what is wrong if name is not a key
// whose client value reaches a server handler: a metadata key is one or
// more letters, digits, '-', '_' and '.', or ":authority", the one
// pseudo-header gRPC passes on as metadata. Refused too are the names
// beginning with "grpc-", which gRPC reserves for itself (a server drops
// grpc-timeout, grpc-encoding, grpc-status, grpc-message and
// grpc-message-type from a call's metadata, and the others it passes on,
// such as grpc-accept-encoding and grpc-trace-bin, are set by gRPC for each
// call, not by the application); "te", which gRPC drops; "host", which a
// server passes on as ":authority"; "connection", whose calls a server
// resets before any handler runs; and "content-type", which gRPC sets to
// application/grpc whatever the client asks. "user-agent" is accepted: its
// value is the client's own agent (grpc.WithUserAgent) followed by gRPC's
// ("app/1.0 grpc-go/1.85.0").
func Metadata(name string) (KeyFunc, error) {
	key := strings.ToLower(name)
	if why := keyProblem(key); why != "" && key != ":authority" {
		return nil, fmt.Errorf("grpclimit: Metadata(name=%q): %s; want %s, or :authority", name, why, wantKey)
	}
	return func(ctx context.Context, _ string) (string, error) {
		if v := metadata.ValueFromIncomingContext(ctx, key); len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", fmt.Errorf("%w: metadata %q is missing", ErrNoKey, key)
	}, nil
}

// wantKey is what the errors of Metadata and PeerIP ask for.
const wantKey = "a metadata key of letters, digits, '-', '_' and '.' (upper case is read as lower case) not beginning with grpc-"

// keyProblem returns why s, in lower case, cannot be the key of metadata a
// client sends to a server handler, or "" if it can. A pseudo-header
// (":authority" included) is refused: the callers accept :authority
// themselves where it makes sense.
func keyProblem(s string) string {
	switch {
	case s == "":
		return "it is empty"
	case s[0] == ':':
		return "gRPC passes on no pseudo-header but :authority"
	case strings.HasPrefix(s, "grpc-"):
		return "names beginning with grpc- are reserved by gRPC, which drops some from a call's metadata and sets the others itself"
	case s == "te":
		return "gRPC drops te from a call's metadata"
	case s == "host":
		return "gRPC servers pass host on as :authority (key on :authority)"
	case s == "connection":
		return "gRPC servers reset a call that carries connection"
	case s == "content-type":
		return "gRPC sets content-type itself (application/grpc), alike for every call"
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			r, _ := utf8.DecodeRuneInString(s[i:])
			return fmt.Sprintf("%q (byte %d) is not allowed in a metadata key", r, i)
		}
	}
	return ""
}

// FullMethod returns a KeyFunc keying calls on their full method name
// ("/package.Service/Method"): one quota per method, shared by all
// clients. Combine it with PeerIP or Metadata for one quota per client and
// method.
func FullMethod() KeyFunc {
	return func(_ context.Context, method string) (string, error) {
		if method == "" {
			return "", fmt.Errorf("%w: the call has no method name", ErrNoKey)
		}
		return method, nil
	}
}

// Combine returns a KeyFunc keying calls on the keys of all fns together
// (for example a method and a peer IP). Each part is length-prefixed, so
// that no two different combinations give the same key whatever bytes the
// parts hold. The first error is returned; an empty part is an error
// wrapping ErrNoKey.
func Combine(fns ...KeyFunc) KeyFunc {
	fns = append([]KeyFunc(nil), fns...)
	return func(ctx context.Context, method string) (string, error) {
		var buf [128]byte
		b := buf[:0]
		for i, fn := range fns {
			k, err := fn(ctx, method)
			if err != nil {
				return "", err
			}
			if k == "" {
				return "", fmt.Errorf("%w: part %d of a combined key is empty", ErrNoKey, i)
			}
			b = strconv.AppendInt(b, int64(len(k)), 10)
			b = append(b, ':')
			b = append(b, k...)
		}
		if len(b) == 0 {
			return "", fmt.Errorf("%w: Combine of no key functions", ErrNoKey)
		}
		return string(b), nil
	}
}

// Or returns a KeyFunc keying calls on the first of fns that yields a key:
// it moves on to the next one when a function returns an error wrapping
// ErrNoKey or an empty key, and fails at once on any other error. When
// none yields a key, the last error is returned. The key is prefixed with
// the index of the function that gave it ("1:203.0.113.9"), so that a
// client cannot reach another alternative's quota (sending an API key equal
// to someone's IP address, say).
func Or(fns ...KeyFunc) KeyFunc {
	fns = append([]KeyFunc(nil), fns...)
	return func(ctx context.Context, method string) (string, error) {
		err := fmt.Errorf("%w: Or of no key functions", ErrNoKey)
		for i, fn := range fns {
			k, e := fn(ctx, method)
			switch {
			case e != nil && !errors.Is(e, ErrNoKey):
				return "", e
			case e != nil:
				err = e
			case k == "":
				err = fmt.Errorf("%w: key function %d returned an empty key", ErrNoKey, i)
			default:
				return strconv.Itoa(i) + ":" + k, nil
			}
		}
		return "", err
	}
}
