package grpclimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
)

// A limiter closed between a decision and its metadata (Close racing a
// call) still gets the decision's metadata: the ratelimit value describes
// the decision's rule rather than being empty, and no value of any key is
// empty.
func TestMetadataAfterCloseIsNeverEmpty(t *testing.T) {
	ctx := context.Background()
	l, err := hybridlimit.New(hybridlimit.Config{Rules: []hybridlimit.Rule{
		{Limit: 1, Window: time.Minute}, {Limit: 100, Window: time.Hour}}})
	require.NoError(t, err)
	i, err := New(l, func(context.Context, string) (string, error) { return "k", nil }, Options{})
	require.NoError(t, err)
	_, err = l.Allow(ctx, "k")
	require.NoError(t, err)
	res, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed)
	require.NoError(t, l.Close(ctx))

	d := i.denial(&res)
	md := i.metadata(ctx, "k", &res, &d, true)
	require.NotEmpty(t, md)
	for k, vs := range md {
		for _, v := range vs {
			assert.NotEmpty(t, v, "metadata %q", k)
		}
	}
	assert.Regexp(t, `^"1m";r=0;t=\d+$`, md.Get(mdRateLimit)[0])
}
