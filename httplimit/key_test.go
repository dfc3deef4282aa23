package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
)

func TestClientIP(t *testing.T) {
	trusted, err := httplimit.ParsePrefixes("10.0.0.0/8, 2001:db8:ffff::/48, 192.0.2.254")
	require.NoError(t, err)
	// 10.0.0.0/8 written as IPv4-mapped IPv6 (::ffff:10.0.0.0/104), as
	// dual-stack listeners report IPv4 peers.
	mapped, err := httplimit.ParsePrefixes("::ffff:10.0.0.0/104")
	require.NoError(t, err)
	cases := []struct {
		name    string
		opts    httplimit.IPOptions
		remote  string
		xff     []string
		realIP  string
		want    string
		wantErr bool
	}{
		{name: "remote v4", remote: "192.0.2.1:1234", want: "192.0.2.1"},
		{name: "remote v6", remote: "[2001:DB8::0:1]:80", want: "2001:db8::1"},
		{name: "remote v6 zone", remote: "[fe80::1%eth0]:80", want: "fe80::1"},
		{name: "remote mapped", remote: "[::ffff:192.0.2.1]:80", want: "192.0.2.1"},
		{name: "remote bare", remote: "192.0.2.1", want: "192.0.2.1"},
		{name: "remote garbage", remote: "pipe", wantErr: true},
		{name: "no trust: xff ignored", remote: "192.0.2.1:1", xff: []string{"203.0.113.9"}, want: "192.0.2.1"},
		{name: "spoof from untrusted peer ignored", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "198.51.100.7:1", xff: []string{"203.0.113.9"}, want: "198.51.100.7"},
		{name: "trusted proxy", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "10.1.2.3:1", xff: []string{"203.0.113.9"}, want: "203.0.113.9"},
		{name: "spoofed left part skipped", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "10.1.2.3:1", xff: []string{"1.1.1.1, 203.0.113.9"}, want: "203.0.113.9"},
		{name: "chain of trusted proxies", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "10.1.2.3:1", xff: []string{"6.6.6.6, 203.0.113.9, 192.0.2.254 , 10.9.9.9"}, want: "203.0.113.9"},
		{name: "several header lines", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "10.1.2.3:1", xff: []string{"6.6.6.6, 203.0.113.9", "10.0.0.1"}, want: "203.0.113.9"},
		{name: "all trusted", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "10.1.2.3:1", xff: []string{"10.0.0.2,10.0.0.1"}, want: "10.0.0.2"},
		{name: "garbage stops at last trusted", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "10.1.2.3:1", xff: []string{"203.0.113.9, bogus, 10.0.0.1"}, want: "10.0.0.1"},
		{name: "entry with port", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "10.1.2.3:1", xff: []string{"[2001:db8::7]:443"}, want: "2001:db8::7"},
		{name: "entry in brackets", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "10.1.2.3:1", xff: []string{"6.6.6.6, [2001:db8::7], 10.0.0.1"}, want: "2001:db8::7"},
		{name: "x-real-ip in brackets", opts: httplimit.IPOptions{TrustedProxies: trusted, Header: "X-Real-IP"},
			remote: "10.1.2.3:1", realIP: "[2001:db8::8]", want: "2001:db8::8"},
		{name: "empty header from trusted", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "10.1.2.3:1", want: "10.1.2.3"},
		{name: "trusted v6 proxy", opts: httplimit.IPOptions{TrustedProxies: trusted},
			remote: "[2001:db8:ffff::1]:1", xff: []string{"::ffff:203.0.113.9"}, want: "203.0.113.9"},
		{name: "x-real-ip", opts: httplimit.IPOptions{TrustedProxies: trusted, Header: "x-real-ip"},
			remote: "10.1.2.3:1", xff: []string{"6.6.6.6"}, realIP: "203.0.113.9", want: "203.0.113.9"},
		{name: "trusted as mapped prefix", opts: httplimit.IPOptions{TrustedProxies: mapped},
			remote: "10.1.2.3:1", xff: []string{"203.0.113.9"}, want: "203.0.113.9"},
		{name: "trusted as mapped prefix, mapped peer", opts: httplimit.IPOptions{TrustedProxies: mapped},
			remote: "[::ffff:10.1.2.3]:1", xff: []string{"203.0.113.9"}, want: "203.0.113.9"},
		{name: "mapped prefix, peer outside", opts: httplimit.IPOptions{TrustedProxies: mapped},
			remote: "11.1.2.3:1", xff: []string{"203.0.113.9"}, want: "11.1.2.3"},
		{name: "trusted as mapped address", opts: httplimit.IPOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.1.2.3/128")}},
			remote: "10.1.2.3:1", xff: []string{"203.0.113.9"}, want: "203.0.113.9"},
		{name: "ipv6 /64", opts: httplimit.IPOptions{IPv6Bits: 64},
			remote: "[2001:db8:1:2:3:4:5:6]:1", want: "2001:db8:1:2::/64"},
		{name: "ipv6 bits leave v4 alone", opts: httplimit.IPOptions{IPv6Bits: 64},
			remote: "192.0.2.1:1", want: "192.0.2.1"},
	}
	for _, c := range cases {
		key, err := httplimit.ClientIP(c.opts)
		require.NoError(t, err, c.name)
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.remote
		for _, v := range c.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		if c.realIP != "" {
			r.Header.Set("X-Real-IP", c.realIP)
		}
		got, err := key(r)
		if c.wantErr {
			assert.ErrorIs(t, err, httplimit.ErrNoKey, c.name)
			continue
		}
		assert.NoError(t, err, c.name)
		assert.Equal(t, c.want, got, c.name)
	}
}

func TestClientIPErrors(t *testing.T) {
	_, err := httplimit.ClientIP(httplimit.IPOptions{IPv6Bits: 128})
	assert.EqualError(t, err, "httplimit: IPOptions.IPv6Bits is 128, want 0 (full address) to 127")
	_, err = httplimit.ClientIP(httplimit.IPOptions{TrustedProxies: []netip.Prefix{{}}})
	assert.EqualError(t, err, "httplimit: IPOptions.TrustedProxies[0] is not a valid prefix")
	// RFC 7239's Forwarded ("for=192.0.2.60;proto=http") is no list of
	// addresses: every client behind the proxy would share its key.
	_, err = httplimit.ClientIP(httplimit.IPOptions{Header: "forwarded"})
	assert.EqualError(t, err, `httplimit: IPOptions.Header is "forwarded", want a header of bare addresses such as X-Forwarded-For or X-Real-IP (the RFC 7239 Forwarded syntax is not parsed)`)
	for _, h := range []string{"X Forwarded For", "X-Forwarded-For:", "x-forwarded-for\r\n", "\x00", "ключ"} {
		_, err = httplimit.ClientIP(httplimit.IPOptions{Header: h})
		assert.EqualError(t, err, fmt.Sprintf("httplimit: IPOptions.Header is %q, want a header field name: letters, digits and !#$%%&'*+-.^_`|~", h))
	}
	_, err = httplimit.ParsePrefixes("10.0.0.0/8,nope")
	assert.ErrorContains(t, err, `trusted proxy "nope"`)
	_, err = httplimit.ParsePrefixes("10.0.0.0/33")
	assert.ErrorContains(t, err, `trusted proxy "10.0.0.0/33"`)
	p, err := httplimit.ParsePrefixes("")
	assert.NoError(t, err)
	assert.Empty(t, p)
}

// TestSpoofedForwardedFor: a client that is not a trusted proxy cannot
// escape its quota by sending a different X-Forwarded-For each time.
func TestSpoofedForwardedFor(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 2, Window: time.Minute})
	trusted, _ := httplimit.ParsePrefixes("10.0.0.0/8")
	key, err := httplimit.ClientIP(httplimit.IPOptions{TrustedProxies: trusted})
	require.NoError(t, err)
	h := mustNew(t, l, key, httplimit.Options{}).Wrap(ok)
	codes := []int{}
	for _, spoof := range []string{"1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"} {
		codes = append(codes, do(h, "198.51.100.7:5555", "X-Forwarded-For", spoof).Code)
	}
	assert.Equal(t, []int{200, 200, 429, 429}, codes)
	// Behind the trusted proxy, each forwarded client has its own quota.
	codes = codes[:0]
	for _, client := range []string{"1.1.1.1", "2.2.2.2", "1.1.1.1", "1.1.1.1"} {
		codes = append(codes, do(h, "10.0.0.1:5555", "X-Forwarded-For", client).Code)
	}
	assert.Equal(t, []int{200, 200, 200, 429}, codes)
}

func TestOtherKeys(t *testing.T) {
	r := httptest.NewRequest("POST", "/users/42?x=1", nil)
	r.Header.Set("X-Api-Key", "secret")
	r.RemoteAddr = "192.0.2.1:1"

	k, err := httplimit.MethodPath()(r)
	assert.NoError(t, err)
	assert.Equal(t, "POST /users/42", k)

	k, err = header(t, "x-api-key")(r)
	assert.NoError(t, err)
	assert.Equal(t, "secret", k)

	_, err = httplimit.Pattern()(r)
	assert.ErrorIs(t, err, httplimit.ErrNoKey)
	r.Pattern = "POST /users/{id}"
	k, err = httplimit.Pattern()(r)
	assert.NoError(t, err)
	assert.Equal(t, "POST /users/{id}", k)

	ip := remoteIP(t)
	k, err = httplimit.Combine(ip, httplimit.MethodPath())(r)
	assert.NoError(t, err)
	assert.Equal(t, "9:192.0.2.114:POST /users/42", k)

	_, err = httplimit.Combine(ip, header(t, "X-Missing"))(r)
	assert.ErrorIs(t, err, httplimit.ErrNoKey)

	// Parts cannot run into each other.
	a := httplimit.Combine(header(t, "A"), header(t, "B"))
	r1 := httptest.NewRequest("GET", "/", nil)
	r1.Header.Set("A", "x:y")
	r1.Header.Set("B", "z")
	r2 := httptest.NewRequest("GET", "/", nil)
	r2.Header.Set("A", "x")
	r2.Header.Set("B", "y:z")
	k1, _ := a(r1)
	k2, _ := a(r2)
	assert.NotEqual(t, k1, k2)
}

// TestPatternKey: wrapping a route's handler, the key is the mux pattern,
// so every path of the route shares one quota.
func TestPatternKey(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 2, Window: time.Minute})
	m := mustNew(t, l, httplimit.Pattern(), httplimit.Options{})
	mux := testMux(m)
	codes := []int{}
	for _, p := range []string{"/users/1", "/users/2", "/users/3", "/other"} {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", p, nil))
		codes = append(codes, w.Code)
	}
	assert.Equal(t, []int{200, 200, 429, 200}, codes)
}

func testMux(m *httplimit.Middleware) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /users/{id}", m.Wrap(ok))
	mux.Handle("GET /other", m.Wrap(ok))
	return mux
}

// ClientIP reads IPOptions.TrustedProxies and leaves the caller's slice as
// it was: a prefix with host bits set is masked in ClientIP's own copy.
func TestClientIPLeavesOptionsAlone(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.1.2.3/8"), netip.MustParsePrefix("2001:db8::1/32")}
	before := append([]netip.Prefix(nil), trusted...)
	k, err := httplimit.ClientIP(httplimit.IPOptions{TrustedProxies: trusted})
	require.NoError(t, err)
	assert.Equal(t, before, trusted)
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.200.0.1:1"
	r.Header.Set("X-Forwarded-For", "203.0.113.9")
	key, err := k(r)
	require.NoError(t, err)
	assert.Equal(t, "203.0.113.9", key, "the masked prefix is trusted")
}

// TestForwardedEntries parses single forwarded entries, well-formed and
// hostile, behind a trusted proxy: a parsed entry is the client; an
// unparsable one stops the walk at the proxy.
func TestForwardedEntries(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	proxy := netip.MustParseAddr("10.0.0.1")
	long := strings.Repeat("1", 100_000)
	for _, c := range []struct {
		entry string
		want  string // the client; "proxy" when the entry is refused
	}{
		{"192.0.2.1", "192.0.2.1"},
		{"192.0.2.1:8080", "192.0.2.1"},
		{"2001:db8::1", "2001:db8::1"},
		{"2001:DB8::0:1", "2001:db8::1"},
		{"[2001:db8::1]", "2001:db8::1"},
		{" [2001:db8::1] ", "2001:db8::1"},
		{"[2001:db8::1]:443", "2001:db8::1"},
		{"[2001:db8::1]:0", "2001:db8::1"},
		{"fe80::1%eth0", "fe80::1"},
		{"[fe80::1%eth0]", "fe80::1"},
		{"[fe80::1%eth0]:80", "fe80::1"},
		{"::ffff:192.0.2.1", "192.0.2.1"},
		{"[::ffff:192.0.2.1]", "192.0.2.1"},
		{"[::ffff:192.0.2.1]:80", "192.0.2.1"},
		{"[::1]", "::1"},
		{"[", "proxy"},
		{"]", "proxy"},
		{"[]", "proxy"},
		{"[]:80", "proxy"},
		{"[[]]", "proxy"},
		{"[::1", "proxy"},
		{"::1]", "proxy"},
		{"[::1]x", "proxy"},
		{"[::1]:", "proxy"},
		{"[::1]:x", "proxy"},
		{"[::1]:65536", "proxy"},
		{"[[::1]]", "proxy"},
		{"[ ::1]", "proxy"},
		{"[fe80::1%]", "proxy"},
		{"[192.0.2.1]", "proxy"},
		{"[192.0.2.1]:80", "proxy"},
		{"192.0.2.1:", "proxy"},
		{"192.0.2.1:80:80", "proxy"},
		{"[" + long + "]", "proxy"},
		{"[::1]:" + long, "proxy"},
		{"[" + strings.Repeat("0:", 50_000) + ":1]", "proxy"},
		{long, "proxy"},
	} {
		name := c.entry
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		want := c.want
		if want == "proxy" {
			want = proxy.String()
		}
		got := httplimit.ForwardedClient(proxy, []string{c.entry}, trusted)
		assert.Equal(t, want, got.String(), "entry %q", name)
		// The same entry to the right of a client: a refused entry stops
		// the walk there, a parsed one is the client.
		got = httplimit.ForwardedClient(proxy, []string{"203.0.113.9, " + c.entry}, trusted)
		assert.Equal(t, want, got.String(), "entry %q after a client", name)
	}
}

// TestHeaderName: Header refuses a name no request could carry (empty, or
// not an RFC 9110 token) when it is called, with an error naming the
// argument, instead of a key function that fails every request.
func TestHeaderName(t *testing.T) {
	for _, name := range []string{"", " ", "X API Key", "X-Key:", "X-Key\r\nX-Other", "(key)", "ключ", "\x7f", "\xff"} {
		k, err := httplimit.Header(name)
		assert.EqualError(t, err, fmt.Sprintf("httplimit: Header(name=%q): want a header field name: letters, digits and !#$%%&'*+-.^_`|~", name))
		assert.Nil(t, k, "name %q", name)
	}
	for _, name := range []string{"X-API-Key", "x-api-key", "X_Key", "k", "a1!#$%&'*+-.^_`|~"} {
		k, err := httplimit.Header(name)
		require.NoError(t, err, "name %q", name)
		r := httptest.NewRequest("GET", "/", nil)
		r.Header[http.CanonicalHeaderKey(name)] = []string{"v"}
		got, err := k(r)
		assert.NoError(t, err, "name %q", name)
		assert.Equal(t, "v", got, "name %q", name)
	}
}
