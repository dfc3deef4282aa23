package store_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// A Redis store for a limiter in ModeAsync. The client is any go-redis
// client: redis.NewClient for one server, redis.NewFailoverClient for a
// Sentinel group, redis.NewClusterClient for a Redis Cluster. The caller
// owns it and closes it after the limiter.
func ExampleNewRedis() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	st, err := store.NewRedis(rdb, store.RedisOptions{}) // defaults: 4 lanes, breaker 100ms to 5s
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := hybridlimit.New(hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 100, Window: time.Minute}},
		Mode:  hybridlimit.ModeAsync,
		Store: st,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer limiter.Close(context.Background()) // pushes what is still pending

	res, err := limiter.Allow(context.Background(), "client-42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Allowed, res.Remaining)
}
