// Package storetest builds stores for tests.
package storetest

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/store"
)

// Redis returns a store.Redis on c with the default options.
func Redis(t testing.TB, c redis.UniversalClient) *store.Redis {
	t.Helper()
	s, err := store.NewRedis(c, store.RedisOptions{})
	if err != nil {
		t.Fatalf("store.NewRedis: %v", err)
	}
	return s
}
