package hybridlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// Four rules per key, decided on this node's counters and synced with the
// cluster every 100ms. Here the store is the in-memory one; in a cluster it
// is store.NewRedis(client, store.RedisOptions{}), as in README.md's quick
// start.
func Example() {
	limiter, err := hybridlimit.New(hybridlimit.Config{
		Rules: []hybridlimit.Rule{
			{Limit: 1, Window: time.Second},
			{Limit: 20, Window: time.Minute},
			{Limit: 200, Window: time.Hour},
			{Limit: 800, Window: 24 * time.Hour},
		},
		Mode:     hybridlimit.ModeAsync,
		Store:    store.NewMemory(nil), // store.NewRedis(rdb, store.RedisOptions{}) in a cluster
		SyncRate: 100 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	defer limiter.Close(context.Background()) // pushes what is pending

	ctx := context.Background()
	for i := 0; i < 2; i++ {
		res, err := limiter.Allow(ctx, "client-42")
		if err != nil {
			panic(err) // only for invalid input: empty or oversized key, bad cost
		}
		if !res.Allowed {
			// The sliding 1/s rule needs this second and the next to slide by.
			fmt.Printf("denied by %v, retry within 2s: %v\n", limiter.Rules()[res.Rule], res.RetryAfter <= 2*time.Second)
			continue
		}
		fmt.Printf("allowed, %d left of %d per %v\n", res.Remaining, res.Limit, res.Window)
	}
	// Output:
	// allowed, 0 left of 1 per 1s
	// denied by 1/1s sliding, retry within 2s: true
}
