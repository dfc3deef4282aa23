package httplimit_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
)

// TestPolicy checks the exported formatter of the draft fields: default and
// custom names, the RateLimit-Policy value, RateLimit items with and
// without the cap, skipped foreign rules, and errors naming names[i].
func TestPolicy(t *testing.T) {
	rules := []hybridlimit.Rule{{Limit: 10, Window: time.Second}, {Limit: 300, Window: time.Minute}, {Limit: 5, Window: 250 * time.Millisecond}}
	p, err := httplimit.NewPolicy(rules, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"1s", "1m", "250ms"}, p.Names())
	assert.Equal(t, `"1s";q=10;w=1, "1m";q=300;w=60, "250ms";q=5;w=1`, p.Field())
	items, err := parseSFList(p.Field())
	require.NoError(t, err)
	assert.Len(t, items, 3)

	states := []hybridlimit.RuleState{
		{Rule: 0, Remaining: 9, ResetAfter: 1500 * time.Millisecond},
		{Rule: 1, Remaining: -2, ResetAfter: 59 * time.Second},
		{Rule: 7, Remaining: 1, ResetAfter: time.Second}, // not a rule of p: skipped
		{Rule: 2, Remaining: 4, ResetAfter: 0},
	}
	buf := []byte("x: ")
	assert.Equal(t, `x: "1s";r=9;t=2, "1m";r=0;t=59, "250ms";r=4;t=0`, string(p.AppendRateLimit(buf, states, 0)))
	assert.Equal(t, `"1s";r=9;t=2, "1m";r=0;t=3, "250ms";r=4;t=0`, string(p.AppendRateLimit(nil, states, 3)))
	assert.Equal(t, `"1m";r=0;t=59`, string(p.AppendRateLimit(nil, states[1:3], 0)))
	assert.Empty(t, p.AppendRateLimit(nil, nil, 0))

	p, err = httplimit.NewPolicy(rules[:2], []string{`a"b`, "c"})
	require.NoError(t, err)
	assert.Equal(t, `"a\"b";q=10;w=1, "c";q=300;w=60`, p.Field())
	names := p.Names()
	names[0] = "changed"
	assert.Equal(t, []string{`a"b`, "c"}, p.Names(), "Names returns a copy")

	for _, c := range []struct {
		rules []hybridlimit.Rule
		names []string
		want  string
	}{
		{nil, nil, "httplimit: NewPolicy: no rules"},
		{rules, []string{"a"}, "httplimit: NewPolicy: names has 1 names, want one per rule: 3"},
		{rules[:2], []string{"a", ""}, "httplimit: NewPolicy: names[1] is empty"},
		{rules[:2], []string{"a", "\n"}, `httplimit: NewPolicy: names[1] is "\n": byte 0xa at 0 is not printable ASCII; want printable ASCII`},
		{rules[:2], []string{"a", "a"}, `httplimit: NewPolicy: names: policy name "a" of rule 1 repeats rule 0's`},
	} {
		_, err := httplimit.NewPolicy(c.rules, c.names)
		assert.EqualError(t, err, c.want)
	}
}

// TestForwardedClient checks the exported rule of ClientIP on addresses:
// untrusted peers are their own client whatever they forward, and a trusted
// peer's lines are walked from the right past trusted proxies.
func TestForwardedClient(t *testing.T) {
	trusted, err := httplimit.ParsePrefixes("10.0.0.0/8, 2001:db8:ffff::/48")
	require.NoError(t, err)
	for _, c := range []struct {
		peer  string
		lines []string
		want  string
	}{
		{"198.51.100.7", []string{"203.0.113.9"}, "198.51.100.7"},
		{"::ffff:198.51.100.7", nil, "198.51.100.7"},
		{"fe80::1%eth0", nil, "fe80::1"},
		{"10.1.2.3", nil, "10.1.2.3"},
		{"10.1.2.3", []string{"6.6.6.6, 203.0.113.9", "10.0.0.1"}, "203.0.113.9"},
		{"::ffff:10.1.2.3", []string{"[2001:db8::7]:443"}, "2001:db8::7"},
		{"2001:db8:ffff::1", []string{"203.0.113.9, bogus, 10.0.0.1"}, "10.0.0.1"},
	} {
		got := httplimit.ForwardedClient(netip.MustParseAddr(c.peer), c.lines, trusted)
		assert.Equal(t, c.want, got.String(), "peer %s lines %q", c.peer, c.lines)
	}
	// No trusted proxies, or an invalid prefix: every peer is its own client.
	assert.Equal(t, "10.1.2.3", httplimit.ForwardedClient(netip.MustParseAddr("10.1.2.3"), []string{"6.6.6.6"}, nil).String())
	assert.Equal(t, "10.1.2.3", httplimit.ForwardedClient(netip.MustParseAddr("10.1.2.3"), []string{"6.6.6.6"}, []netip.Prefix{{}}).String())
}
