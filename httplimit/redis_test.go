package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
)

// node is one service instance: its own limiter and middleware behind its
// own HTTP server.
type node struct {
	l   *hybridlimit.Limiter
	srv *httptest.Server
}

// TestClusterThreeNodes runs 3 nodes, each with its own ModeAsync limiter,
// sharing a real Redis, and drives requests round-robin (one request per
// node per round). Between rounds it waits until every node that admitted
// something has completed a sync cycle (its background loop, at SyncRate),
// so each node's view of the cluster misses at most the other nodes'
// admissions of the last two rounds: the total admitted is at most
// limit + 2·(N−1). A node that admits from its own counters only (the
// ModeLocal control) admits N·limit.
func TestClusterThreeNodes(t *testing.T) {
	const limit, n = 60, 3
	rule := hybridlimit.Rule{Limit: limit, Window: time.Hour}
	prefix := redistest.Prefix(t)
	rdb := redistest.Client(t)

	run := func(mode hybridlimit.Mode) (admitted int, rounds int) {
		nodes := make([]node, n)
		for i := range nodes {
			cfg := hybridlimit.Config{Rules: []hybridlimit.Rule{rule}, Mode: mode}
			if mode == hybridlimit.ModeAsync {
				cfg.Store, cfg.Prefix, cfg.SyncRate = storetest.Redis(t, rdb), prefix, 10*time.Millisecond
			}
			l, err := hybridlimit.New(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			m, err := httplimit.New(l, remoteIP(t), httplimit.Options{})
			require.NoError(t, err)
			nodes[i] = node{l: l, srv: httptest.NewServer(m.Wrap(ok))}
			t.Cleanup(nodes[i].srv.Close)
		}
		client := &http.Client{Timeout: 5 * time.Second}
		quiet := 0
		for rounds = 0; quiet < 3 && rounds < 10*limit; rounds++ {
			before := make([]hybridlimit.Stats, n)
			this := 0
			for i, nd := range nodes {
				before[i] = nd.l.Stats()
				resp, err := client.Get(nd.srv.URL + "/")
				require.NoError(t, err)
				_ = resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					this++
				case 429:
				default:
					t.Fatalf("round %d node %d: status %d", rounds, i, resp.StatusCode)
				}
			}
			admitted += this
			if this == 0 {
				quiet++
			} else {
				quiet = 0
			}
			if mode != hybridlimit.ModeAsync {
				continue
			}
			for i, nd := range nodes {
				if nd.l.Stats().Allowed == before[i].Allowed {
					continue // nothing admitted, nothing to push
				}
				require.Eventually(t, func() bool {
					s := nd.l.Stats()
					return s.SyncCycles > before[i].SyncCycles && s.Pending == 0
				}, 5*time.Second, time.Millisecond, "round %d: node %d did not sync", rounds, i)
			}
		}
		return admitted, rounds
	}

	admitted, rounds := run(hybridlimit.ModeAsync)
	t.Logf("async: %d admitted in %d rounds for a limit of %d (bound %d)", admitted, rounds, limit, limit+2*(n-1))
	assert.GreaterOrEqual(t, admitted, limit, "the cluster admits the whole limit")
	assert.LessOrEqual(t, admitted, limit+2*(n-1), "the cluster overshoots by at most the other nodes' last two rounds")

	local, _ := run(hybridlimit.ModeLocal)
	assert.Equal(t, n*limit, local, "control: local nodes admit N·limit")

	// The store holds exactly what the async nodes admitted.
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, prefix+":{*").Result() // counters; markers are prefix:m:… and prefix:t:…
	require.NoError(t, err)
	require.Len(t, keys, 1, "one counter: one key, one rule, one window")
	total, err := rdb.Get(ctx, keys[0]).Int()
	require.NoError(t, err)
	assert.Equal(t, admitted, total)
}

// TestStoreFailure cuts the store under ModeAsync and ModeSynchronous
// limiters: FailOpen keeps admitting, FailClosed answers 429, and no
// request ever gets a 5xx.
func TestStoreFailure(t *testing.T) {
	addr := redistest.Addr(t)
	for _, mode := range []hybridlimit.Mode{hybridlimit.ModeAsync, hybridlimit.ModeSynchronous} {
		for _, policy := range []hybridlimit.FailurePolicy{hybridlimit.FailOpen, hybridlimit.FailClosed} {
			t.Run(fmt.Sprintf("%v/%v", mode, policy), func(t *testing.T) {
				proxy := redistest.NewProxy(t, addr)
				rdb := redistest.ClientAt(t, proxy.Addr())
				cfg := hybridlimit.Config{
					Rules:         []hybridlimit.Rule{{Limit: 100, Window: time.Hour}},
					Mode:          mode,
					Store:         storetest.Redis(t, rdb),
					Prefix:        redistest.Prefix(t),
					FailurePolicy: policy,
					StoreTimeout:  200 * time.Millisecond,
					Manual:        true,
				}
				l, err := hybridlimit.New(cfg)
				require.NoError(t, err)
				defer func() { _ = l.Close(context.Background()) }()
				h := mustNew(t, l, remoteIP(t), httplimit.Options{}).Wrap(ok)

				w := do(h, "192.0.2.1:1")
				require.Equal(t, 200, w.Code)
				require.NoError(t, l.Sync(context.Background()))

				proxy.Down()
				if mode == hybridlimit.ModeAsync {
					do(h, "192.0.2.1:1") // something to push
					require.Error(t, l.Sync(context.Background()))
				}
				want := 200
				if policy == hybridlimit.FailClosed {
					want = 429
				}
				for i := range 3 {
					w := do(h, "192.0.2.1:1")
					assert.Equal(t, want, w.Code, "request %d while the store is down", i)
					if want == 429 {
						assert.NotEmpty(t, w.Header().Get("Retry-After"))
						assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
					}
				}
				assert.True(t, l.Stats().StoreFailing)

				proxy.Up()
				require.Eventually(t, func() bool {
					_ = l.Sync(context.Background())
					return do(h, "192.0.2.1:1").Code == 200 && !l.Stats().StoreFailing
				}, 5*time.Second, 20*time.Millisecond, "admits again once the store is back")
			})
		}
	}
}
